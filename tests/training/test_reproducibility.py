"""What a run's numbers depend on beyond its config (issue 22): the CPU thread count and the device are part of
its identity; a finished run, a cached stage or a checkpoint made with other numerics is refused in one line;
wall_s adds up to the process's real time; the peak memory is estimated (and an oversized run refused) before
training."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.common.schema import LEGACY_NUMERICS, numerics_key
from scalecl.compute.processes import Dist
from scalecl.experiments import load_preset
from scalecl.experiments.base import Paths
from scalecl.experiments.bio import BioExperiment
from scalecl.experiments.sweep import SweepOptions, check
from scalecl.methods import get_method
from scalecl.training.run import Run
from tests.conftest import reseal

REPO = Path(__file__).resolve().parents[2]
TINY = ["--preset", "tiny", "--set", "stage1.steps=6", "--set", "stage2.steps=2", "--set", "stage3.steps=2",
        "--set", "eval.dense_until=2", "--set", "eval.dense_every=2", "--set", "eval.every=2"]
runner = CliRunner()


def _errors(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


def _name(sets: list[str], numerics: dict | None = None) -> str:
    exp = BioExperiment(load_preset("bio", "tiny", sets), "tiny", Paths(Path("x")))
    if numerics is not None:
        exp.numerics = numerics
    return exp.run_of(get_method("fft"), Dist()).name


def test_one_cpu_thread_keeps_the_names_runs_always_had_and_anything_else_changes_them():
    assert numerics_key(LEGACY_NUMERICS) == [] and numerics_key({"device": "cpu", "cpu_threads": 2})
    plain = _name([])  # compute.threads defaults to 1: the committed runs' setting (tests/training/test_run_names.py)
    assert load_preset("bio", "tiny").compute.threads == 1
    assert _name([], {"device": "cpu", "cpu_threads": 1}) == plain
    two = _name([], {"device": "cpu", "cpu_threads": 2})
    gpu = _name([], {"device": "cuda"})
    assert len({plain, two, gpu}) == 3


def test_the_sweep_sets_compute_threads_and_names_runs_by_the_count_in_force(tmp_path):
    before = torch.get_num_threads()
    try:
        exp = BioExperiment(load_preset("bio", "tiny", ["compute.threads=2"]), "tiny", Paths(tmp_path / "o"))
        check(exp, ["fft"], SweepOptions(device="cpu"))
        assert torch.get_num_threads() == 2
        assert exp.numerics == {"device": "cpu", "cpu_threads": 2}
        assert exp.run_of(get_method("fft"), Dist()).name == _name([], {"device": "cpu", "cpu_threads": 2})
        # 0 leaves torch's count: the name is that count's
        torch.set_num_threads(1)
        exp = BioExperiment(load_preset("bio", "tiny", ["compute.threads=0"]), "tiny", Paths(tmp_path / "o"))
        check(exp, ["fft"], SweepOptions(device="cpu"))
        assert exp.numerics == LEGACY_NUMERICS and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_finished_run_of_another_thread_count_under_this_name_is_refused(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    identity = {"experiment": "bio", "name": "run", "method": "fft", "options": {}, "config_hash": "h",
                "numerics": LEGACY_NUMERICS}
    # a result an older version wrote at 2 threads: no "numerics" of its own, its provenance tells
    old = {"run": {k: v for k, v in identity.items() if k != "numerics"}, "experiment": "bio", "preset": "cpu",
           "method": "fft", "provenance": {"device": "cpu", "machine": {"threads": 2, "gpu": None}}}
    run = Run(identity, out, tmp_path / "ck")
    run._owned().write("result.json", json.dumps(old))  # written as a run writes it (its fingerprint recorded)
    with pytest.raises(ScaleclError, match="made with CPU, 2 threads, this run computes with CPU, 1 thread") as e:
        run.result()
    assert "\n" not in str(e.value) and "--set compute.threads=2" in str(e.value)
    old["provenance"]["machine"]["threads"] = 1  # the committed runs' record: accepted
    run._owned().write("result.json", json.dumps(old))
    assert run.result() == old


def _bio(tmp_path: Path, *args: str):
    return runner.invoke(app, ["train-bio", *TINY, "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache"),
                               "--checkpoints", str(tmp_path / "ck"), *args])


@pytest.mark.usefixtures("one_thread")
def test_cached_stage_and_checkpoint_of_another_thread_count_are_refused_in_one_line(tmp_path):
    res = _bio(tmp_path, "--method", "fft", "--stop-after", "1")
    assert res.exit_code == 0, res.output
    # what an older version left at 2 threads under the same keys: the cached stage 1 and the run's checkpoint
    (meta_path,) = [p for p in (tmp_path / "cache" / "bio").glob("stage1-*/scalecl.json")]
    meta = json.loads(meta_path.read_text())
    meta["stage"].pop("numerics")
    meta["stage"]["provenance"]["machine"]["threads"] = 2
    meta.pop("record_digest")  # an older version kept no digest of its record
    meta_path.write_text(json.dumps(meta))
    res = _bio(tmp_path, "--method", "scale-route")
    assert res.exit_code != 0 and len(_errors(res.output)) == 1, res.output
    assert "cached stage1-" in res.output and "CPU, 2 threads" in res.output and "delete" in res.output
    meta["stage"]["provenance"]["machine"]["threads"] = 1
    meta_path.write_text(json.dumps(meta))

    (state_path,) = list((tmp_path / "ck" / "bio").glob("tiny-fft-*/step-*/trainer_state.json"))
    state = json.loads(state_path.read_text())
    run = state["state"]["run"]
    assert run["numerics"] == LEGACY_NUMERICS  # every checkpoint records the numerics it was made with
    run["numerics"] = {"device": "cpu", "cpu_threads": 2}
    state_path.write_text(json.dumps(state))
    reseal(state_path.parent)  # as an older version wrote it, not a damaged file
    res = _bio(tmp_path, "--method", "fft", "--resume")
    assert res.exit_code != 0 and len(_errors(res.output)) == 1, res.output
    assert "checkpoint" in res.output and "CPU, 2 threads" in res.output


# Runs a command as its only child and writes that child's peak resident memory (KiB) to argv[1]. A fresh small
# interpreter in between: a child forked straight from the test process (grown to gigabytes by earlier tests)
# would count the parent's pages until it execs, in ru_maxrss of RUSAGE_CHILDREN and wait4 alike.
_PEAK_WRAPPER = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[2:]).returncode; "
                 "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
                 "sys.exit(rc)")


def _timed_cli(tmp_path: Path, args: list[str]) -> tuple[dict, float, float]:
    """Run `scalecl <args>` in a subprocess: (its result.json, seconds from launch to the result's writing,
    the subprocess's peak resident memory in bytes)."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    peak_file = tmp_path / "_peak_kib.txt"
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", _PEAK_WRAPPER, str(peak_file), sys.executable, "-m",
                           "scalecl_launch", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = list((tmp_path / "out").rglob("result.json"))
    peak = int(peak_file.read_text()) * 1024
    return json.loads(path.read_text()) | {"_stdout": proc.stdout}, path.stat().st_mtime - t0, peak


@pytest.mark.parametrize("kind", ["bio", "cpt"])
def test_wall_s_total_is_the_processs_time_up_to_its_result(tmp_path, kind):
    args = (["train-bio", *TINY] if kind == "bio" else
            ["train-cpt", "--preset", "tiny", "--set", "pretrain.steps=4", "--set", "train.steps=2",
             "--set", "eval.every=1"])
    result, real, _ = _timed_cli(tmp_path, [*args, "--method", "scale-route", "--out", "out", "--cache", "cache",
                                            "--checkpoints", "ck"])
    wall = result["wall_s"]
    # the launcher's own start (before Python runs) and the file's timestamp granularity: well under a second
    assert wall["total"] == pytest.approx(real, abs=1.0), (wall, real)
    assert sum(wall["phases"].values()) == pytest.approx(wall["total"], abs=0.1 * len(wall["phases"]))
    assert {"startup", "check", "prepare", "stages", "run", "final_eval", "write"} <= set(wall["phases"])
    # the phases the old wall_s left out are inside: the stage-2 check and the final full-range evaluation
    # each figure is rounded to 0.1 s on its own: three roundings of up to 0.05 s (and float error) between the sides
    if kind == "bio":
        assert wall["phases"]["stages"] >= wall["stage1"] + wall["stage2"] - 0.16
        assert wall["phases"]["run"] >= wall["stage3"] + wall["stage3_eval"] - 0.16


@pytest.mark.xdist_group("heavy")  # conftest.GROUPS: gigabytes, apart from the other heavy tests
@pytest.mark.slow
def test_memory_estimate_is_within_1_5x_of_the_measured_peak(tmp_path):
    """A run whose peak the 50,304-row head's logits decide (32 x 64 tokens: 0.38 GiB a copy), as at paper scale."""
    args = ["train-bio", "--preset", "tiny", "--method", "fft", "--set", "model.vocab=50304", "--set",
            "stage1.batch=32", "--set", "stage1.steps=3", "--set", "stage2.steps=2", "--set", "stage3.steps=2",
            "--out", "out", "--cache", "cache", "--checkpoints", "ck"]
    result, _, peak = _timed_cli(tmp_path, args)
    line = next(ln for ln in result["_stdout"].splitlines() if ln.startswith("estimate:"))
    value, unit = re.search(r"peak memory ~([\d.]+) (GiB|MiB)", line).groups()
    estimate = float(value) * (2**30 if unit == "GiB" else 2**20)
    assert "stage 1" in line and "50,304 head rows" in line and "time ~" in line
    assert 1 / 1.5 <= estimate / peak <= 1.5, (line, peak)


def test_a_run_that_cannot_fit_is_refused_before_training_naming_the_keys(tmp_path, monkeypatch):
    import scalecl.experiments.budget as budget
    from scalecl.experiments.bio import bio_phases

    monkeypatch.setattr(budget, "available_memory", lambda: 2**28)  # 256 MiB
    res = _bio(tmp_path, "--method", "fft", "--set", "model.vocab=50304", "--set", "eval.batch=16")  # a training peak
    assert res.exit_code != 0, res.output
    (err,) = _errors(res.output)
    # stage 2 (32 QA pairs of 18 tokens) is the largest phase here
    assert "more than the 256 MiB available" in err and "(stage 2: 32 x 18 tokens" in err
    assert "--set stage2.batch, compute.micro_batch (compute.micro_batch below the batch" in err
    assert not list(tmp_path.rglob("result.json")) and not list((tmp_path / "cache").rglob("stage1-*"))
    monkeypatch.setenv("SCALECL_MEMORY_CHECK", "0")
    budget.check_fits(budget.Estimate(2**40, 2**20, bio_phases(load_preset("bio", "tiny"), ["fft"], 1)[0],
                                      2**28, None, ""))  # the escape hatch: no error


def test_the_paper_preset_is_refused_on_a_24_gb_machine_and_paper_smoke_fits():
    from scalecl.experiments.bio import bio_phases
    from scalecl.experiments.budget import check_fits, estimate

    paper = bio_phases(load_preset("bio", "paper"), ["scale-route"], 1, vocab=50_304, qa_len=40)
    e = estimate(paper, torch.device("cpu"), rate=1e11)._replace(available=24 * 10**9)
    assert e.phase.name == "stage 1" and e.phase.rows * e.phase.seq == 96 * 512
    assert e.phase.parts()["logits"] > 4 * 96 * 512 * 50_304 * 4 - 1  # at least four float32 copies of the logits
    with pytest.raises(ScaleclError, match=r"stage 1: 96 x 512 tokens.*--set stage1\.batch, compute\.micro_batch"):
        check_fits(e)
    smoke = bio_phases(load_preset("bio", "paper-smoke"), ["scale-route"], 1, vocab=50_304, qa_len=40)
    s = estimate(smoke, torch.device("cpu"), rate=1e11)
    # the phase's own need: peak less what this (test) process already holds, which depends on earlier tests
    assert s.peak - s.baseline < 8 * 2**30 and s.phase.vocab == 50_304
    assert load_preset("bio", "paper-smoke").model.hidden == load_preset("bio", "paper").model.hidden == 768


@pytest.mark.usefixtures("one_thread")
def test_cached_stages_are_left_out_of_the_estimate(tmp_path, monkeypatch):
    """Stages 1-2 already in the cache will not run: the estimate (memory and time) counts only what will."""
    import scalecl.experiments.budget as budget

    seen: list[list[str]] = []
    real = budget.estimate
    monkeypatch.setattr(budget, "estimate", lambda phases, *a, **k: (seen.append([p.name for p in phases]),
                                                                     real(phases, *a, **k))[1])
    assert _bio(tmp_path, "--method", "fft").exit_code == 0
    assert seen[-1][:2] == ["stage 1", "stage 2"]  # nothing cached yet
    res = _bio(tmp_path, "--method", "lora")
    assert res.exit_code == 0, res.output
    assert seen[-1] == ["stage 3 (lora)", "evaluation (lora)"]


def test_the_estimate_keeps_its_margin_of_error():
    """A run whose estimate fits only without the estimate's 15% margin is refused (an FFT estimated at 19.8 GiB
    reached 21.0 GiB with 20.6 GiB available, and the kernel killed it)."""
    from scalecl.experiments import budget
    from scalecl.experiments.bio import bio_phases

    phase, gib = bio_phases(load_preset("bio", "tiny"), ["fft"], 1)[0], 2**30
    budget.check_fits(budget.Estimate(int(19.8 * gib), 0, phase, 23 * gib, None, ""))
    with pytest.raises(ScaleclError, match="15% margin"):
        budget.check_fits(budget.Estimate(int(19.8 * gib), 0, phase, int(20.6 * gib), None, ""))
