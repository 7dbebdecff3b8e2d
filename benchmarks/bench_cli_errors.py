"""Seconds from `scalecl ...` to its one `error:` line, for a user's usual mistakes, and what the process imported.

Each case runs the command's entry point (scalecl_launch) in a fresh process, `--repeats` times in a shuffled
order, and reports the median wall time and the heavy modules (torch, transformers, datasets, ...) it had
imported when it exited. `--repo` points at another checkout to compare (e.g. one from before the arguments
were checked ahead of the imports). The 1-minute load average is recorded before and after: on a shared
machine it decides the times more than anything else.

    python3 benchmarks/bench_cli_errors.py --repeats 5 --json benchmarks/results/cli_errors.json
    python3 benchmarks/bench_cli_errors.py --repo /path/to/older/checkout --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "datasets", "peft", "pandas", "matplotlib", "lm_eval")
PROBE = f"""
import atexit, sys
atexit.register(lambda: sys.stderr.write("HEAVY:" + ",".join(m for m in {HEAVY!r} if m in sys.modules) + "\\n"))
sys.argv = ["scalecl", *sys.argv[1:]]
import scalecl_launch
sys.exit(scalecl_launch.main())
"""

# name -> arguments ({tmp}: an empty folder)
CASES = {
    "unknown method": ["train-bio", "--method", "nosuch"],
    "unknown preset": ["train-cpt", "--preset", "nosuch"],
    "bad --set type": ["train-bio", "--set", "stage1.steps=abc"],
    "unknown --set key": ["train-cpt", "--set", "nokey=1"],
    "bad method option": ["train-bio", "--set", "methods.scale.hidden_up=-1"],
    "missing --data file": ["train-cpt", "--data", "{tmp}/missing.txt"],
    "missing --model folder": ["eval-ppl", "--model", "{tmp}/missing", "--data", "builtin:en"],
    "bad --seeds": ["train-bio", "--seeds", "a"],
    "unknown study": ["study", "nosuch"],
    "bad upscale option": ["upscale", "--out", "{tmp}/up", "--random-config", "llama", "--hidden-up", "-3"],
    "missing --results": ["plot", "--results", "{tmp}/missing"],
    "--help": ["train-cpt", "--help"],
}


def load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def run_case(repo: Path, args: list[str], tmp: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALECL_")}
    env |= {"PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", PROBE, *[a.replace("{tmp}", tmp) for a in args]], env=env, cwd=tmp,
                       capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    lines = p.stderr.strip().splitlines()
    heavy = next((ln.removeprefix("HEAVY:") for ln in lines if ln.startswith("HEAVY:")), "?")
    said = next((ln for ln in lines if ln.startswith("error:")), "")
    return {"s": wall, "code": p.returncode, "heavy": [m for m in heavy.split(",") if m], "line": said}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=REPO, help="checkout whose scalecl runs (default: this one)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    order = [name for name in CASES for _ in range(a.repeats)]
    random.Random(0).shuffle(order)
    load_before, runs = load(), {name: [] for name in CASES}
    with tempfile.TemporaryDirectory() as tmp:
        for name in order:
            runs[name].append(run_case(a.repo.resolve(), CASES[name], tmp))
    rows = {name: {"median_s": statistics.median(r["s"] for r in rs), "min_s": min(r["s"] for r in rs),
                   "max_s": max(r["s"] for r in rs), "code": rs[0]["code"], "heavy": rs[0]["heavy"],
                   "line": rs[0]["line"], "args": CASES[name]} for name, rs in runs.items()}
    out = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "repo": str(a.repo), "python": sys.version.split()[0],
           "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "repeats": a.repeats,
           "load_1min_before": load_before, "load_1min_after": load(), "cases": rows}
    print(f"{'case':24} {'median s':>9} {'min s':>7} {'max s':>7}  exit  heavy modules imported")
    for name, r in rows.items():
        print(f"{name:24} {r['median_s']:9.2f} {r['min_s']:7.2f} {r['max_s']:7.2f}  {r['code']:>4}  "
              f"{', '.join(r['heavy']) or '-'}")
    print(f"load average (1 min): {load_before} before, {out['load_1min_after']} after; {os.cpu_count()} CPUs")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
