"""benchmarks/gpu_check.sh --dry-run: every step of the GPU check at toy sizes on CPU, with its outputs.

The real check needs a GPU (it is prepared, not run, where none is lent); this keeps the script from
rotting: install into a fresh venv, the GPU tests (skipped without CUDA), the step benchmarks, the
biography `gpu` preset's protocol, the report with every target, the figures and the bundle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_dry_run_runs_every_step(tmp_path):
    out = tmp_path / "gc"
    env = os.environ | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--dry-run", "--out", str(out),
                           "--python", sys.executable], capture_output=True, text=True, timeout=900, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    status = json.loads((out / "status.json").read_text())
    for step in ("install", "tests", "bench", "bio", "report", "plot", "total"):
        assert status[step]["result"] == "ok", (step, status)
    assert (out / "DONE").exists()
    bench = json.loads((out / "bench.json").read_text())
    assert {"fft_same_shape", "adapt", "route", "adapt_concat", "route_concat", "fft_base_shape",
            "trainer_fft_base_shape", "pythia160m_stage1"} <= set(bench["configs"])
    assert all(c["step_s"] > 0 for c in bench["configs"].values())
    assert bench["preservation_max_abs_diff"]["blocks"] == 0.0  # fp32 on CPU: the base's logits, bit for bit
    assert set(bench["products_faster"].values()) <= {"blocks", "concat"}
    summary = json.loads((out / "summary.json").read_text())
    names = [t["target"] for t in summary["targets"]]
    for want in ("route_over_adapt", "adapt_over_fft_same_shape", "ours_over_trainer_fft", "pythia160m_stage1_mfu",
                 "bio gpu preset wall time (s)", "GPU tests failed or errored"):
        assert want in names
        assert f"TARGET {want}: measured" in proc.stdout
    assert all(t["verdict"] in ("PASS", "FAIL", "n/a") for t in summary["targets"])
    assert summary["gpu_tests"]["skipped"] == summary["gpu_tests"]["tests"] > 0  # no CUDA: skipped, not failed
    assert sorted(summary["bio"]["methods"]) == ["fft", "llama-pro", "scale-route"]
    for f in ("figures/step_times.png", "figures/fig8_bio_gpu.png", "summary.md"):
        assert (out / f).stat().st_size > 0, f
    with tarfile.open(out / "gpu_check.tar.gz") as t:
        members = t.getnames()
    assert "./summary.json" in members and "./bench.json" in members
    assert not any(m.startswith(("./venv", "./work")) for m in members)
