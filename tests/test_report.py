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


def fake_cpt_run(root, method, opts=None, old=(10.0, 12.0, 11.0), new=(50.0, 20.0, 15.0), tag="x"):
    d = root / f"cpu-{method}-{tag}"
    d.mkdir(parents=True)
    lines = [{"step": s, "old/ppl": o, "new/ppl": n, "rep_cos": 1.0 - 0.01 * i, "up_norm": 1.0 + i}
             for i, (s, o, n) in enumerate(zip((0, 10, 20), old, new, strict=True))]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = {
        "experiment": "cpt", "preset": "cpu", "method": method, "method_options": opts or {}, "lr": 1e-3,
        "trainable_params": 5, "provenance": {"date": "2026-11-21"}, "base": {"source": "builtin"},
        "data": {"train": "builtin:ko"}, "config": {"train": {"steps": 20, "batch": 8, "seq_len": 64}},
        "summary": {"old_ppl_start": old[0], "old_ppl_end": old[-1], "old_ppl_max": max(old),
                    "new_ppl_start": new[0], "new_ppl_end": new[-1], "rep_cos_end": 0.98},
        "final": lines[-1],
    }
    (d / "result.json").write_text(json.dumps(result))


def test_cpt_figures_studies_and_table2(tmp_path):
    res = tmp_path / "results"
    for m in ("fft", "llama-pro", "scale-preserve", "scale-adapt", "scale-route"):
        fake_cpt_run(res / "cpt", m, {"l_fp": 2} if m == "scale-adapt" else {})
    for i, init in enumerate((["zero", "rnd"], ["rnd", "zero"], ["svd", "zero"])):
        fake_cpt_run(res / "studies" / "init", "scale-preserve", {"init": init}, tag=str(i))
    for lfp in (3, 0, 1):
        fake_cpt_run(res / "studies" / "l_fp", "scale-adapt", {"l_fp": lfp}, old=(10, 10 + lfp, 30 - lfp), tag=str(lfp))
    for c in ("attn", "mlp"):
        fake_cpt_run(res / "studies" / "collab", "scale-adapt", {"l_fp": 2, "collab": [c]}, tag=c)
    h = res / "harness" / "route-abc"
    h.mkdir(parents=True)
    (h / "run.json").write_text(json.dumps({"model": "/x/route", "method": "scale-route", "scores": [
        {"task": "kobest_boolq", "score": 60.0}, {"task": "korean_avg", "score": 55.0}]}))
    out = tmp_path / "figs"
    r = runner.invoke(app, ["plot", "--results", str(res), "--out", str(out)])
    assert r.exit_code == 0, r.output
    for stem in ("fig9_cpt_cpu", "fig4_width_vs_depth_cpu", "fig5_init_pairs", "fig6_l_fp", "fig7_collab_modules"):
        for ext in ("png", "pdf"):
            assert (out / f"{stem}.{ext}").stat().st_size > 0, stem
    cpt = pd.read_csv(out / "table_cpt.csv")
    assert sorted(cpt["method"]) == sorted(["fft", "llama-pro", "scale-preserve", "scale-adapt", "scale-route"])
    assert cpt["old_ppl_end"].tolist() == [11.0] * 5  # study runs stay out of the main table
    lfp = pd.read_csv(out / "table_fig6_l_fp.csv")
    assert lfp["l_fp"].tolist() == [0, 1, 3] and lfp["old_ppl_end"].tolist() == [30, 29, 27]
    assert pd.read_csv(out / "table_fig5_init.csv")["setting"].tolist() == ["0,RND", "RND,0", "SVD,0"]
    assert sorted(pd.read_csv(out / "table_fig7_collab.csv")["setting"]) == ["attn", "mlp"]
    t2 = pd.read_csv(out / "table2_harness.csv")
    row = t2.set_index("method").loc["scale-route"]
    assert row["kobest_boolq"] == 60.0 and row["korean_avg"] == 55.0
    assert row["paper_korean_avg"] == 55.50 and row["paper_english_avg"] == 46.49
