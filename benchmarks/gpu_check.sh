#!/usr/bin/env bash
# The GPU check (issue #14): one command on a GPU machine with nothing but this repo.
#
#   bash benchmarks/gpu_check.sh --out gpu_check            # ~20 minutes on one H100
#   bash benchmarks/gpu_check.sh --dry-run --out /tmp/gc    # every step at toy sizes on CPU (CI runs this)
#
# Steps, each logged under OUT and recorded in OUT/status.json as it ends:
#   1. install   a fresh venv (OUT/venv, or $SCALECL_GPU_VENV) that sees the packages of PYTHON (default
#                python3): a CUDA torch already on the machine is used as it is; without one, `pip install
#                torch` from PyPI's default index, whose Linux x86-64 wheels are CUDA builds. Then the suite,
#                with -c constraints.txt when the repo has one (torch lines dropped when the machine's torch
#                is used). Offline, or in the dry run, the repo goes on the venv's path instead and the
#                packages the check needs are verified importable (missing ones: carry them as wheels).
#   2. tests     pytest -m gpu (tests/compute/test_gpu.py): bf16 preservation bit for bit, Route = two passes.
#   3. bench     benchmarks/bench_gpu.py: Adapt/FFT and Route/Adapt at Llama-3.2-1B shapes, our step vs
#                transformers.Trainer, MFU, block vs concatenated products -> OUT/bench.json.
#   4. bio       scalecl train-bio --preset gpu --method fft,llama-pro,scale-route -> OUT/bio (polled, stopped
#                at --bio-minutes, default 17: the preset is estimated at ~15); Pythia's tokenizer if it
#                loads, else --tokenizer local with the same 50,304 rows.
#   5. report    benchmarks/gpu_report.py: OUT/summary.{json,md}, OUT/figures/*.png, one line per target with
#                the measured value and PASS/FAIL; scalecl plot draws the biography figure.
#   6. bundle    OUT/gpu_check.tar.gz: everything above but the venv and models (small enough to copy back).
#
# A device whose commands are limited to a few minutes: start the whole check in its own session and poll,
#   setsid nohup bash benchmarks/gpu_check.sh --out /tmp/gc > /tmp/gc.log 2>&1 < /dev/null &
#   ... later: cat /tmp/gc/status.json; test -e /tmp/gc/DONE && cp /tmp/gc/gpu_check.tar.gz "$OUT"/
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="gpu_check-$(date +%Y%m%d-%H%M%S)"
DRY=0
PY="${PYTHON:-python3}"
BIO_MINUTES=17  # install, tests and benchmarks take ~6 minutes: the whole check fits a 25-minute lease
INSTALL=1
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --python) PY="$2"; shift 2 ;;
    --bio-minutes) BIO_MINUTES="$2"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$OUT/work"          # caches and checkpoints of the biography run (left out of the bundle)
mkdir -p "$WORK" "$OUT/logs"
rm -f "$OUT/DONE"
echo '{}' > "$OUT/status.json"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PIP_DISABLE_PIP_VERSION_CHECK=1
START=$(date +%s)

status() {  # status NAME RESULT SECONDS
  "$PY" - "$OUT/status.json" "$1" "$2" "$3" <<'EOF'
import json, sys
path, name, result, secs = sys.argv[1:]
s = json.load(open(path))
s[name] = {"result": result, "seconds": int(secs)}
json.dump(s, open(path, "w"), indent=2)
EOF
}

step() {  # step NAME COMMAND...: run, log, record; a failed step is recorded and the check goes on
  local name="$1"; shift
  local t0; t0=$(date +%s)
  echo "== $name: $*"
  if "$@" > "$OUT/logs/$name.log" 2>&1; then
    status "$name" ok $(( $(date +%s) - t0 )); echo "   ok ($(( $(date +%s) - t0 )) s)"
  else
    local rc=$?
    status "$name" "failed (exit $rc)" $(( $(date +%s) - t0 )); echo "   FAILED (exit $rc): see $OUT/logs/$name.log"
    tail -20 "$OUT/logs/$name.log" | sed 's/^/   | /'
    FAILED=1
  fi
}
FAILED=0

# ---------------------------------------------------------------------------------------------------------
# 1. install
VENV="${SCALECL_GPU_VENV:-$OUT/venv}"
install() {
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" || return 1
  # see PYTHON's packages (its CUDA torch above all) from the fresh venv, whatever kind of environment PYTHON
  # is (--system-site-packages would see the base interpreter's, not those of a venv PYTHON belongs to)
  local site; site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") || return 1
  "$PY" -c "import site; print('\n'.join(site.getsitepackages() + [site.getusersitepackages()]))" \
    > "$site/_scalecl_gpu_check_parent.pth" || return 1
  local VPY="$VENV/bin/python"
  if [ "$DRY" = 0 ] && ! "$VPY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA torch on this machine: pip install torch (PyPI's default Linux wheels are CUDA builds)"
    "$VPY" -m pip install --retries 1 --timeout 15 torch || return 1
  fi
  "$VPY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || return 1
  local cons=()
  if [ -f "$REPO/constraints.txt" ]; then
    grep -v -E '^(torch|nvidia-|triton)([=<>! ;]|$)' "$REPO/constraints.txt" > "$OUT/constraints-used.txt" || true
    cons=(-c "$OUT/constraints-used.txt")
  fi
  if [ "$DRY" = 0 ] && "$VPY" -m pip install --retries 1 --timeout 15 "${cons[@]}" -e "$REPO[dev]"; then
    return 0
  fi
  echo "the suite by path (offline or dry run: nothing to download), then checking what the check imports"
  echo "$REPO" > "$site/_scalecl_gpu_check_repo.pth"
  "$VPY" - <<'EOF'
import importlib.util, sys
need = ["torch", "transformers", "peft", "accelerate", "safetensors", "tokenizers", "typer", "rich", "numpy",
        "matplotlib", "pandas", "pytest", "scalecl"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
print("missing:", missing or "none")
sys.exit(1 if missing else 0)
EOF
}
if [ "$INSTALL" = 1 ]; then
  step install install
  VPY="$VENV/bin/python"
else
  VPY="$PY"
  status install skipped 0
fi
"$VPY" -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.is_available())" \
  > "$OUT/logs/versions.txt" 2>&1 || true
(command -v nvidia-smi > /dev/null && nvidia-smi > "$OUT/logs/nvidia-smi.txt" 2>&1) || true
cd "$REPO"

# ---------------------------------------------------------------------------------------------------------
# 2. GPU tests (skipped, not failed, without CUDA: the dry run checks the step itself)
step tests "$VPY" -m pytest -q -m gpu tests/compute/test_gpu.py -p no:cacheprovider --junitxml "$OUT/pytest_gpu.xml"

# ---------------------------------------------------------------------------------------------------------
# 3. step benchmarks
if [ "$DRY" = 1 ]; then
  step bench "$VPY" benchmarks/bench_gpu.py --tiny --steps 1 --device cpu --out "$OUT/bench.json"
else
  step bench "$VPY" benchmarks/bench_gpu.py --out "$OUT/bench.json"
fi

# ---------------------------------------------------------------------------------------------------------
# 4. the biography gpu preset, polled and stopped at --bio-minutes
BIO=(-m scalecl.cli train-bio --preset gpu --method fft,llama-pro,scale-route --out "$OUT/bio" --cache "$WORK/cache"
     --checkpoints "$WORK/checkpoints")
if [ "$DRY" = 1 ]; then  # the gpu preset's protocol at toy sizes
  BIO+=(--device cpu --tokenizer local --set data=tiny --set data_overrides.n_people=250
        --set data_overrides.n_bio=200 --set data_overrides.n_task1=50 --set model.hidden=64 --set model.layers=2
        --set model.heads=2 --set model.ffn=128 --set model.context=64 --set model.vocab=0 --set stage1.steps=10
        --set stage1.batch=8 --set stage1.warmup=3 --set stage2.steps=4 --set stage2.batch=8 --set stage3.steps=4
        --set stage3.batch=8 --set eval.slice_people=10 --set eval.dense_until=2 --set eval.dense_every=2
        --set eval.every=4 --set eval.batch=256 --set methods.scale.hidden_up=32 --set methods.scale.ffn_up=16
        --set methods.scale-route.l_fp=1 --set methods.scale-adapt.l_fp=1 --set methods.llama-pro.n=1
        --set checkpoint.every=0)
elif ! "$VPY" -c "from transformers import AutoTokenizer; AutoTokenizer.from_pretrained('EleutherAI/pythia-160m')" \
    > /dev/null 2>&1; then
  echo "Pythia's tokenizer cannot be loaded here (offline?): --tokenizer local, 50,304 rows as Pythia" \
    | tee "$OUT/logs/bio-tokenizer.txt"
  BIO+=(--tokenizer local)
fi
bio() {
  "$VPY" "${BIO[@]}" > "$OUT/logs/bio-run.log" 2>&1 < /dev/null &
  local pid=$! deadline=$(( $(date +%s) + BIO_MINUTES * 60 ))
  while kill -0 "$pid" 2> /dev/null; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "stopped after $BIO_MINUTES minutes (--bio-minutes)"; kill -TERM "$pid" 2> /dev/null || true
      wait "$pid" 2> /dev/null || true; return 124
    fi
    sleep 2
  done
  wait "$pid"
}
step bio bio
tail -30 "$OUT/logs/bio-run.log" > "$OUT/logs/bio-tail.txt" 2>/dev/null || true

# ---------------------------------------------------------------------------------------------------------
# 5. report: targets, figures
step report "$VPY" benchmarks/gpu_report.py --out "$OUT"
step plot "$VPY" -m scalecl.cli plot --results "$OUT/bio" --out "$OUT/figures"
cat "$OUT/logs/report.log" 2> /dev/null | grep '^TARGET' || true

# ---------------------------------------------------------------------------------------------------------
# 6. bundle (no venv, no models)
status total "$([ "$FAILED" = 0 ] && echo ok || echo 'some steps failed')" $(( $(date +%s) - START ))
tar -czf "$WORK/gpu_check.tar.gz" -C "$OUT" --exclude=./venv --exclude=./work --exclude=./gpu_check.tar.gz \
  --exclude='*.safetensors' . && mv "$WORK/gpu_check.tar.gz" "$OUT/gpu_check.tar.gz"
touch "$OUT/DONE"
echo "== done in $(( $(date +%s) - START )) s: $OUT (summary.md, summary.json, bench.json, bio/, figures/, logs/)"
exit "$FAILED"
