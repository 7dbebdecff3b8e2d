"""The ensemble study's report (fig8_ensemble, its table of means, Route paired with each control) and the
continual-learning metrics every table carries, on tiny runs made by train-bio."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.experiments.reports import BIO_REPORT, CPT_REPORT
from scalecl.report import plot_all
from scalecl.report.continual import MATCHED_TASK1, bio_metrics, cpt_metrics, curve_mean
from scalecl.report.settings import control_label, rate_text

runner = CliRunner()
FAST = ["--set", "stage1.steps=30", "--set", "stage2.steps=5", "--set", "stage3.steps=12",
        "--set", "eval.dense_until=6", "--set", "eval.dense_every=3", "--set", "eval.every=6"]
VARIANTS = [("scale-route",), ("scale-route", "methods.scale-route.tau=-1"), ("fft",), ("fft", "ensemble.mode=train"),
            ("fft", "ensemble.mode=eval"), ("lora", "methods.lora.rank=8")]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Runs of the ensemble study on two base seeds of the tiny preset: (results root, plot folder)."""
    root = tmp_path_factory.mktemp("ens_report")
    out = root / "results" / "studies" / "ensemble"
    for method, *sets in VARIANTS:
        args = ["train-bio", "--preset", "tiny", "--seeds", "0,1", "--out", str(out), "--cache", str(root / "cache"),
                "--checkpoints", str(root / "ckpt"), *FAST, "--method", method]
        for s in sets:
            args += ["--set", s]
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
    written = plot_all(root / "results", root / "figs", [BIO_REPORT]).written
    return root / "results", root / "figs", {p.name for p in written}


def test_ensemble_figure_and_tables(study):
    _, figs, names = study
    assert {"fig8_ensemble.png", "frontier_ensemble.png", "table_fig8_ensemble_means.md",
            "paired_bio_ensemble.csv"} <= names
    assert not any(n.startswith("fig8_route_ensemble") for n in names)  # not also drawn as a Route study
    means = pd.read_csv(figs / "table_fig8_ensemble_means.csv")
    assert set(means["setting"]) == {"SCALE-Route (tau=0.5, 1e-3)", "SCALE-Route (tau=-1, 1e-3)", "FFT (1e-4)",
                                     "FFT (1e-4) + base avg. in training", "FFT (1e-4) + base avg. when scored",
                                     "LoRA (r=8, 1e-3)"}
    assert (means["n"] == 2).all() and means["task0_auc_ci_lo"].notna().all()
    paired = pd.read_csv(figs / "paired_bio_ensemble.csv")
    ab = set(zip(paired["a"], paired["b"], strict=True))
    # each Route setting minus each control, on the 2 shared bases: the average with the base pairs like a method
    assert ("SCALE-Route (tau=0.5, 1e-3)", "FFT (1e-4) + base avg. in training") in ab
    assert ("SCALE-Route (tau=-1, 1e-3)", "FFT (1e-4) + base avg. when scored") in ab
    assert (paired["n_bases"] == 2).all()
    assert set(paired["metric"]) == {"task0_full_end", "task1_full_end", "task0_auc"}


def test_cl_metrics_recomputed_from_the_run_files(study):
    results, figs, _ = study
    means = pd.read_csv(figs / "table_fig8_ensemble_means.csv").set_index("setting")
    runs = [d for d in (results / "studies" / "ensemble").iterdir() if (d / "result.json").is_file()]
    by_setting: dict[str, list[dict]] = {}
    for d in runs:
        r = json.loads((d / "result.json").read_text())
        m = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        steps, t0 = np.array([x["step"] for x in m], float), np.array([x["task0/acc"] for x in m])
        t1 = np.array([x["task1/acc"] for x in m])
        auc = sum((t0[i] + t0[i + 1]) / 2 * (steps[i + 1] - steps[i]) for i in range(len(t0) - 1)) / steps[-1]
        first = next((t0[i] for i in range(len(t1)) if t1[i] >= MATCHED_TASK1), None)
        want = {"bwt": r["final"]["task0_heldout"]["acc"] - r["stage2"]["task0_heldout"]["acc"],
                "task0_auc": auc, "task0_from_max": t0.max() - t0[-1], "task0_at_task1": first}
        got = bio_metrics(r, pd.DataFrame(m))
        assert got.keys() == want.keys()
        for k, v in want.items():
            assert (got[k] is None) if v is None else got[k] == pytest.approx(v, abs=1e-12), k
        by_setting.setdefault(control_label(r), []).append(want)
    for setting, wants in by_setting.items():
        assert means.loc[setting, "task0_auc"] == pytest.approx(np.mean([w["task0_auc"] for w in wants]), abs=1e-9)
        assert means.loc[setting, "bwt"] == pytest.approx(np.mean([w["bwt"] for w in wants]), abs=1e-9)


def test_rate_text():
    assert [rate_text(x) for x in (1e-4, 3e-4, 0.001, 1.5e-3, 2.0)] == ["1e-4", "3e-4", "1e-3", "1.5e-3", "2e0"]


def test_curve_mean_and_cpt_metrics():
    assert curve_mean(np.array([0.0, 10.0, 30.0]), np.array([1.0, 0.0, 1.0])) == pytest.approx((5 + 10) / 30)
    assert curve_mean(np.array([5.0]), np.array([0.3])) == 0.3
    m = pd.DataFrame({"step": [0, 50, 100], "old/ppl": [3.0, 2.5, 4.0]})
    got = cpt_metrics({"summary": {"old_ppl_start": 3.0, "old_ppl_end": 4.0}}, m)
    assert got == {"old_ppl_rise": 1.0, "old_ppl_auc": pytest.approx((2.75 * 50 + 3.25 * 50) / 100),
                   "old_ppl_from_best": 1.5}
    assert cpt_metrics({"summary": {}}, None) == {"old_ppl_rise": None, "old_ppl_auc": None,
                                                  "old_ppl_from_best": None}
    assert CPT_REPORT.cl is cpt_metrics and BIO_REPORT.cl is bio_metrics


def test_units_needed_is_the_first_n_whose_interval_excludes_zero():
    from scipy.stats import t

    from scalecl.report.stats import MAX_UNITS, units_needed

    # mean 0.70, sd 0.31: n = 3 gives 4.303 x 0.31 / sqrt(3) = 0.770 (reaches 0), n = 4 gives 3.182 x 0.31 / 2 = 0.493
    assert units_needed(0.70, 0.31) == 4
    assert units_needed(-0.70, 0.31) == 4  # the sign does not matter
    for mean, sd in ((0.19, 0.05), (1.0, 2.0), (0.02, 0.1)):
        n = units_needed(mean, sd)
        assert t.ppf(0.975, n - 1) * sd / n ** 0.5 < abs(mean) <= t.ppf(0.975, n - 2) * sd / (n - 1) ** 0.5 or n == 2
    assert units_needed(0.0, 0.1) is None and units_needed(0.001, 1.0) is None  # beyond MAX_UNITS
    assert units_needed(float("nan"), 0.1) is None and units_needed(0.3, 0.0) == 2 and MAX_UNITS == 100
