"""Figures and tables are pure functions of small synthetic results files (no training)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.report import bio_table, load_runs

runner = CliRunner()


def fake_bio_run(root, method, preset="cpu", t0=(0.9, 0.2, 0.3), t1=(0.0, 0.5, 0.9), date="2026-11-21T00:00:00",
                 tag="abc"):
    d = root / "bio" / f"{preset}-{method}-{tag}"
    d.mkdir(parents=True)
    lines = [{"step": s, "task0/acc": a, "task1/acc": b} for s, a, b in zip((0, 5, 10), t0, t1, strict=True)]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = {
        "experiment": "bio", "preset": preset, "method": method, "trainable_params": 10, "lr": 1e-4,
        "provenance": {"date": date},
        "data": {"n_bio": 1000, "n_task1": 200},
        "config": {"model": {"hidden": 128, "layers": 4}, "stage3": {"steps": 10, "batch": 32, "lr": 1e-4},
                   "eval": {"slice_people": 100}},
        "priors": {"task0_heldout": {"pooled": 0.05}},
        "summary": {"task0_start": t0[0], "task0_min": min(t0), "task0_end": t0[-1], "task1_start": t1[0],
                    "task1_end": t1[-1]},
        "final": {"task0_heldout": {"acc": t0[-1] - 0.01}, "task1": {"acc": t1[-1] - 0.01}},
    }
    (d / "result.json").write_text(json.dumps(result))
    return d


def test_bio_figure_and_table(tmp_path):
    res = tmp_path / "results"
    fake_bio_run(res, "fft")
    fake_bio_run(res, "scale-route", t0=(0.9, 0.85, 0.8))
    fake_bio_run(res, "fft", t0=(0.9, 0.1, 0.1), date="2026-11-22T00:00:00", tag="newer")
    out = tmp_path / "figs"
    r = runner.invoke(app, ["plot", "--results", str(res), "--out", str(out)])
    assert r.exit_code == 0, r.output
    for name in ("fig8_bio_cpu.png", "fig8_bio_cpu.pdf", "table_bio.csv", "table_bio.md", "table_bio.tex"):
        assert (out / name).stat().st_size > 0, name
    table = pd.read_csv(out / "table_bio.csv")
    assert list(table["method"]) == ["fft", "scale-route"]  # method order; one row per method (newest run)
    fft = table.set_index("method").loc["fft"]
    assert fft["task0_min"] == pytest.approx(0.1) and fft["task0_end"] == pytest.approx(0.1)
    route = table.set_index("method").loc["scale-route"]
    assert route["task0_min"] == pytest.approx(0.8) and route["task1_full_end"] == pytest.approx(0.89)
    assert "| scale-route |" in (out / "table_bio.md").read_text().replace("  ", " ")


def test_load_runs_ignores_other_experiments(tmp_path):
    fake_bio_run(tmp_path, "fft")
    other = tmp_path / "cpt" / "x"
    other.mkdir(parents=True)
    (other / "result.json").write_text(json.dumps({"experiment": "cpt", "preset": "cpu", "method": "fft"}))
    assert list(load_runs(tmp_path, "bio")["method"]) == ["fft"]
    assert len(bio_table(tmp_path)) == 1


def test_plot_errors(tmp_path):
    r = runner.invoke(app, ["plot", "--results", str(tmp_path / "none")])
    assert r.exit_code == 2 and "does not exist" in r.output
    r = runner.invoke(app, ["plot", "--results", str(tmp_path), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "no finished runs" in r.output
