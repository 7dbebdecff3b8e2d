"""Interrupts: a checkpoint at most about a minute old under every preset, Ctrl-C says how to continue, --force
leaves nothing of the previous run beside the new one, and a resumed run ends bit-identical to one never stopped.

Ctrl-C is a KeyboardInterrupt raised in the process at a chosen step (where Python raises it for SIGINT: between
two of the loop's statements); the checkpoint clock (`_Cadence.clock`) is a counter, so that the timed checkpoints
fall on the same steps on any machine.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.training import loop
from scalecl.training.loop import Hooks, TrainPlan, train
from scalecl.training.optim import OptimConfig
from scalecl.training.run import Run
from tests.training.test_kill_and_resume import outcome

runner = CliRunner()
CPT = ["train-cpt", "--preset", "tiny", "--method", "fft", "--set", "pretrain.steps=6", "--set", "train.steps=12",
       "--set", "eval.every=4", "--set", "checkpoint.keep=2"]


def _folders(root: Path) -> list[str]:
    return ["--out", str(root / "out"), "--cache", str(root / "cache"), "--checkpoints", str(root / "ckpt")]


def _counting_clock(monkeypatch) -> None:
    """One second per reading of the checkpoint clock: timed checkpoints on the same steps everywhere."""
    ticks = itertools.count()
    monkeypatch.setattr(loop._Cadence, "clock", staticmethod(lambda: float(next(ticks))))


def _interrupt_at(monkeypatch, step: int) -> None:
    """Ctrl-C once the method's run (not the cached base) has logged `step`."""
    original = Run.log_steps

    def log_steps(self, rows):
        original(self, rows)
        if self.method is not None and any(r["step"] == step for r in rows):
            raise KeyboardInterrupt

    monkeypatch.setattr(Run, "log_steps", log_steps)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The run never interrupted, without timed checkpoints."""
    root = tmp_path_factory.mktemp("reference")
    res = runner.invoke(app, [*CPT, *_folders(root)])
    assert res.exit_code == 0, res.output
    return outcome(root)


def test_timed_checkpoints_follow_the_clock_and_their_own_cost(monkeypatch):
    """A checkpoint once `seconds` passed since the last, or ten times the last one's writing time if longer."""
    import torch

    from scalecl.models.build import model_from_config, tiny_config

    _counting_clock(monkeypatch)  # one second per reading: one per step, two around each checkpoint
    model = model_from_config(tiny_config("llama"))
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    saved = []
    plan = TrainPlan(steps=14, optim=OptimConfig(lr=1e-3), save_seconds=3)
    train(model, iter(lambda: {"input_ids": ids, "labels": ids}, None), plan,
          hooks=Hooks(on_save=lambda step, state: saved.append(step)))
    # the clock reads 3 at step 3: a checkpoint, written from 4 to 5 (1 s); the next once max(3, 10 x 1) s have
    # passed since 5, at step 13; never at the last step (the final model follows)
    assert saved == [3, 13], saved


def test_ctrl_c_says_where_the_run_continues_and_resume_ends_bit_identical(reference, tmp_path, monkeypatch):
    _counting_clock(monkeypatch)
    _interrupt_at(monkeypatch, 9)
    args = [*CPT, "--set", "checkpoint.seconds=3", *_folders(tmp_path)]
    res = runner.invoke(app, args)
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 130 and len(lines) == 1, res.output
    (ckpt,) = (tmp_path / "ckpt" / "cpt").glob("tiny-fft-*/step-*")
    step = int(ckpt.name.split("-")[1])
    assert 0 < step < 9 and f"its latest checkpoint is step {step}" in lines[0] and "--resume" in lines[0], lines[0]
    monkeypatch.undo()
    res = runner.invoke(app, [*args, "--resume"])
    assert res.exit_code == 0, res.output
    assert f"resuming from {ckpt}" in res.output.replace("\n", "")
    assert outcome(tmp_path) == reference  # every evaluation, every step's loss, the final numbers


def test_ctrl_c_before_any_checkpoint_says_the_run_starts_over(tmp_path, monkeypatch):
    _interrupt_at(monkeypatch, 2)
    res = runner.invoke(app, [*CPT, *_folders(tmp_path)])
    assert res.exit_code == 130 and "interrupted before its first checkpoint" in res.output, res.output


def test_force_sets_the_previous_run_aside_at_its_start(reference, tmp_path, monkeypatch):
    root = tmp_path
    assert runner.invoke(app, [*CPT, *_folders(root)]).exit_code == 0
    (out,) = (root / "out").iterdir()
    (final,) = (root / "ckpt" / "cpt").glob("tiny-fft-*/final")
    before = json.loads((final / "scalecl.json").read_text())["record_digest"]
    _interrupt_at(monkeypatch, 5)
    res = runner.invoke(app, [*CPT, "--force", *_folders(root)])
    assert res.exit_code == 130, res.output
    assert not final.exists() and not (out / "result.json").exists() and not (out / "metrics.jsonl").exists()
    aside = final.with_name("final.previous")
    assert json.loads((aside / "scalecl.json").read_text())["record_digest"] == before  # set aside, not deleted
    monkeypatch.undo()
    res = runner.invoke(app, [*CPT, "--resume", *_folders(root)])
    assert res.exit_code == 0, res.output
    assert final.is_dir() and not aside.exists() and outcome(root) == reference


def test_every_preset_checkpoints_at_most_about_a_minute_apart():
    """Every preset but tiny (whose stages take seconds) checkpoints by the clock; cpt's paper-smoke, whose
    checkpoints of Llama-3.2-1B's shapes take minutes to write, every 10 minutes."""
    from importlib import resources

    from scalecl.experiments import load_preset

    files = sorted(p.name for p in resources.files("scalecl.presets").iterdir() if p.name.endswith(".toml"))
    assert len(files) >= 11
    for experiment, name in (f.removesuffix(".toml").split("_", 1) for f in files):
        seconds = load_preset(experiment, name, []).checkpoint.seconds
        if name == "tiny":
            assert seconds == 0
        elif (experiment, name) == ("cpt", "paper-smoke"):
            assert seconds == 600
        else:
            assert 0 < seconds <= 60, (experiment, name, seconds)
