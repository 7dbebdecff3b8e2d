"""What a benchmark records about the machine it ran on: the load average, the CPU, the commit."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def loadavg() -> list[float]:
    """The 1-, 5- and 15-minute load averages ([] where /proc is absent)."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def provenance(torch_version: bool = True) -> dict:
    """The checkout's commit and the machine: CPU model and count, platform, Python (and torch's version)."""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip() or None
    machine = {"cpu": cpu, "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    if torch_version:
        import torch

        machine["torch"] = torch.__version__
    return {"commit": commit, "machine": machine}


def interleave_options(p, timeout: int) -> None:
    """The options every interleaved benchmark takes (bench_threads, bench_import_threads): rounds, the order's
    seed, a run's time limit, where to write, and the hidden ones a worker process is started with."""
    import argparse
    from pathlib import Path

    p.add_argument("--rounds", type=int, default=3, help="runs per setting, interleaved")
    p.add_argument("--seed", type=int, default=0, help="of the shuffled order within each round")
    p.add_argument("--timeout", type=int, default=timeout, help="seconds per run")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--forever", action="store_true", help=argparse.SUPPRESS)


def interleaved(grid: list, rounds: int, seed: int):
    """(round, setting) for every setting of `grid` once per round, in an order shuffled anew each round (seeded),
    so that a change in the machine's other load spreads over all settings."""
    import random

    rng = random.Random(seed)
    for r in range(rounds):
        for setting in rng.sample(grid, len(grid)):
            yield r, setting
