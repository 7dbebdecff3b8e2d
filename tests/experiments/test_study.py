"""Preliminary-study sweeps (paper Figs. 5-7) as ordinary train-cpt runs, then drawn by `scalecl plot`."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.experiments import load_preset
from scalecl.experiments.study import study_values

runner = CliRunner()


def test_values():
    rc = load_preset("cpt", "tiny")
    layers = rc.model.layers
    assert study_values("l_fp", rc, None) == [str(i) for i in range(layers + 1)]
    assert study_values("l_fp", rc, "1..2") == ["1", "2"]
    assert study_values("init", rc, None) == ["zero,rnd", "rnd,zero", "svd,svd", "svd,zero"]
    assert study_values("collab", rc, None) == ["attn", "mlp"]
    with pytest.raises(ScaleclError, match="unknown study"):
        study_values("width", rc, None)
    with pytest.raises(ScaleclError, match="integers or a range"):
        study_values("l_fp", rc, "a..b")
    with pytest.raises(ScaleclError, match="more than the 1,000 runs"):  # refused before it is expanded
        study_values("l_fp", rc, f"0..{10**30}")
    with pytest.raises(ScaleclError, match="empty range"):
        study_values("l_fp", rc, "2..1")
    for empty in ("", "  "):  # given but empty is never the default set (which would train every default value)
        with pytest.raises(ScaleclError, match="--values is empty"):
            study_values("tau", load_preset("bio", "tiny"), empty)


def test_bad_study_one_line(tmp_path):
    r = runner.invoke(app, ["study", "depth", "--preset", "tiny", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and r.output.strip().startswith("error:") and "unknown study" in r.output
    assert not (tmp_path / "o").exists()


def test_every_value_is_checked_against_the_data_before_any_trains(tmp_path):
    """vocab=10 is smaller than the tokenizer, which only the prepared data tell: it is refused before value 0
    (which would pass) trains, not after."""
    r = runner.invoke(app, ["study", "vocab", "--preset", "tiny", "--values", "0;10", "--out", str(tmp_path / "o"),
                            "--cache", str(tmp_path / "cache"), "--checkpoints", str(tmp_path / "ck"),
                            "--set", "stage1.steps=4", "--set", "stage2.steps=2", "--set", "stage3.steps=2"])
    lines = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert r.exit_code == 2 and lines == [r.output.strip().splitlines()[-1]], r.output
    assert "vocab value '10': model.vocab=10 is smaller than the tokenizer's" in lines[0]
    assert not list(tmp_path.rglob("result.json")) and not (tmp_path / "ck").exists()  # nothing trained


def test_init_study_end_to_end(tmp_path):
    args = ["--preset", "tiny", "--out", str(tmp_path / "results" / "studies"), "--cache", str(tmp_path / "cache"),
            "--checkpoints", str(tmp_path / "runs")]
    r = runner.invoke(app, ["study", "init", "--values", "zero,rnd;svd,zero", *args])
    assert r.exit_code == 0, r.output
    results = sorted((tmp_path / "results" / "studies" / "init").rglob("result.json"))
    assert len(results) == 2
    inits = sorted(tuple(json.loads(f.read_text())["method_options"]["init"]) for f in results)
    assert inits == [("svd", "zero"), ("zero", "rnd")]
    r = runner.invoke(app, ["plot", "--results", str(tmp_path / "results"), "--out", str(tmp_path / "figs")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "figs" / "fig5_init_pairs.png").stat().st_size > 0
    assert sorted(pd.read_csv(tmp_path / "figs" / "table_fig5_init.csv")["setting"]) == ["0,RND", "SVD,0"]


def test_init_study_dead_arm_on_untied_base(tmp_path):
    """(W21, W22) = (0, RND) with zero new embedding columns never learns (every new gradient is exactly zero):
    the learning PPL stays at its start, bit for bit. Random new columns (untied base) make it learn, with the
    old-domain PPL at the start unchanged (function preserved). The plot draws one row per embedding variant."""
    args = ["--preset", "tiny", "--out", str(tmp_path / "results" / "studies"), "--cache", str(tmp_path / "cache"),
            "--checkpoints", str(tmp_path / "runs"), "--values", "zero,rnd", "--set", "model.tie_embeddings=false"]
    for e in ("zero", "rnd"):
        r = runner.invoke(app, ["study", "init", *args, "--set", f"methods.scale-preserve.embed_init={e}"])
        assert r.exit_code == 0, r.output
    res = {json.loads(f.read_text())["method_options"]["embed_init"]: json.loads(f.read_text())["summary"]
           for f in (tmp_path / "results" / "studies" / "init").rglob("result.json")}
    assert res["zero"]["new_ppl_end"] == res["zero"]["new_ppl_start"]
    assert res["rnd"]["new_ppl_end"] < 0.95 * res["rnd"]["new_ppl_start"]
    assert res["rnd"]["old_ppl_start"] == pytest.approx(res["zero"]["old_ppl_start"], rel=1e-5)
    r = runner.invoke(app, ["plot", "--results", str(tmp_path / "results"), "--out", str(tmp_path / "figs")])
    assert r.exit_code == 0, r.output
    table = pd.read_csv(tmp_path / "figs" / "table_fig5_init.csv")
    assert sorted(table["variant"]) == ["untied base, new embedding columns rnd",
                                        "untied base, new embedding columns zero"]


BIO_FAST = ["--preset", "tiny", "--set", "stage1.steps=24", "--set", "stage2.steps=6", "--set", "stage3.steps=6",
            "--set", "eval.dense_until=6", "--set", "eval.dense_every=3", "--set", "eval.every=6"]


@pytest.mark.slow
def test_study_references_the_main_run_instead_of_copying_it(tmp_path):
    """A study value whose run already finished among the main runs (results/bio/<name>: the default Route run
    is tau=0.5) is not trained again: the study folder gets a reference.json to it, `plot` reads the run through
    it, and a second study run trains nothing. A reference to a removed run is skipped with one line."""
    from scalecl.experiments.reports import BIO_REPORT
    from scalecl.report import Plot, load_runs

    res, cache = tmp_path / "results", ["--cache", str(tmp_path / "cache"), "--checkpoints", str(tmp_path / "ck")]
    r = runner.invoke(app, ["train-bio", "--method", "scale-route", *BIO_FAST, "--out", str(res / "bio"), *cache])
    assert r.exit_code == 0, r.output
    (main_run,) = [p.parent for p in (res / "bio").glob("*/result.json")]
    study = ["study", "tau", "--values", "-1;0.5", *BIO_FAST, "--out", str(res / "studies"), *cache]
    r = runner.invoke(app, study)
    assert r.exit_code == 0, r.output
    assert "refers to it (no copy)" in r.output
    ref = res / "studies" / "tau" / main_run.name / "reference.json"
    assert ref.is_file() and not (ref.parent / "result.json").exists()
    assert json.loads(ref.read_text())["reference"] == f"../../../bio/{main_run.name}"
    own = [p.parent.name for p in (res / "studies" / "tau").glob("*/result.json")]
    assert len(own) == 1 and own[0] != main_run.name  # tau=-1 trained as its own run
    runs = load_runs(Plot.of(res), BIO_REPORT, study="tau")
    assert sorted(str(d) for d in runs["dir"]) == sorted([str(main_run), str(res / "studies" / "tau" / own[0])])
    assert len(load_runs(Plot.of(res), BIO_REPORT)) == 1  # the main figures still count the main run once
    before = sorted(p.stat().st_mtime_ns for p in (res / "studies").rglob("*") if p.is_file())
    r = runner.invoke(app, study)  # nothing to train: one finished run, one reference
    assert r.exit_code == 0 and "stage 3" not in r.output, r.output
    assert sorted(p.stat().st_mtime_ns for p in (res / "studies").rglob("*") if p.is_file()) == before
    r = runner.invoke(app, ["plot", "--results", str(res), "--out", str(tmp_path / "figs")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, [*study[:3], "0.5", *study[4:], "--force"])  # --force trains a copy, which is read
    assert r.exit_code == 0 and (ref.parent / "result.json").is_file(), r.output
    assert ref.parent in set(load_runs(Plot.of(res), BIO_REPORT, study="tau")["dir"])
    for p in ref.parent.iterdir():
        p.unlink() if p.is_file() else None
    r = runner.invoke(app, study)  # the reference comes back; the copy's final model stays in checkpoints
    assert r.exit_code == 0 and ref.is_file(), r.output
    for p in main_run.iterdir():
        p.unlink()
    main_run.rmdir()
    plot = Plot.of(res)
    assert list(load_runs(plot, BIO_REPORT, study="tau")["dir"]) == [res / "studies" / "tau" / own[0]]
    assert any("holds no result.json" in why for why in plot.skipped.values())


def test_study_references_a_run_of_another_study(tmp_path):
    """The same run reached from two studies (router=logit at tau 0.5 is the tau study's tau=0.5 run) is trained
    once: the second study refers to the first one's folder."""
    from scalecl.experiments.reports import BIO_REPORT
    from scalecl.report import Plot, load_runs

    res, cache = tmp_path / "results", ["--cache", str(tmp_path / "cache"), "--checkpoints", str(tmp_path / "ck")]
    r = runner.invoke(app, ["study", "tau", "--values", "0.5", *BIO_FAST, "--out", str(res / "studies"), *cache])
    assert r.exit_code == 0, r.output
    (tau_run,) = [p.parent for p in (res / "studies" / "tau").glob("*/result.json")]
    r = runner.invoke(app, ["study", "router", "--values", "logit", *BIO_FAST, "--set", "methods.scale-route.tau=0.5",
                            "--out", str(res / "studies"), *cache])
    assert r.exit_code == 0 and "stage 3" not in r.output, r.output
    ref = res / "studies" / "router" / tau_run.name / "reference.json"
    assert json.loads(ref.read_text())["reference"] == f"../../tau/{tau_run.name}"
    assert list(load_runs(Plot.of(res), BIO_REPORT, study="router")["dir"]) == [tau_run]
