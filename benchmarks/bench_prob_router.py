"""SCALE-Route's `prob` router score at a padded vocabulary: computed over blocks of positions
(`UpHead.prob_cosine`, what the suite does) against the one-block computation (two (N, V) probability
tensors at once, what it did before).

Default sizes are a biography `cpu` evaluation forward at 50,304 head rows: d = 128, 256 x 19 positions.
Each form runs in its own child process, which reports its peak resident memory above what it held before
the call (ru_maxrss) and the median time of --reps calls. The script also checks that both forms give the
same scores bit for bit.

    python benchmarks/bench_prob_router.py --json benchmarks/results/prob_router_bio50k.json
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime

import torch
import torch.nn.functional as F
from torch import nn

from scalecl.modeling.scale_layers import PathState, UpHead


def _inputs(a) -> tuple[UpHead, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    base = nn.Linear(a.hidden, a.vocab, bias=False).requires_grad_(False)
    nn.init.normal_(base.weight, std=0.05)
    head = UpHead(base, 32, PathState("route", tau=0.9, router="prob"))
    x = torch.randn(a.positions, a.hidden)
    return head, x, x + 0.3 * torch.randn_like(x)


def one_block(head: UpHead, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    w = head.weight.float()
    return F.cosine_similarity(torch.softmax(x @ w.t(), -1), torch.softmax(y @ w.t(), -1), dim=-1)


def _child(a) -> None:
    """Measure one form in this process; print a JSON line."""
    torch.set_num_threads(a.threads)
    head, x, y = _inputs(a)
    f = (lambda x, y: one_block(head, x, y)) if a.form == "one-block" else head.prob_cosine
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    times = []
    with torch.no_grad():
        for _ in range(a.reps):
            t = time.perf_counter()
            score = f(x, y)
            times.append(time.perf_counter() - t)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    torch.save(score, a.save)
    print(json.dumps({"form": a.form, "median_s": statistics.median(times), "times_s": times,
                      "peak_above_start_mib": (peak - before) / 1024}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=128, help="d (biography cpu preset: 128)")
    ap.add_argument("--vocab", type=int, default=50304, help="head rows (Pythia's padded vocabulary: 50,304)")
    ap.add_argument("--positions", type=int, default=256 * 19, help="positions per path in one forward")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="also write the figures to this JSON file")
    ap.add_argument("--form", help=argparse.SUPPRESS)
    ap.add_argument("--save", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.form:
        return _child(a)
    rows, scores = [], []
    for form in ("one-block", "blocks"):
        save = f"/tmp/bench_prob_router_{form}.pt"
        cmd = [sys.executable, __file__, "--form", form, "--save", save] + [
            f"--{k}={getattr(a, k)}" for k in ("hidden", "vocab", "positions", "reps", "threads")]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        rows.append(json.loads(out))
        scores.append(torch.load(save))
    same = bool(torch.equal(scores[0], scores[1]))
    for r in rows:
        print(f"{r['form']:>9}: median {r['median_s']:.3f} s, peak {r['peak_above_start_mib']:.0f} MiB above start")
    print(f"scores equal bit for bit: {same}")
    if a.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        doc = {"sizes": {"hidden": a.hidden, "vocab": a.vocab, "positions": a.positions}, "threads": a.threads,
               "reps": a.reps, "forms": rows, "scores_equal": same, "commit": commit,
               "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.platform(),
               "torch": torch.__version__}
        with open(a.json, "w") as fh:
            json.dump(doc, fh, indent=1)


if __name__ == "__main__":
    main()
