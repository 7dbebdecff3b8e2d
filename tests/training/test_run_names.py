"""Run names are stable: every committed reference run's folder name is what the current code names its
config, so a run written by an earlier version of the suite is still found as finished (and skipped)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalecl.common.schema import merge, without
from scalecl.compute.processes import Dist
from scalecl.experiments.base import Paths
from scalecl.experiments.bio import BioExperiment
from scalecl.experiments.config import BioRunConfig, CptRunConfig
from scalecl.experiments.cpt import CptExperiment
from scalecl.methods import get_method

RESULTS = Path(__file__).resolve().parents[2] / "results"
RUNS = sorted(p for p in RESULTS.rglob("result.json") if json.loads(p.read_text()).get("experiment") in ("bio", "cpt"))
KINDS = {"bio": (BioRunConfig, BioExperiment), "cpt": (CptRunConfig, CptExperiment)}


def test_there_are_committed_runs_to_check():
    assert len(RUNS) >= 14  # results/bio and results/cpt: seven methods each, plus the studies


@pytest.mark.parametrize("path", RUNS, ids=lambda p: str(p.parent.relative_to(RESULTS)))
def test_committed_run_keeps_its_name(path):
    r = json.loads(path.read_text())
    config_type, experiment = KINDS[r["experiment"]]
    rc = merge(config_type(), r["config"], "")  # the resolved config the run recorded, typed again
    exp = experiment(rc, r["preset"], Paths(Path("unused")))
    run = exp.run_of(get_method(r["method"], **r["method_options"]), Dist())
    assert run.name == path.parent.name == r["run"]["name"]


def test_a_name_leaves_out_the_not_named_keys_nested_ones_too():
    """`not_named` may name a nested key (CPT: eval.never_tokens, a measurement only): the config is otherwise
    kept whole, and the caller's config is not changed."""
    config = {"eval": {"every": 5, "never_tokens": 9}, "checkpoint": {"every": 1}, "seed": 3, "train": 1}
    assert without(config, ("checkpoint", "eval.never_tokens", "nope.x", "train.x")) == {
        "eval": {"every": 5}, "seed": 3, "train": 1}
    assert config["eval"] == {"every": 5, "never_tokens": 9} and "checkpoint" in config
    exp = CptExperiment(CptRunConfig(), "cpu", Paths(Path("unused")))
    named = exp.named_config()
    assert "never_tokens" not in named["eval"] and "every" in named["eval"] and "checkpoint" not in named
