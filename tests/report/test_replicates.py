"""Replicates in `scalecl plot` (issue #18 item 2): grouping by setting, means with Student-t intervals, paired
differences per base seed, bands over replicate curves. Synthetic result folders with known numbers."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.experiments.bio import BioExperiment
from scalecl.experiments.cpt import CptExperiment
from scalecl.experiments.reports import BIO_REPORT, CPT_REPORT
from scalecl.report import (
    NO_INTERVAL,
    Plot,
    draw_fig8,
    draw_fig9,
    load_runs,
    mean_curve,
    paired_table,
    plot_all,
    summary_table,
)
from scalecl.report.stats import binomial_se, interval_note, t_interval, t_quantile
from tests.report.fake_runs import write_result

SPECS = [BIO_REPORT, CPT_REPORT]  # what `scalecl plot` reports
runner = CliRunner()
T2 = 4.302653  # t_{0.975, 2}, from tables
T1 = 12.706205  # t_{0.975, 1}
STEPS = (0, 5, 10)
ATTRS = ("birthday", "birth_city", "university", "major", "company", "company_city")


def bio_run(root: Path, method: str, base: int, run: int = 0, final0: float = 0.2, curve0=(0.9, 0.5, 0.2),
            steps3: int = 10, date: str = "2026-12-01T00:00:00", seeds: str = "new") -> Path:
    """A biography result folder shaped like results/bio/*/ (result.json + metrics.jsonl), with its seeds
    recorded as the current code does (seeds='new'), config.seed only (an older run: 'old'), or none ('none')."""
    tag = f"s{base}-r{run}-" if base or run else ""
    d = root / "bio" / f"cpu-{method}-{tag}{steps3}-{date[:10]}"
    d.mkdir(parents=True)
    lines = [{"step": s, "loss": None if s == 0 else 1.0, "task0/acc": a, "task1/acc": 0.1 + 0.4 * i}
             for i, (s, a) in enumerate(zip(STEPS, curve0, strict=True))]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    config = {"data": "cpu", "model": {"hidden": 128, "layers": 4, "vocab": 0},
              "stage3": {"steps": steps3, "batch": 32, "lr": 1e-4}, "eval": {"slice_people": 100},
              "lr_scale": {"fft": 1.0, "scale-route": 10.0}, "methods": {"scale": {"hidden_up": 32}}}
    if seeds != "none":
        config["seed"] = base
    if seeds == "new":
        config["run_seed"] = run
    result = {
        "experiment": "bio", "preset": "cpu", "method": method, "method_options": {}, "trainable_params": 10,
        "lr": 1e-4, "provenance": {"date": date}, "data": {"n_bio": 1000, "n_task1": 200, "seed": base},
        "config": config,
        "priors": {"task0_heldout": {**{a: 0.05 for a in ATTRS}, "pooled": 0.05}},
        "summary": {"task0_start": curve0[0], "task0_min": min(curve0), "task0_end": curve0[-1],
                    "task1_start": 0.1, "task1_end": 0.9},
        "final": {"task0_heldout": {"acc": final0}, "task1": {"acc": 0.8 + 0.01 * base}},
    }
    if seeds == "new":
        result["seeds"] = {"base": base, "run": run}
    write_result(d, result)
    return d


FFT_FINAL = (0.1, 0.2, 0.3)  # per base seed 0, 1, 2
FFT_CURVES = ((0.9, 0.4, 0.1), (0.9, 0.5, 0.2), (0.9, 0.6, 0.3))


def three_bases(root: Path) -> Path:
    """FFT on bases 0-2 (one run each, plus an older duplicate of base 1 that must be dropped); Route on bases 0
    and 1 and two run seeds on base 2 (0.5 and 0.7: base value 0.6)."""
    for b, (final, curve) in enumerate(zip(FFT_FINAL, FFT_CURVES, strict=True)):
        bio_run(root, "fft", b, final0=final, curve0=curve)
    bio_run(root, "fft", 1, final0=0.9, date="2026-11-01T00:00:00")  # older, same seeds: replaced
    for b, r, final in ((0, 0, 0.5), (1, 0, 0.7), (2, 0, 0.5), (2, 1, 0.7)):
        bio_run(root, "scale-route", b, r, final0=final)
    return root


def half(sd: float, n: int, t: float) -> float:
    return t * sd / math.sqrt(n)


# ---------------------------------------------------------------------------------------------------------
# the interval itself


def test_t_quantile_matches_tables_and_hand_computation():
    assert t_quantile(0.975, 2) == pytest.approx(T2, abs=1e-6)
    assert t_quantile(0.975, 1) == pytest.approx(T1, abs=1e-6)
    assert t_quantile(0.975, 10) == pytest.approx(2.228139, abs=1e-6)
    assert t_quantile(0.975, 1000) == pytest.approx(1.962339, abs=1e-6)
    iv = t_interval([0.1, 0.2, 0.3])
    assert (iv.n, iv.mean, iv.sd) == (3, pytest.approx(0.2), pytest.approx(0.1))
    assert iv.half == pytest.approx(half(0.1, 3, T2), rel=1e-6)
    assert (iv.lo, iv.hi) == (pytest.approx(0.2 - iv.half), pytest.approx(0.2 + iv.half))
    assert iv.note == "t interval, n = 3"
    one = t_interval([0.4])
    assert one.mean == 0.4 and math.isnan(one.lo) and math.isnan(one.hi) and one.note == "n=1 (no interval)"
    assert binomial_se(0.25, 600) == pytest.approx(math.sqrt(0.25 * 0.75 / 600))


# ---------------------------------------------------------------------------------------------------------
# grouping, tables, paired differences


def test_replicates_are_kept_one_per_seed_pair_newest(tmp_path):
    runs = load_runs(Plot.of(three_bases(tmp_path)), BIO_REPORT)
    fft = runs[runs["method"] == "fft"]
    assert fft["base_seed"].tolist() == [0, 1, 2] and fft["run_seed"].tolist() == [0, 0, 0]
    assert fft.set_index("base_seed").loc[1, "result"]["final"]["task0_heldout"]["acc"] == 0.2  # the newer
    route = runs[runs["method"] == "scale-route"]
    assert list(zip(route["base_seed"], route["run_seed"], strict=True)) == [(0, 0), (1, 0), (2, 0), (2, 1)]
    assert runs.groupby("method")["group"].nunique().tolist() == [1, 1]  # one replicate group per method
    assert runs["pair"].nunique() == 1  # both trained on the same bases
    assert (runs["setting"] == "").all()  # nothing tells the groups apart but the method


def test_bio_table_means_and_t_intervals(tmp_path):
    table = summary_table(Plot.of(three_bases(tmp_path)), BIO_REPORT).set_index("method")
    fft, route = table.loc["fft"], table.loc["scale-route"]
    assert (fft["n"], fft["interval"], fft["seeds"]) == (3, "t over 3 base seeds", "0/0, 1/0, 2/0")
    assert fft["task0_full_end"] == pytest.approx(0.2)
    assert fft["task0_full_end_ci_hi"] - 0.2 == pytest.approx(half(0.1, 3, T2), rel=1e-6)
    # Route: base 2's two run seeds (0.5, 0.7) are one base value (0.6), never two replicates beside bases 0, 1
    assert (route["n"], route["interval"]) == (3, "t over 3 base seeds (run seeds averaged within a base)")
    assert route["task0_full_end"] == pytest.approx(0.6)
    assert route["task0_full_end_ci_hi"] - 0.6 == pytest.approx(half(0.1, 3, T2), rel=1e-6)
    assert 0.2 - fft["task0_full_end_ci_lo"] == pytest.approx(half(0.1, 3, T2), rel=1e-6)
    assert fft["task1_full_end"] == pytest.approx(0.81)  # 0.80, 0.81, 0.82
    assert fft["task1_full_end_ci_hi"] - 0.81 == pytest.approx(half(0.01, 3, T2), rel=1e-6)
    assert fft["task0_end"] == pytest.approx(0.2)  # slice numbers: mean, interval and binomial SE at the mean
    assert fft["task0_end_ci_hi"] - 0.2 == pytest.approx(half(0.1, 3, T2), rel=1e-6)
    assert fft["task0_end_binom_se"] == pytest.approx(math.sqrt(0.2 * 0.8 / 600))  # 100 people x 6 questions
    assert fft["task0_start_ci_lo"] == pytest.approx(0.9) and fft["task0_start_ci_hi"] == pytest.approx(0.9)


def test_paired_differences_per_base(tmp_path):
    paired = paired_table(Plot.of(three_bases(tmp_path)), BIO_REPORT)
    assert paired[["a", "b"]].drop_duplicates().values.tolist() == [["SCALE-Route", "FFT"]]
    row = paired.set_index("metric").loc["task0_full_end"]
    # per base: 0.5 - 0.1, 0.7 - 0.2, mean(0.5, 0.7) - 0.3 = 0.4, 0.5, 0.3
    assert row["per_base"] == "0: +0.4; 1: +0.5; 2: +0.3"
    assert (row["n_bases"], row["bases"], row["a_runs"], row["b_runs"]) == (3, "0, 1, 2", 4, 3)
    assert row["diff_mean"] == pytest.approx(0.4)
    assert row["diff_ci_hi"] - 0.4 == pytest.approx(half(0.1, 3, T2), rel=1e-6)
    assert 0.4 - row["diff_ci_lo"] == pytest.approx(half(0.1, 3, T2), rel=1e-6)
    assert (row["a_mean"], row["b_mean"]) == (pytest.approx(0.6), pytest.approx(0.2))
    assert row["interval"] == "t over 3 base seeds"
    t1 = paired.set_index("metric").loc["task1_full_end"]
    assert t1["diff_mean"] == pytest.approx(0.0) and t1["diff_ci_hi"] == pytest.approx(0.0)  # equal per base


def test_one_base_has_no_interval(tmp_path):
    bio_run(tmp_path, "fft", 0, final0=0.1)
    bio_run(tmp_path, "scale-route", 0, final0=0.5)
    row = paired_table(Plot.of(tmp_path), BIO_REPORT).set_index("metric").loc["task0_full_end"]
    assert row["diff_mean"] == pytest.approx(0.4) and row["n_bases"] == 1
    assert math.isnan(row["diff_ci_lo"]) and row["interval"] == NO_INTERVAL
    table = summary_table(Plot.of(tmp_path), BIO_REPORT)
    assert table["interval"].tolist() == ["n=1 (no interval)"] * 2 and table["task0_full_end_ci_lo"].isna().all()


def test_other_configs_stay_separate_groups(tmp_path):
    three_bases(tmp_path)
    for b in (0, 1):  # FFT again with 20 Task 1 steps: its own group, labelled by what differs
        bio_run(tmp_path, "fft", b, final0=0.9, steps3=20)
    table = summary_table(Plot.of(tmp_path), BIO_REPORT)
    fft = table[table["method"] == "fft"].set_index("setting")
    assert sorted(fft.index) == ["10 stage-3 steps", "20 stage-3 steps"]
    assert fft.loc["10 stage-3 steps", "n"] == 3 and fft.loc["10 stage-3 steps", "task0_full_end"] == pytest.approx(0.2)
    assert fft.loc["20 stage-3 steps", "n"] == 2 and fft.loc["20 stage-3 steps", "task0_full_end"] == pytest.approx(0.9)
    paired = paired_table(Plot.of(tmp_path), BIO_REPORT)  # Route is paired only with the FFT trained like it
    assert paired["b"].unique().tolist() == ["FFT [10 stage-3 steps]"]
    assert paired["a"].unique().tolist() == ["SCALE-Route [10 stage-3 steps]"]
    assert paired.set_index("metric").loc["task0_full_end", "diff_mean"] == pytest.approx(0.4)


def test_other_method_options_stay_separate(tmp_path):
    three_bases(tmp_path)
    d = bio_run(tmp_path, "scale-route", 0, final0=0.0, date="2027-01-01T00:00:00")
    r = json.loads((d / "result.json").read_text())
    r["method_options"] = {"tau": 0.5}
    write_result(d, r)
    route = summary_table(Plot.of(tmp_path), BIO_REPORT).query("method == 'scale-route'").set_index("setting")
    assert route.loc["tau=default", "seeds"] == "0/0, 1/0, 2/0, 2/1"  # not replacing seed 0/0
    assert route.loc["tau=default", "n"] == 3 and route.loc["tau=0.5", "n"] == 1  # n: base seeds


# ---------------------------------------------------------------------------------------------------------
# what plot trusts: exactly the results training trusts


def unproven_runs(root: Path) -> dict[str, Path]:
    """three_bases, then four more Route runs that their run folder's manifest does not prove, each with a Task 0
    end of 0.99 (what a hand edit would claim): name -> run folder."""
    three_bases(root)
    runs = {}
    d = runs["edited"] = bio_run(root, "scale-route", 3, final0=0.5)
    f = d / "result.json"
    f.write_text(f.read_text().replace('"acc": 0.5', '"acc": 0.99'))  # edited by hand after the run wrote it
    d = runs["no manifest"] = bio_run(root, "scale-route", 4, final0=0.99)
    (d / ".scalecl-run-files.json").unlink()  # copied without it
    d = runs["another writer"] = bio_run(root, "scale-route", 5, final0=0.99)
    (d / ".scalecl-run-files.json").write_text(json.dumps({"written_by": "me", "files": {}}))
    d = runs["not recorded"] = bio_run(root, "scale-route", 6, final0=0.99)
    (d / ".scalecl-run-files.json").write_text(json.dumps({"written_by": "scalecl run", "files": {}}))
    return runs


UNPROVEN_WHY = {"edited": "changed since its run wrote it (its fingerprint in .scalecl-run-files.json differs)",
                "no manifest": "no .scalecl-run-files.json beside it records that a run wrote it",
                "another writer": ".scalecl-run-files.json beside it is not the record of the files a run wrote",
                "not recorded": ".scalecl-run-files.json beside it does not record it"}


def test_plot_skips_what_training_would_not_count_as_a_finished_run(tmp_path):
    """A result.json its run folder's manifest does not prove (edited by hand, no manifest, another writer's, not
    recorded) is refused by training (Run.result) and skipped by plot with one `skipped: <path>: <reason>` line;
    the proven runs are drawn as before (before: the hand-edited 0.99 was drawn as a real Task 0)."""
    from scalecl.common.errors import ScaleclError
    from scalecl.training.run import Run

    runs = unproven_runs(tmp_path / "res")
    for d in runs.values():  # the training side of the rule
        with pytest.raises(ScaleclError):
            Run({"name": d.name}, d, tmp_path / "ck").result()
    proven = [d for d in (tmp_path / "res" / "bio").iterdir() if d not in runs.values()]
    assert all(Run({"name": d.name}, d, tmp_path / "ck").result() is not None for d in proven)
    out = tmp_path / "figs"
    res = runner.invoke(app, ["plot", "--results", str(tmp_path / "res"), "--out", str(out)])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    skipped = [ln for ln in res.stderr.splitlines() if ln.startswith("skipped:") and "drawn instead" not in ln]
    assert len(skipped) == len(runs), res.stderr  # and three_bases' older FFT duplicate, named as one
    for name, d in runs.items():
        assert sum(ln.startswith(f"skipped: {d / 'result.json'}: {UNPROVEN_WHY[name]}") for ln in skipped) == 1, name
    table = pd.read_csv(out / "table_bio.csv").set_index("method")
    assert table.loc["scale-route", "seeds"] == "0/0, 1/0, 2/0, 2/1"  # the proven runs only
    assert table.loc["scale-route", "task0_full_end"] == pytest.approx(0.6)
    assert "0.99" not in (out / "table_bio.csv").read_text() and "0.990" not in (out / "table_bio.md").read_text()


def test_plot_unverified_draws_them_as_a_setting_of_their_own(tmp_path):
    """--unverified: the unproven runs are drawn, never as replicates of proven runs: a group of their own whose
    setting says '(unverified)', in tables, paired rows and inputs; nothing skipped but the older duplicate
    three_bases holds."""
    runs = unproven_runs(tmp_path / "res")
    out = tmp_path / "figs"
    res = runner.invoke(app, ["plot", "--results", str(tmp_path / "res"), "--out", str(out), "--unverified"])
    skipped = [ln for ln in res.stderr.splitlines() if ln.startswith("skipped:")]
    assert res.exit_code == 0 and len(skipped) == 1 and "2026-11-01: the same setting and seeds" in skipped[0], \
        res.output  # only three_bases' older FFT duplicate, named as one
    table = pd.read_csv(out / "table_bio.csv", keep_default_na=False)
    route = table[table["method"] == "scale-route"].set_index("setting")
    assert sorted(route.index) == ["", "unverified"]
    assert route.loc["", "seeds"] == "0/0, 1/0, 2/0, 2/1" and route.loc["", "task0_full_end"] == pytest.approx(0.6)
    assert route.loc["unverified", "seeds"] == "3/0, 4/0, 5/0, 6/0"
    assert route.loc["unverified", "task0_full_end"] == pytest.approx(0.99)
    assert table[table["method"] == "fft"]["setting"].tolist() == [""]  # proven runs keep their label
    assert "SCALE-Route [unverified]" in set(pd.read_csv(out / "paired_bio.csv")["a"])
    inputs = (out / "table_bio.inputs.txt").read_text()
    assert all(d.name in inputs for d in runs.values()) and "SCALE-Route [unverified]" in inputs
    assert "| scale-route | unverified " in (out / "table_bio.md").read_text()


# ---------------------------------------------------------------------------------------------------------
# the files `scalecl plot` writes


def test_plot_writes_interval_tables_paired_and_inputs(tmp_path):
    res = three_bases(tmp_path / "res")
    out = tmp_path / "figs"
    r = runner.invoke(app, ["plot", "--results", str(res), "--out", str(out)])
    assert r.exit_code == 0, r.output
    csv = pd.read_csv(out / "table_bio.csv").set_index("method")
    assert csv.loc["fft", "task0_full_end_ci_hi"] == pytest.approx(0.2 + half(0.1, 3, T2), rel=1e-6)
    md = (out / "table_bio.md").read_text()
    assert "| t over 3 base seeds " in md and "t over 3 base seeds (run seeds averaged within a base)" in md
    assert "Student-t" in md and "never pooled" in md
    assert f"0.200 ± {half(0.1, 3, T2):.3f}" in md  # FFT task0_full_end
    assert "$\\pm$" in (out / "table_bio.tex").read_text()
    paired = pd.read_csv(out / "paired_bio.csv")
    assert paired.set_index("metric").loc["task0_full_end", "diff_mean"] == pytest.approx(0.4)
    assert "Paired differences" in (out / "paired_bio.md").read_text()
    for stem in ("table_bio", "paired_bio", "fig8_bio_cpu", "train_loss_bio_cpu"):
        inputs = (out / f"{stem}.inputs.txt").read_text() if (out / f"{stem}.inputs.txt").exists() else None
        if stem == "train_loss_bio_cpu":
            assert inputs is None  # no train_log.jsonl here: no figure
            continue
        assert "cpu FFT" in inputs and "n = 3 (seeds 0/0, 1/0, 2/0)" in inputs and "n = 4" in inputs, stem
        drawn = [ln for ln in inputs.splitlines() if ln.startswith("  ") and "cpu-fft-" in ln]
        assert len(drawn) == 3 and inputs.count("2026-11-01") == 1, stem  # the dropped duplicate: no input, named
        assert "cpu-fft-s1-r0-10-2026-12-01 (drawn instead of " in inputs and "-2026-11-01: the same setting" in inputs


def test_old_results_without_seeds_still_plot(tmp_path):
    bio_run(tmp_path, "fft", 0, final0=0.1, seeds="none")
    bio_run(tmp_path, "scale-route", 3, final0=0.4, seeds="old")  # config.seed only: base 3, run 0
    runs = load_runs(Plot.of(tmp_path), BIO_REPORT)
    assert list(zip(runs["base_seed"], runs["run_seed"], strict=True)) == [(0, 0), (3, 0)]
    out = tmp_path / "o"
    names = {p.name for p in plot_all(tmp_path, out, SPECS).written}
    assert {"table_bio.csv", "fig8_bio_cpu.png", "paired_bio.csv"} <= names
    assert pd.read_csv(out / "table_bio.csv")["n"].tolist() == [1, 1]
    # no base seed shared (0 vs 3): a row saying so, no difference
    assert pd.read_csv(out / "paired_bio.csv")["interval"].unique().tolist() == ["no base seed shared"]


def test_malformed_seeds_are_skipped(tmp_path):
    three_bases(tmp_path)
    d = bio_run(tmp_path, "fft", 7, final0=0.9)
    r = json.loads((d / "result.json").read_text())
    r["seeds"] = {"base": "seven", "run": 0}
    write_result(d, r)
    skipped = plot_all(tmp_path, tmp_path / "o", SPECS).skipped
    assert any("seeds" in why for why in skipped.values())
    assert pd.read_csv(tmp_path / "o" / "table_bio.csv").set_index("method").loc["fft", "n"] == 3


# ---------------------------------------------------------------------------------------------------------
# curves: the mean over replicates with a band


def test_fig8_draws_the_mean_and_a_t_band(tmp_path):
    fig = dict(draw_fig8(Plot.of(three_bases(tmp_path)), BIO_REPORT))["fig8_bio_cpu"]
    try:
        fft = fig.axes[0]
        assert fft.get_title() == "FFT\n(3 base seeds)"  # the band's unit, in the panel's title
        task0 = [ln for ln in fft.get_lines() if ln.get_label() == "Task 0 (held-out)"][0]
        assert [float(v) for v in task0.get_ydata()] == pytest.approx([90, 50, 20])  # the mean per step
        assert len(fft.collections) == 2  # a band for Task 0 and one for Task 1
        band = fft.collections[0].get_paths()[0].vertices  # Task 0's band: the t interval per step, in %
        h = 100 * half(0.1, 3, T2)
        assert sorted(set(band[:, 0].tolist())) == [0, 5, 10]
        for step, mean in ((5, 50), (10, 20)):
            at = band[:, 1][band[:, 0] == step]
            assert (max(at), min(at)) == (pytest.approx(mean + h, rel=1e-6), pytest.approx(mean - h, rel=1e-6))
        # Route: bases 0, 1 and two run seeds of base 2, averaged into base 2's value first (3 units, not 4 runs)
        assert fig.axes[1].get_title() == "SCALE-Route\n(3 base seeds)"
        assert "the two seed axes are never pooled" in fig.texts[-1].get_text()
    finally:
        plt.close(fig)
    single = tmp_path / "single"
    bio_run(single, "fft", 0)
    fig = dict(draw_fig8(Plot.of(single), BIO_REPORT))["fig8_bio_cpu"]
    try:
        assert fig.axes[0].get_title() == "FFT" and not fig.axes[0].collections  # one run: a line, no band
    finally:
        plt.close(fig)


def test_mean_curve_uses_the_runs_evaluated_at_each_step():
    a = pd.DataFrame({"step": [0, 5, 10], "x": [0.1, 0.4, 0.7]})
    b = pd.DataFrame({"step": [0, 5, 10], "x": [0.2, 0.5, 0.8]})
    c = pd.DataFrame({"step": [0, 5], "x": [0.3, 0.6]})  # stopped early: not at step 10
    curve = mean_curve([a, b, c], "x").set_index("step")
    assert curve["n"].tolist() == [3, 3, 2]
    assert curve.loc[5, "mean"] == pytest.approx(0.5) and curve.loc[5, "hi"] - 0.5 == pytest.approx(
        half(0.1, 3, T2))
    sd = math.sqrt(2 * 0.05**2)
    assert curve.loc[10, "mean"] == pytest.approx(0.75) and curve.loc[10, "hi"] - 0.75 == pytest.approx(
        half(sd, 2, T1))


def cpt_run(root: Path, method: str, base: int, old_end: float, new_end: float) -> Path:
    """A CPT result folder shaped like results/cpt/*/."""
    d = root / "cpt" / f"cpu-{method}-s{base}-r0-x"
    d.mkdir(parents=True)
    lines = [{"step": s, "old/ppl": 10 + (old_end - 10) * i / 2, "new/ppl": 50 + (new_end - 50) * i / 2,
              "rep_cos": 1.0, "up_norm": 1.0} for i, s in enumerate((0, 10, 20))]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    config = {"base": "builtin", "data": {"path": "builtin:ko"}, "train": {"steps": 20, "batch": 8, "seq_len": 64},
              "lr": {"fft": 1e-4, "scale-route": 1e-3}, "seed": base, "run_seed": 0}
    result = {"experiment": "cpt", "preset": "cpu", "method": method, "method_options": {}, "lr": 1e-3,
              "trainable_params": 5, "provenance": {"date": "2026-12-01"}, "seeds": {"base": base, "run": 0},
              "config": copy.deepcopy(config),
              "summary": {"old_ppl_start": 10.0, "old_ppl_end": old_end, "old_ppl_max": old_end,
                          "new_ppl_start": 50.0, "new_ppl_end": new_end, "rep_cos_end": 1.0},
              "final": lines[-1]}
    write_result(d, result)
    return d


def test_cpt_table_paired_and_fig9_bands(tmp_path):
    for b, (fo, fn, ro, rn) in enumerate(((14.0, 20.0, 11.0, 22.0), (16.0, 18.0, 12.0, 21.0))):
        cpt_run(tmp_path, "fft", b, fo, fn)
        cpt_run(tmp_path, "scale-route", b, ro, rn)
    table = summary_table(Plot.of(tmp_path), CPT_REPORT).set_index("method")
    assert table.loc["fft", "old_ppl_end"] == pytest.approx(15.0) and table.loc["fft", "n"] == 2
    assert table.loc["fft", "old_ppl_end_ci_hi"] - 15 == pytest.approx(half(math.sqrt(2), 2, T1), rel=1e-6)
    paired = paired_table(Plot.of(tmp_path), CPT_REPORT).set_index("metric")
    old = paired.loc["old_ppl_end"]  # per base: 11 - 14 = -3, 12 - 16 = -4
    assert old["diff_mean"] == pytest.approx(-3.5) and old["per_base"] == "0: -3; 1: -4"
    assert old["diff_ci_hi"] + 3.5 == pytest.approx(half(math.sqrt(0.5), 2, T1), rel=1e-6)
    assert paired.loc["new_ppl_end", "diff_mean"] == pytest.approx(2.5)
    fig = dict(draw_fig9(Plot.of(tmp_path), CPT_REPORT))["fig9_cpt_cpu"]
    try:
        labels = [ln.get_label() for ln in fig.axes[0].get_lines()]
        assert labels == ["FFT [lr=0.001] (2 base seeds)", "SCALE-Route [lr=0.001] (2 base seeds)"]
        assert len(fig.axes[0].collections) == 2
        assert [float(v) for v in fig.axes[0].get_lines()[0].get_ydata()] == pytest.approx([10, 12.5, 15])
    finally:
        plt.close(fig)


def test_groups_that_differ_only_in_their_rate_are_labelled_by_it(tmp_path):
    """Two FFT runs at other rates (a learning-rate frontier) are told apart by `lr=`, not by a config hash."""
    from scalecl.report import load_runs

    for lr in (1e-4, 1e-3):
        d = cpt_run(tmp_path, "fft", 0, 12.0, 40.0)
        r = json.loads((d / "result.json").read_text())
        r["lr"], r["config"]["lr"]["fft"] = lr, lr
        write_result(d, r)
        d.rename(d.with_name(f"{d.name}-{lr:g}"))
    cpt_run(tmp_path, "scale-route", 0, 11.0, 30.0)
    runs = load_runs(Plot.of(tmp_path), CPT_REPORT)
    assert runs.set_index("method").loc["fft", "setting"].tolist() == ["lr=0.0001", "lr=0.001"]
    assert runs.set_index("method").loc["scale-route", "setting"] == ""


@pytest.mark.slow
def test_committed_results_still_plot(tmp_path, monkeypatch):
    """`scalecl plot --results results` on the committed runs (mostly one seed each; replicates arrive as they
    finish): an interval exactly where a group has n >= 2, paired rows, the frontier tables."""
    results = Path(__file__).resolve().parents[2] / "results"
    if not (results / "bio").is_dir():
        pytest.skip("no committed results")
    out = tmp_path / "figs"
    # run from the checkout with `--results results`, as paper_figures/ is made: the inputs lists name run
    # folders as the command was given them, so an absolute path would differ from machine to machine
    monkeypatch.chdir(results.parent)
    # the figures in one format at a third of paper_figures' 150 dpi: drawing is most of this command's time
    r = runner.invoke(app, ["plot", "--results", "results", "--out", str(out), "--formats", "png", "--dpi", "50"])
    assert r.exit_code == 0, r.output
    bio = pd.read_csv(out / "table_bio.csv")
    # a group is a method at one rate and one setting (SCALE-Route at 1e-3 twice: tau 0.5 and the former 0.9)
    assert len(bio) == len(bio[["method", "lr", "setting"]].drop_duplicates()) and (bio["n"] >= 1).all()
    assert len(bio) == bio["group"].nunique()
    assert all(i == interval_note(1) if n == 1 else i.startswith(f"t over {n} ")
               for i, n in zip(bio["interval"], bio["n"], strict=True))
    assert (bio["task0_full_end_ci_lo"].isna() == (bio["n"] < 2)).all()
    assert bio["task0_end_binom_se"].notna().all()  # the committed runs record their attributes
    paired = pd.read_csv(out / "paired_bio.csv")
    assert (paired.query("n_bases < 2")["interval"] == NO_INTERVAL).all() and all(a.startswith("SCALE-Route") for a in paired["a"])
    frontier = pd.read_csv(out / "frontier_bio.csv")  # one point per method and rate
    assert set(frontier["method"]) == set(bio["method"]) and (out / "frontier_bio.png").exists()
    assert (out / "frontier_cpt.csv").exists() and (out / "frontier_cpt.png").exists()
    assert (out / "paired_cpt.csv").exists() and (out / "fig8_bio_cpu.inputs.txt").exists()
    # paper_figures/ is this command's output on these results: the same files (each PDF's figure drawn here as
    # PNG), every table and figure input list the same text, and every figure the same size in inches (its
    # pixels at 50 dpi a third of the committed ones', within 10%: the images themselves depend on the fonts
    # and matplotlib build of the machine, and text rounds differently at a low resolution)
    from matplotlib.image import imread

    committed = results.parent / "paper_figures"
    assert sorted(p.name for p in committed.iterdir() if p.suffix != ".pdf") == sorted(p.name for p in out.iterdir())
    assert {p.stem for p in committed.glob("*.pdf")} == {p.stem for p in committed.glob("*.png")}
    for f in sorted(out.iterdir()):
        if f.name.startswith("."):  # plot's manifest of its own files: their digests, the PNGs' differ at 50 dpi
            continue
        if f.suffix in (".csv", ".md", ".tex", ".txt"):
            assert f.read_text() == (committed / f.name).read_text(), f"paper_figures/{f.name} is stale: rerun plot"
        else:
            drawn, paper = imread(f).shape[:2], imread(committed / f.name).shape[:2]
            assert all(abs(3 * a / b - 1) < 0.1 for a, b in zip(drawn, paper, strict=True)), (f.name, drawn, paper)


def test_replicate_groups_leave_out_what_run_names_leave_out():
    """A replicate group is what names a run (scalecl.experiments.base: the config but `not_named`, plus the
    method, its options and its own rate), seeds and numerics aside: runs that differ in checkpointing, compute
    options (threads: absent before the option existed) or another method's table or options are replicates;
    another rate, option or config key is another setting."""
    from scalecl.report.runs import config_id

    def result(seed, lr=1e-4, options=None, **config):
        return {"experiment": "bio", "preset": "cpu", "method": "fft", "method_options": options or {}, "lr": lr,
                "config": {"seed": seed, "stage3": {"lr": 1e-4}, "compute": {"threads": 1, "tf32": True},
                           "checkpoint": {"every": 0, "keep": 2}, "lr_scale": {"fft": 1.0, "lora": 10.0},
                           "methods": {}} | config}

    def group(r, pair=False):
        return config_id(r, BIO_REPORT, pair=pair)

    new = result(2)
    for same in (result(1, compute={"threads": None, "tf32": True}), result(1, compute={"threads": 2, "tf32": False}),
                 result(1, checkpoint={"every": 50, "keep": 3}), result(1, lr_scale={"fft": 1.0, "lora": 3.0}),
                 result(1, methods={"lora": {"rank": 4}})):
        assert group(same) == group(new) and group(same, pair=True) == group(new, pair=True), same["config"]
    for other in (result(1, lr=3e-4, lr_scale={"fft": 3.0, "lora": 10.0}), result(1, stage3={"lr": 3e-4}),
                  result(1, options={"k": 2})):
        assert group(other) != group(new), other
    assert BIO_REPORT.not_named == BioExperiment.not_named and CPT_REPORT.not_named == CptExperiment.not_named


def test_runs_differing_only_in_checkpointing_are_one_setting(tmp_path):
    """FFT on three bases, one of them checkpointed every 5 steps with other compute options (and, for the
    CPT, measuring never-target rows): one setting of 3 replicates, not two settings (before: 'checkpoint.every=0'
    n=2 beside 'checkpoint.every=5' n=1)."""
    for b in range(3):
        d = bio_run(tmp_path, "fft", b, final0=FFT_FINAL[b])
        if b == 2:
            r = json.loads((d / "result.json").read_text())
            r["config"] |= {"checkpoint": {"every": 5, "keep": 1}, "compute": {"threads": 2, "compile": True}}
            write_result(d, r)
    (row,) = summary_table(Plot.of(tmp_path), BIO_REPORT).to_dict("records")
    assert (row["setting"], row["n"], row["seeds"]) == ("", 3, "0/0, 1/0, 2/0")
    assert row["task0_full_end"] == pytest.approx(0.2)
    cpt = {"experiment": "cpt", "preset": "cpu", "method": "fft", "method_options": {}, "lr": 1e-4,
           "trainable_params": 10, "provenance": {"date": "2026-12-01"}, "final": {},
           "summary": dict.fromkeys(("old_ppl_start", "old_ppl_end", "old_ppl_max", "new_ppl_start", "new_ppl_end",
                                     "rep_cos_end"), 2.0),
           "config": {"train": {"steps": 10, "batch": 2, "seq_len": 8}, "eval": {"every": 5, "never_tokens": 0},
                      "lr": {"fft": 1e-4}, "checkpoint": {"every": 0, "keep": 2}}}
    for b, never, every in ((0, 0, 0), (1, 0, 10), (2, 1000, 0)):
        d = tmp_path / "cpt" / f"cpu-fft-s{b}"
        d.mkdir(parents=True)
        write_result(d, cpt | {"seeds": {"base": b, "run": 0}, "config": cpt["config"] | {
            "eval": {"every": 5, "never_tokens": never}, "checkpoint": {"every": every, "keep": 2}}})
    (row,) = summary_table(Plot.of(tmp_path), CPT_REPORT).to_dict("records")
    assert (row["setting"], row["n"]) == ("", 3)


def test_run_seeds_of_one_base_are_the_unit_when_a_group_has_one_base(tmp_path):
    for r, final in ((0, 0.2), (1, 0.3), (2, 0.4)):
        bio_run(tmp_path, "fft", 0, r, final0=final)
    (row,) = summary_table(Plot.of(tmp_path), BIO_REPORT).to_dict("records")
    assert (row["n"], row["interval"], row["seeds"]) == (3, "t over 3 run seeds of base 0", "0/0, 0/1, 0/2")
    assert row["task0_full_end_ci_hi"] - 0.3 == pytest.approx(half(0.1, 3, T2), rel=1e-6)


def test_paired_differences_per_base_seed_and_per_run_seed_are_separate_rows(tmp_path):
    """Route and FFT on base 0 with run seeds 0-2 and on base 1: one row over the 2 bases (base 0's run seeds
    averaged), one over base 0's 3 run seeds; never one interval over the 4 runs."""
    for r, (route, fft) in enumerate(((0.5, 0.2), (0.6, 0.2), (0.7, 0.3))):
        bio_run(tmp_path, "scale-route", 0, r, final0=route)
        bio_run(tmp_path, "fft", 0, r, final0=fft)
    bio_run(tmp_path, "scale-route", 1, 0, final0=0.4)
    bio_run(tmp_path, "fft", 1, 0, final0=0.3)
    rows = paired_table(Plot.of(tmp_path), BIO_REPORT).query("metric == 'task0_full_end'").set_index("interval")
    assert sorted(rows.index) == ["t over 2 base seeds", "t over 3 run seeds of base 0"]
    bases, runs = rows.loc["t over 2 base seeds"], rows.loc["t over 3 run seeds of base 0"]
    assert bases["diff_mean"] == pytest.approx(((0.3 + 0.4 + 0.4) / 3 + 0.1) / 2)
    assert runs["diff_mean"] == pytest.approx((0.3 + 0.4 + 0.4) / 3)
    assert runs["per_base"] == "0/0: +0.3; 0/1: +0.4; 0/2: +0.4"


def test_runs_on_two_builds_of_one_base_seed_are_not_paired(tmp_path):
    """Two builds of base seed 0 (stages 1-2 trained anew end with other losses) are two bases: Route on one and
    FFT on the other share none, whatever their seeds say."""
    def build(d: Path, stage1_loss: float) -> None:
        r = json.loads((d / "result.json").read_text())
        r |= {"stage1": {"final_loss": stage1_loss}, "stage2": {"final_loss": 0.01}}
        write_result(d, r)

    for r in range(3):
        build(bio_run(tmp_path / "a", "scale-route", 0, r, final0=0.5), 0.40)
        build(bio_run(tmp_path / "a", "fft", 0, r, final0=0.2), 0.40)
        build(bio_run(tmp_path / "b", "scale-route", 0, r, final0=0.5), 0.40)
        build(bio_run(tmp_path / "b", "fft", 0, r, final0=0.2), 0.41)  # another build of base 0
    same = paired_table(Plot.of(tmp_path / "a"), BIO_REPORT).query("metric == 'task0_full_end'")
    assert "t over 3 run seeds of base 0" in same["interval"].tolist()
    other = paired_table(Plot.of(tmp_path / "b"), BIO_REPORT).query("metric == 'task0_full_end'")
    assert other["interval"].tolist() == ["no base seed shared"]


def test_an_older_run_folder_is_adopted_once_and_then_verified_like_any_other(tmp_path):
    import json

    import pytest

    from scalecl.common.errors import ScaleclError
    from scalecl.common.files import OwnedFiles
    from scalecl.training.record import RESULT_FILE, record_text
    from scalecl.training.run import RUN_WRITER, adopt_run_folder

    d = tmp_path / "bio" / "cpu-fft-abc"
    d.mkdir(parents=True)
    result = {"experiment": "bio", "method": "fft", "preset": "cpu"}
    (d / RESULT_FILE).write_text(record_text({"name": d.name}, result, d, None))
    (d / "metrics.jsonl").write_text('{"step": 0}\n')
    owned = OwnedFiles(d, RUN_WRITER)
    assert not owned.owns(RESULT_FILE)  # written before manifests: nothing proves it
    adopt_run_folder(d, {"commits": {"result.json": "abc1234"}})
    doc = json.loads(owned.manifest.read_text())
    assert doc["adopted"] == {"commits": {"result.json": "abc1234"}} and set(doc["files"]) == {RESULT_FILE, "metrics.jsonl"}
    assert OwnedFiles(d, RUN_WRITER).owns(RESULT_FILE)
    with pytest.raises(ScaleclError, match="has a manifest already"):
        adopt_run_folder(d, {})
    (d / RESULT_FILE).write_text((d / RESULT_FILE).read_text().replace("fft", "lora"))  # edited after adoption
    assert not OwnedFiles(d, RUN_WRITER).owns(RESULT_FILE)


def test_a_reference_no_study_wrote_is_skipped_with_one_line(tmp_path):
    import json

    from scalecl.common.files import OwnedFiles
    from scalecl.report.context import Plot
    from scalecl.report.runs import _result_files
    from scalecl.training.record import REFERENCE_WRITER
    from tests.report.fake_runs import write_result

    main = tmp_path / "bio" / "cpu-scale-route-abc"
    write_result(main, {"experiment": "bio", "method": "scale-route", "preset": "cpu"})
    text = json.dumps({"reference": "../../../bio/cpu-scale-route-abc", "run": main.name}) + "\n"
    by_hand = tmp_path / "studies" / "tau" / "cpu-scale-route-abc"
    by_hand.mkdir(parents=True)
    (by_hand / "reference.json").write_text(text)
    plot = Plot.of(tmp_path)
    assert _result_files(plot, tmp_path, "tau") == []
    (why,) = plot.skipped.values()
    assert "not a reference a study wrote" in why
    OwnedFiles(by_hand, REFERENCE_WRITER).remove("reference.json")  # not its own: stays
    (by_hand / "reference.json").unlink()
    OwnedFiles(by_hand, REFERENCE_WRITER).write("reference.json", text)
    plot = Plot.of(tmp_path)
    assert _result_files(plot, tmp_path, "tau") == [main / "result.json"] and not plot.skipped


def test_a_result_holding_nan_is_one_skipped_line_even_unverified(tmp_path):
    import json

    import pytest

    from scalecl.common.errors import ScaleclError
    from scalecl.report.runs import read_result
    from tests.report.fake_runs import write_result

    d = tmp_path / "cpt" / "cpu-fft-abc"
    f = write_result(d, {"experiment": "cpt", "method": "fft", "preset": "cpu", "summary": {"new_ppl_end": 3.0}})
    assert read_result(f)["summary"]["new_ppl_end"] == 3.0
    for bad in ("NaN", "Infinity", "-Infinity"):
        f.write_text(f.read_text().replace('"new_ppl_end": 3.0', f'"new_ppl_end": {bad}'))
        with pytest.raises(ScaleclError, match=r"'summary.new_ppl_end' is not a finite number"):
            read_result(f)
        f.write_text(f.read_text().replace(f'"new_ppl_end": {bad}', '"new_ppl_end": 3.0'))
    assert json.loads(f.read_text())["summary"]["new_ppl_end"] == 3.0
