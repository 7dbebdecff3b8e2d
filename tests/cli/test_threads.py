"""CPU thread defaults of the `scalecl` command: applied before torch loads, never over a user's choice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import scalecl_launch
from scalecl_launch import cpu_thread_defaults

REPO = Path(__file__).resolve().parents[2]

# Runs the command's entry (`scalecl budgets --help`, which exits at once), then reports the thread settings
# recorded for provenance and whether libgomp's idle worker spins: after each small 2-thread op the process
# sleeps; with libgomp's default wait policy the idle worker spins a few ms each time, with PASSIVE it sleeps.
_PROBE = """
import json, os, sys, time
sys.argv = ["scalecl", "budgets", "--help"]
try:
    import scalecl_launch
    scalecl_launch.main()
except SystemExit as e:
    assert e.code in (0, None), e.code
import torch
from scalecl.compute.machine import cpu_thread_settings
torch.set_num_threads(2)
x = torch.ones(1 << 20)
c0 = time.process_time()
for _ in range(40):
    x.add_(1.0)
    time.sleep(0.005)
print(json.dumps({"threads": cpu_thread_settings(), "idle_cpu_s": time.process_time() - c0}))
"""


def probes(*envs: dict[str, str]) -> list[dict]:
    """Run the probe once per environment, all at once (each needs a fresh process: OpenMP reads it once)."""
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "SCALECL_CPU_DEFAULTS")}
    procs = [subprocess.Popen([sys.executable, "-c", _PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=base | {"PYTHONPATH": str(REPO)} | env, cwd=REPO) for env in envs]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out[-2000:] + err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def test_defaults_only_fill_what_the_user_left_unset():
    assert cpu_thread_defaults({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert cpu_thread_defaults({"OMP_NUM_THREADS": "1"}) == {"OMP_WAIT_POLICY": "PASSIVE"}  # torchrun's 1 kept
    assert cpu_thread_defaults({"OMP_WAIT_POLICY": "ACTIVE"}) == {}
    assert cpu_thread_defaults({"GOMP_SPINCOUNT": "10000"}) == {}
    assert cpu_thread_defaults({"SCALECL_CPU_DEFAULTS": "0"}) == {}


def test_console_script_is_the_launcher_and_provenance_records_threads():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["scalecl"] == "scalecl_launch:main"
    assert Path(scalecl_launch.__file__).resolve().parent == REPO  # top level: importing it loads no torch
    from scalecl.compute.machine import provenance

    machine = provenance()["machine"]
    assert {"threads", "omp_num_threads", "omp_wait_policy", "thread_defaults_by_scalecl"} <= set(machine)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else True,
                    reason="needs 2 CPUs for an OpenMP worker thread")
def test_launcher_sets_passive_before_torch_loads_and_user_settings_win():
    applied, user = probes({}, {"OMP_WAIT_POLICY": "active", "OMP_NUM_THREADS": "2"})
    assert applied["threads"]["omp_wait_policy"] == "PASSIVE"
    assert applied["threads"]["thread_defaults_by_scalecl"] == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert user["threads"]["omp_wait_policy"] == "active" and user["threads"]["omp_num_threads"] == "2"
    assert user["threads"]["thread_defaults_by_scalecl"] == {}
    # in force in OpenMP, not only in the environment: the idle worker sleeps between ops instead of spinning
    assert applied["idle_cpu_s"] < 0.5 * user["idle_cpu_s"], (applied["idle_cpu_s"], user["idle_cpu_s"])


def _library(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "SCALECL_CPU_DEFAULTS")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=base | {"PYTHONPATH": str(REPO)} | (env or {}))


_REPORT = ("import os, json; from scalecl.compute.machine import cpu_thread_settings; "
           "print(json.dumps([os.environ.get('OMP_WAIT_POLICY'), cpu_thread_settings()['thread_defaults_by_scalecl']]))")


def test_import_scalecl_applies_the_commands_cpu_defaults_before_torch():
    """A script gets the command's defaults from `import scalecl` (before torch loads), and a warning with the fix
    when it imported torch first; a user's own setting wins, and SCALECL_CPU_DEFAULTS=0 turns both off."""
    res = _library("import scalecl, torch; " + _REPORT)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert json.loads(res.stdout) == ["PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"}]
    late = _library("import torch, scalecl; " + _REPORT)
    assert json.loads(late.stdout) == [None, {}]
    assert "torch was imported before scalecl" in late.stderr and "OMP_WAIT_POLICY=PASSIVE" in late.stderr
    assert len([ln for ln in late.stderr.splitlines() if "scalecl:" in ln]) == 1
    for env in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"SCALECL_CPU_DEFAULTS": "0"}):
        res = _library("import torch, scalecl; " + _REPORT, env)
        assert res.stderr == "" and json.loads(res.stdout)[1] == {}, (env, res.stderr)
