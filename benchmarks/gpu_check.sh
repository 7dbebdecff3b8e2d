#!/usr/bin/env bash
# The GPU check (issues 14 and 43): one command on a GPU machine with this repo, within --minutes (default 9).
#
#   bash benchmarks/gpu_check.sh --out /tmp/gc --export "$OUT"   # on one H100/H200: the lease's 9 minutes
#   bash benchmarks/gpu_check.sh --out /tmp/gc --minutes 25 --bio-scale 1   # the whole `gpu` preset as it is
#   bash benchmarks/gpu_check.sh --dry-run --out /tmp/gc          # every step at toy sizes on CPU (CI runs this)
#
# No install: the machine's python3 (--python) with its CUDA torch runs the repository from its folder
# (PYTHONPATH). Wheels carried in .whl/ (benchmarks/gpu_wheels.sh) are installed into OUT/work/site, which goes
# first on PYTHONPATH (a newer transformers, the optional fused losses). --venv instead makes a venv and pip installs
# the suite (a machine with PyPI and no CUDA torch). --device DEV is passed to every step (default: cuda when
# available, as every command does). --commit SHA is recorded as the tree's commit (a device machine's copy of the
# repository may carry no .git, or an older one).
#
# Steps, each logged in OUT/logs/<step>.log, recorded in OUT/status.json as it ends, and stopped at its share of
# the time (a stopped or failed step is recorded and the check goes on):
#   1. env     benchmarks/gpu_env.py: versions, the GPU, every requirement not met, missing packages (env.json)  15 s
#   2. tests   pytest -m gpu (tests/compute/test_gpu.py)                                                 100 s
#   3. bench   benchmarks/bench_gpu.py: Pythia-160M stage-1 step and MFU, the QA step, Route's stage-3 step against
#              FFT's; the QA step compiled and as CUDA graphs; our Llama-3.2-1B-shape step against
#              transformers.Trainer's; then the rest (bench.json)                                          220 s
#   4. cpt1b   scalecl train-cpt --preset paper-smoke --method all: one step per method at Llama-3.2-1B's shapes,
#              4 x 2,048 tokens, bf16, delta checkpoints (OUT/cpt1b; needs datasets: gpu_wheels.sh)     70 s
#   5. bio     scalecl train-bio --preset gpu --method fft,llama-pro,scale-route, every stage's steps and the
#              evaluation schedule times --bio-scale (default 0.08: at 0.1 it took 163 s on one H200, the whole
#              preset ~18 minutes; the report extrapolates its time), in the time left (OUT/bio)        the rest
#   6. report  benchmarks/gpu_report.py: results.json (every number, with provenance: commit, command, GPU, date),
#              summary.md (one line per target, measured value and PASS/FAIL), figures/step_times.png; with --plot
#              also `scalecl plot` of the biography run (else: scalecl plot --results OUT/bio later, anywhere)
#   7. bundle  gpu_check.tar.gz (logs, results, bio and cpt1b records; no models); --export DIR copies results.json,
#              summary.md and the bundle there (a device tool's $OUT)
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMMAND="bash benchmarks/gpu_check.sh $*"
OUT="gpu_check-$(date +%Y%m%d-%H%M%S)"
DRY=0
PY="${PYTHON:-python3}"
MINUTES=9
BIO_SCALE=0.08
DEVICE=""
VENV=0
EXPORT=""
PLOT=0
COMMIT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --python) PY="$2"; shift 2 ;;
    --minutes) MINUTES="$2"; shift 2 ;;
    --bio-scale) BIO_SCALE="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --venv) VENV=1; shift ;;
    --export) EXPORT="$2"; shift 2 ;;
    --plot) PLOT=1; shift ;;
    --commit) COMMIT="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$OUT/work"  # caches, checkpoints, carried wheels (left out of the bundle)
mkdir -p "$WORK" "$OUT/logs"
rm -f "$OUT/DONE"
echo '{}' > "$OUT/status.json"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
START=$(date +%s)
DEADLINE=$(( START + MINUTES * 60 ))
DEV=(); [ -n "$DEVICE" ] && DEV=(--device "$DEVICE")
[ "$DRY" = 1 ] && DEV=(--device cpu)
FAILED=0

status() {  # status NAME RESULT SECONDS
  "$PY" - "$OUT/status.json" "$1" "$2" "$3" <<'EOF'
import json, sys
path, name, result, secs = sys.argv[1:]
s = json.load(open(path))
s[name] = {"result": result, "seconds": int(secs)}
json.dump(s, open(path, "w"), indent=2)
EOF
}

share() {  # share SECONDS: a step's time, scaled to --minutes (their sum is 9 minutes' worth) and never past the end
  local want=$(( $1 * MINUTES / 9 )) left=$(( DEADLINE - $(date +%s) - ${2:-0} ))
  [ "$left" -lt 10 ] && left=10
  [ "$want" -gt "$left" ] && want=$left
  echo "$want"
}

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log, record; the check goes on after a failure
  local name="$1" limit="$2"; shift 2
  local t0; t0=$(date +%s)
  echo "== $name (at most $limit s): $*"
  "$@" > "$OUT/logs/$name.log" 2>&1 < /dev/null &
  local pid=$! rc=0 stopped=0
  while kill -0 "$pid" 2> /dev/null; do
    if [ $(( $(date +%s) - t0 )) -ge "$limit" ]; then
      stopped=1; kill -TERM "$pid" 2> /dev/null; sleep 5; kill -KILL "$pid" 2> /dev/null; break
    fi
    sleep 1
  done
  wait "$pid" 2> /dev/null; rc=$?
  local took=$(( $(date +%s) - t0 ))
  if [ "$stopped" = 1 ]; then
    status "$name" "stopped at its time limit ($limit s)" "$took"; echo "   STOPPED after $took s"; FAILED=1
  elif [ "$rc" = 0 ]; then
    status "$name" ok "$took"; echo "   ok ($took s)"
  else
    status "$name" "failed (exit $rc)" "$took"; echo "   FAILED (exit $rc): see $OUT/logs/$name.log"
    tail -15 "$OUT/logs/$name.log" | sed 's/^/   | /'; FAILED=1
  fi
}

# ---------------------------------------------------------------------------------------------------------
# 1. env: carried wheels first, else the machine's packages; --venv: a venv with the suite installed
if [ "$VENV" = 1 ]; then
  "$PY" -m venv --system-site-packages "$WORK/venv" && PY="$WORK/venv/bin/python" || exit 2
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2> /dev/null \
    || "$PY" -m pip install -q torch || echo "no CUDA torch could be installed"
  grep -v -E '^(torch|nvidia-|triton)([=<>! ;]|$)' "$REPO/constraints.txt" > "$WORK/constraints.txt"
  "$PY" -m pip install -q -c "$WORK/constraints.txt" -e "$REPO[dev]" > "$OUT/logs/venv.log" 2>&1 \
    || echo "pip install of the suite failed: see logs/venv.log"
fi
SITE=""
if ls "$REPO"/.whl/*.whl > /dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
    "$REPO"/.whl/*.whl > "$OUT/logs/wheels.log" 2>&1 && SITE="$WORK/site:" \
    || echo "carried wheels did not install: see logs/wheels.log"
fi
export PYTHONPATH="$SITE$REPO${PYTHONPATH:+:$PYTHONPATH}"
cd "$REPO"
step env "$(share 15)" "$PY" benchmarks/gpu_env.py --out "$OUT/env.json"
sed 's/^/   /' "$OUT/logs/env.log"
(command -v nvidia-smi > /dev/null && nvidia-smi > "$OUT/logs/nvidia-smi.txt" 2>&1) || true

# ---------------------------------------------------------------------------------------------------------
# 2. GPU tests (skipped, not failed, without CUDA: the dry run checks the step itself)
step tests "$(share 100)" "$PY" -m pytest -q -m gpu tests/compute/test_gpu.py -p no:cacheprovider \
  --junitxml "$OUT/pytest_gpu.xml"

# ---------------------------------------------------------------------------------------------------------
# 3. step benchmarks (bench.json is written after every configuration: a stopped bench keeps what it measured)
BENCH=(benchmarks/bench_gpu.py --out "$OUT/bench.json" "${DEV[@]}")
[ "$DRY" = 1 ] && BENCH+=(--tiny --steps 1)
step bench "$(share 220 200)" "$PY" "${BENCH[@]}"

# ---------------------------------------------------------------------------------------------------------
# 4. one CPT step per method at Llama-3.2-1B's shapes (random weights), bf16, without compiling (one step)
CPT=(-m scalecl.cli train-cpt --preset paper-smoke --method all --out "$OUT/cpt1b" --cache "$WORK/cache"
     --checkpoints "$WORK/checkpoints" "${DEV[@]}" --set train.steps=1 --set eval.every=1 --set checkpoint.delta=true
     --set compute.compile=off)
if [ "$DRY" = 1 ]; then
  CPT=(-m scalecl.cli train-cpt --preset tiny --method all --out "$OUT/cpt1b" --cache "$WORK/cache"
       --checkpoints "$WORK/checkpoints" "${DEV[@]}" --set train.steps=1 --set eval.every=1 --set checkpoint.delta=true)
else
  CPT+=(--set dtype=bfloat16 --set train.batch=4 --set train.seq_len=2048 --set model.context=2048)
fi
step cpt1b "$(share 70 120)" "$PY" "${CPT[@]}"

# ---------------------------------------------------------------------------------------------------------
# 5. the biography `gpu` preset, its stages scaled by --bio-scale, in the time left but the report's
BIO=(-m scalecl.cli train-bio --preset gpu --method fft,llama-pro,scale-route --out "$OUT/bio" --cache "$WORK/cache"
     --checkpoints "$WORK/checkpoints" "${DEV[@]}")
if [ "$DRY" = 1 ]; then  # the gpu preset's protocol at toy sizes
  BIO+=(--tokenizer local --set data=tiny --set data_overrides.n_people=250 --set data_overrides.n_bio=200
        --set data_overrides.n_task1=50 --set model.hidden=64 --set model.layers=2 --set model.heads=2
        --set model.ffn=128 --set model.context=64 --set model.vocab=0 --set stage1.batch=8 --set stage2.batch=8
        --set stage3.batch=8 --set eval.slice_people=10 --set eval.batch=256 --set methods.scale.hidden_up=32
        --set methods.scale.ffn_up=16 --set methods.scale-route.l_fp=1 --set methods.scale-adapt.l_fp=1
        --set methods.llama-pro.n=1)
  BIO_SCALE=0.003
elif ! "$PY" -c "from transformers import AutoTokenizer; AutoTokenizer.from_pretrained('EleutherAI/pythia-160m')" \
    > /dev/null 2>&1; then
  echo "Pythia's tokenizer cannot be loaded here (offline?): --tokenizer local, 50,304 rows as Pythia" \
    | tee "$OUT/logs/bio-tokenizer.txt"
  BIO+=(--tokenizer local)
fi
SCALED=$("$PY" - "$BIO_SCALE" <<'EOF'
import sys
from scalecl.experiments import load_preset
f = float(sys.argv[1])
rc = load_preset("bio", "gpu")
if f < 1:  # every stage's steps and the evaluation schedule scaled; no step checkpoints
    n = lambda v: max(1, round(v * f))  # noqa: E731
    sets = {"stage1.steps": n(rc.stage1.steps), "stage1.warmup": n(rc.stage1.warmup), "stage2.steps": n(rc.stage2.steps),
            "stage3.steps": n(rc.stage3.steps), "eval.dense_until": n(rc.eval.dense_until),
            "eval.every": n(rc.eval.every), "checkpoint.every": 0}
    print(" ".join(f"--set {k}={v}" for k, v in sets.items()))
EOF
) || { echo "error: --bio-scale $BIO_SCALE"; exit 2; }
# shellcheck disable=SC2206
BIO+=($SCALED)
echo "$BIO_SCALE" > "$OUT/bio_scale.txt"
# the scaled stages compile as the preset's would: stage 1 (3,500 steps x scale) and not stages 2-3
MIN_STEPS=$("$PY" -c "print(max(1, round(2000 * $BIO_SCALE)))")
step bio "$(share 900 25)" env SCALECL_COMPILE_MIN_STEPS="$MIN_STEPS" "$PY" "${BIO[@]}"

# ---------------------------------------------------------------------------------------------------------
# 6. report: every number with its provenance, one line per target, figures
status total "$([ "$FAILED" = 0 ] && echo ok || echo 'some steps failed or stopped')" $(( $(date +%s) - START ))
step report 60 "$PY" benchmarks/gpu_report.py --out "$OUT" --command "$COMMAND" --commit "$COMMIT"
[ "$PLOT" = 1 ] && step plot 90 "$PY" -m scalecl.cli plot --results "$OUT/bio" --out "$OUT/figures"
grep '^TARGET' "$OUT/logs/report.log" 2> /dev/null || true

# ---------------------------------------------------------------------------------------------------------
# 7. bundle (no models, caches or wheels)
status total "$([ "$FAILED" = 0 ] && echo ok || echo 'some steps failed or stopped')" $(( $(date +%s) - START ))
tar -czf "$WORK/gpu_check.tar.gz" -C "$OUT" --exclude=./work --exclude=./gpu_check.tar.gz \
  --exclude='*.safetensors' . && mv "$WORK/gpu_check.tar.gz" "$OUT/gpu_check.tar.gz"
if [ -n "$EXPORT" ]; then
  mkdir -p "$EXPORT" && cp "$OUT"/results.json "$OUT"/summary.md "$OUT"/gpu_check.tar.gz "$EXPORT"/ 2> /dev/null || true
fi
touch "$OUT/DONE"
echo "== done in $(( $(date +%s) - START )) s: $OUT (results.json, summary.md, gpu_check.tar.gz, logs/)"
exit "$FAILED"
