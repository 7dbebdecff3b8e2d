"""--report-to: accelerate's tracker integrations receive the per-step log and every evaluation metric.

Checked offline with TensorBoard: the event file written during a tiny run is read back and compared with
the run's own train_log.jsonl and metrics.jsonl.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from scalecl.cli import app

runner = CliRunner()


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard not installed")
def test_tensorboard_receives_steps_and_evaluations(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    res = runner.invoke(app, ["train-cpt", "--preset", "tiny", "--method", "scale-route", "--out", str(tmp_path / "out"),
                              "--cache", str(tmp_path / "cache"), "--checkpoints", str(tmp_path / "ckpt"),
                              "--set", "pretrain.steps=6", "--set", "train.steps=6", "--set", "eval.every=3",
                              "--report-to", "tensorboard"])
    assert res.exit_code == 0, res.output
    (run,) = (tmp_path / "out").glob("tiny-scale-route-*")
    log = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # <run>/tensorboard/<run name>/: the scalars (the hyperparameters go to a subfolder of their own)
    acc = EventAccumulator(str(run / "tensorboard" / run.name))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s"} <= tags
    for key in ("loss", "lr", "grad_norm"):
        got = [(e.step, e.value) for e in acc.Scalars(f"train/{key}")]
        assert got == [(r["step"], pytest.approx(r[key], rel=1e-6)) for r in log]
    for key in ("old/ppl", "new/ppl", "rep_cos", "new/route_preserve"):
        got = [(e.step, e.value) for e in acc.Scalars(f"eval/{key}")]
        assert got == [(r["step"], pytest.approx(r[key], rel=1e-6)) for r in metrics]
    assert len(log) == 6 and [r["step"] for r in metrics] == [0, 3, 6]


def test_report_to_names_and_packages_are_checked_first(tmp_path):
    args = ["train-bio", "--preset", "tiny", "--out", str(tmp_path / "o"), "--cache", str(tmp_path / "c")]
    res = runner.invoke(app, [*args, "--report-to", "neptune"])
    assert res.exit_code == 2 and "choose none or any of tensorboard, wandb, mlflow, trackio" in res.output
    missing = next((n for n in ("wandb", "mlflow", "trackio") if importlib.util.find_spec(n) is None), None)
    if missing:
        res = runner.invoke(app, [*args, "--report-to", f"tensorboard,{missing}"])
        assert res.exit_code == 2 and f"pip install {missing}" in res.output
    assert not (tmp_path / "o").exists() and not (tmp_path / "c").exists()
