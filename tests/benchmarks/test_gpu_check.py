"""benchmarks/gpu_check.sh --dry-run: every step of the GPU check at toy sizes on CPU, with its outputs.

The real check needs a GPU (it is prepared, not run, where none is lent); this keeps the script from rotting: the
environment report, the GPU tests (skipped without CUDA), the step benchmarks, the biography `gpu` preset's protocol
with its stages scaled, one CPT step per method, the report with every target and its provenance, the bundle and
its export.
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
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"


def test_gpu_check_parses_and_documents_itself():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    out = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True).stdout
    for word in ("--minutes", "--bio-scale", "--device", "--export", "--dry-run", ".whl", "results.json"):
        assert word in out, word
    bad = subprocess.run(["bash", str(SCRIPT), "--nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown argument --nope" in bad.stderr


@pytest.mark.slow
def test_gpu_check_dry_run_runs_every_step(tmp_path):
    out, export = tmp_path / "gc", tmp_path / "export"
    env = os.environ | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out), "--python", sys.executable,
                           "--export", str(export)], capture_output=True, text=True, timeout=900, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    status = json.loads((out / "status.json").read_text())
    for step in ("env", "tests", "bench", "bio", "cpt1b", "report", "total"):
        assert status[step]["result"] == "ok", (step, status)
    assert (out / "DONE").exists()
    bench = json.loads((out / "bench.json").read_text())
    assert {"pythia160m_stage1_eager", "pythia160m_stage1", "qa_fft_eager", "qa_fft", "qa_fft_compiled", "qa_route",
            "fft_base_shape", "trainer_fft_base_shape"} <= set(bench["configs"])
    measured = {k: c for k, c in bench["configs"].items() if "skipped" not in c}
    assert all(c["step_s"] > 0 for c in measured.values()), bench["configs"]
    assert {k for k in bench["configs"] if k not in measured} == {"qa_fft_graphs", "qa_route_graphs"}  # CUDA only
    assert bench["configs"]["pythia160m_stage1_chunked"]["loss"]["name"] == "chunked"
    assert bench["configs"]["pythia160m_stage1"]["loss"]["name"] == "model"  # "auto" on a CPU: the model's own
    assert bench["preservation_max_abs_diff"]["blocks"] == 0.0  # fp32 on CPU: the base's logits, bit for bit
    res = json.loads((out / "results.json").read_text())
    prov = res["provenance"]
    assert prov["commit"] and "--dry-run" in prov["command"] and prov["date"] and "gpu" in prov
    names = [t["target"] for t in res["targets"]]
    for want in ("GPU tests failed or errored", "pythia160m_stage1_mfu", "qa_step_ms", "route_over_fft_stage3",
                 "ours_over_trainer_speed", "bio gpu preset wall time (s)", "1B-shape CPT methods that trained a step",
                 "whole check (s)"):
        assert want in names
        assert f"TARGET {want}: measured" in proc.stdout
    assert all(t["verdict"] in ("PASS", "FAIL", "n/a") for t in res["targets"])
    by = {t["target"]: t for t in res["targets"]}
    assert by["qa_step_ms"]["verdict"] == by["bio gpu preset wall time (s)"]["verdict"] == "n/a"  # CPU: no verdict
    assert res["gpu_tests"]["skipped"] == res["gpu_tests"]["tests"] > 0  # no CUDA: skipped, not failed
    assert sorted(res["bio"]["methods"]) == ["fft", "llama-pro", "scale-route"] and res["bio"]["scale"] < 1
    assert len(res["cpt1b"]) == 7 and by["1B-shape CPT methods that trained a step"]["verdict"] == "PASS"
    assert res["env"]["missing_for_the_check"] == []
    for f in ("figures/step_times.png", "summary.md"):
        assert (out / f).stat().st_size > 0, f
    with tarfile.open(out / "gpu_check.tar.gz") as t:
        members = t.getnames()
    assert "./results.json" in members and "./bench.json" in members and "./logs/bio.log" in members
    assert not any(m.startswith("./work") for m in members)
    assert sorted(p.name for p in export.iterdir()) == ["gpu_check.tar.gz", "results.json", "summary.md"]
