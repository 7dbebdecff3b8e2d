"""The suite's durations, a pytest plugin loaded by conftest.py: at the end of a run the 30 slowest tests, each
beside its seconds in the committed baseline (tests/durations.json) where there is one, then every test over the
60 s limit and every test much slower than its baseline. Nothing fails on a time here (the cores are shared and
timings noisy); a hang is stopped by pytest-timeout's 300 s (pyproject.toml), and tests/test_durations.py holds a
baseline measured on quiet cores to the 60 s limit. `--durations-write tests/durations.json` records a run as
the new baseline (docs/testing.md).

Under pytest-xdist the workers' reports reach the controller, which prints the summary; a test's time is its
setup, call and teardown together, so a fixture built once is counted in the first test that asked for it."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import pytest

BASELINE = Path(__file__).with_name("durations.json")
SLOWEST = 30  # printed at the end of every run
LIMIT_S = 60.0  # the slowest single test on quiet cores (docs/testing.md)
KEEP_S = 1.0  # the baseline records the tests that took at least this long
SLOWER = 2.0  # flagged: at least this many times its baseline ...
SLOWER_BY_S = 5.0  # ... and this many seconds slower

_times: dict[str, float] = {}
_started = time.time()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--durations-write", metavar="PATH", default=None,
                     help="write this run's test durations (those over 1 s, and the total) to PATH as a baseline "
                          "in tests/durations.json's format")


def plain_id(nodeid: str) -> str:
    """A test's node id without the `@<group>` pytest-xdist appends to those marked xdist_group."""
    return nodeid.rsplit("@", 1)[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    nodeid = plain_id(report.nodeid)
    _times[nodeid] = _times.get(nodeid, 0.0) + report.duration


def load_baseline(path: Path = BASELINE) -> dict:
    """The committed baseline: {"measured": how, "wall_s": total, "tests": {node id: seconds}}."""
    return json.loads(path.read_text()) if path.is_file() else {"tests": {}}


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _is_worker(config) or not _times:
        return
    baseline = load_baseline()
    base = baseline.get("tests", {})
    tr = terminalreporter
    against = "this run / tests/durations.json" if BASELINE.is_file() else "this run; no tests/durations.json"
    tr.section(f"{SLOWEST} slowest tests (seconds: {against})", sep="=")
    for nodeid, s in sorted(_times.items(), key=lambda kv: -kv[1])[:SLOWEST]:
        was = base.get(nodeid)
        tr.write_line(f"{s:7.1f} / {f'{was:.1f}' if was is not None else '-':>6}  {nodeid}")
    over = [(n, s) for n, s in _times.items() if s >= LIMIT_S]
    slower = [(n, s) for n, s in _times.items() if n in base and s >= SLOWER * base[n] and s - base[n] >= SLOWER_BY_S]
    for n, s in sorted(over, key=lambda kv: -kv[1]):
        tr.write_line(f"over the {LIMIT_S:.0f} s limit: {n} ({s:.1f} s)")
    for n, s in sorted(slower, key=lambda kv: -kv[1]):
        tr.write_line(f"slower than its baseline: {n} ({s:.1f} s, baseline {base[n]:.1f} s)")
    tr.write_line(f"test time summed over workers: {sum(_times.values()):.0f} s"
                  + (f"; baseline {baseline['test_s']} s" if "test_s" in baseline else ""))
    target = config.getoption("--durations-write")
    if target:
        write_baseline(Path(target), config)
        tr.write_line(f"durations written to {target}")


def write_baseline(path: Path, config: pytest.Config) -> None:
    """This run's durations as a baseline file (tests over KEEP_S, rounded to 0.1 s; node ids sorted)."""
    workers = getattr(config.option, "numprocesses", None) or 1
    doc = {
        # quiet: whether nothing else ran on the cores (set by hand; test_durations holds such a baseline to
        # LIMIT_S); note: the machine and its load, in words
        "measured": {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {_cpu()}",
                     "cores": os.cpu_count(), "python": platform.python_version(), "workers": workers,
                     "quiet": False, "note": "say here what else ran on the cores"},
        "wall_s": round(time.time() - _started),
        "test_s": round(sum(_times.values())),
        "tests": {n: round(s, 1) for n, s in sorted(_times.items()) if s >= KEEP_S},
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")


def _cpu() -> str:
    """The CPU's model name (Linux), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
