"""The estimate covers everything a run does: the final held-out evaluation of the base and of each final model
is in it, with the tokens the run then scores (result.json `heldout`), and the end-of-run output shows its
whole-set results."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from scalecl.cli import app
from tests.conftest import local_sets

runner = CliRunner()


def test_the_estimate_counts_the_final_held_out_evaluation(local, tmp_path, monkeypatch):
    from scalecl.experiments import budget

    seen: list[list] = []
    estimate = budget.sweep_estimate

    def sweep_estimate(exp, methods, device, world):
        seen.append(exp.budget_phases(methods, world))
        return estimate(exp, methods, device, world)

    monkeypatch.setattr(budget, "sweep_estimate", sweep_estimate)
    sets = [x for s in local_sets(local, "llama", "eval.final_take=0", "eval.final_context=48") for x in ("--set", s)]
    res = runner.invoke(app, ["train-cpt", "--preset", "tiny", "--method", "fft,scale-route", *sets, "--out",
                              str(tmp_path / "out"), "--cache", str(tmp_path / "cache"), "--checkpoints",
                              str(tmp_path / "ck")])
    assert res.exit_code == 0, res.output
    phases = {p.name: p for p in seen[-1]}
    finals = [n for n in phases if n.startswith("final held-out evaluation")]
    assert sorted(finals) == ["final held-out evaluation (base)", "final held-out evaluation (fft)",
                              "final held-out evaluation (scale-route)"]
    for path in (tmp_path / "out").glob("*/result.json"):
        held = json.loads(Path(path).read_text())["heldout"]
        forwarded = sum(at["tokens"] + at["sequences"] for split in ("old", "new") for at in held[split]["at"].values())
        for name in finals:  # every token the run scored (and each chunk's first, read but not scored)
            assert phases[name].tokens == forwarded > 0, (name, phases[name].tokens, forwarded)
    assert phases["final held-out evaluation (fft)"].seq == 48  # its longest forward
    assert "whole-set perplexity, base -> final model" in res.output  # the printed table shows them too
    for path in (tmp_path / "out").glob("*/result.json"):
        at = json.loads(Path(path).read_text())["heldout"]["new"]["at"]["48"]
        assert f"{at['start']['ppl']:.3f} -> {at['end']['ppl']:.3f}" in res.output, res.output
    off = [x for s in local_sets(local, "llama") for x in ("--set", s)]
    runner.invoke(app, ["train-cpt", "--preset", "tiny", "--method", "fft", *off, "--out", str(tmp_path / "o2"),
                        "--cache", str(tmp_path / "cache"), "--checkpoints", str(tmp_path / "k2")])
    assert not [p for p in seen[-1] if p.name.startswith("final")]  # off: nothing to count
