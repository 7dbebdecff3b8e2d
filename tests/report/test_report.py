"""Figures and tables are pure functions of small synthetic results files (no training)."""

from __future__ import annotations

import json

import matplotlib.colors
import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.colors import to_rgb
from typer.testing import CliRunner

import scalecl.report.draw as draw
from scalecl.cli import app
from scalecl.experiments.reports import BIO_REPORT, CPT_REPORT
from scalecl.methods.base import METHOD_ORDER
from scalecl.report import (
    Plot,
    draw_fig4,
    draw_fig5,
    draw_fig6,
    draw_fig7,
    draw_fig8,
    draw_fig9,
    draw_lr_schedule,
    draw_route_study,
    draw_router_score,
    draw_routing,
    draw_train_loss,
    load_runs,
    summary_table,
)
from scalecl.training.record import base_identity
from tests.report.fake_runs import write_result

runner = CliRunner()
SPECS = [BIO_REPORT, CPT_REPORT]  # what `scalecl plot` reports


def each_spec(draw, results):
    """A draw_* function's figures for every experiment, as `scalecl plot` makes them."""
    plot = Plot.of(results)
    return [pair for spec in SPECS for pair in draw(plot, spec)]


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
    write_result(d, result)
    return d


def test_bio_figure_and_table(tmp_path, all_figure_formats):
    """`scalecl plot` with its default formats: PNG and PDF (the PDF the same bytes when drawn again)."""
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
    # drawn again from the same runs, the PDF is the same bytes (no creation date in it)
    first = (out / "fig8_bio_cpu.pdf").read_bytes()
    assert b"CreationDate" not in first
    r = runner.invoke(app, ["plot", "--results", str(res), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "fig8_bio_cpu.pdf").read_bytes() == first


def test_plot_formats_and_dpi(tmp_path):
    """`--formats` and `--dpi`: the figures in the formats asked for alone (an earlier plot's figures of another
    format removed, as outputs these results no longer give), PNGs at the resolution asked for; tables unchanged."""
    from matplotlib.image import imread

    res, out = tmp_path / "results", tmp_path / "figs"
    fake_bio_run(res, "fft")
    sizes = {}
    for dpi in (150, 50):
        r = runner.invoke(app, ["plot", "--results", str(res), "--out", str(out), "--formats", "png,pdf", "--dpi",
                                str(dpi)])
        assert r.exit_code == 0, r.output
        sizes[dpi] = imread(out / "fig8_bio_cpu.png").shape[:2]
    assert (out / "fig8_bio_cpu.pdf").is_file() and (out / "table_bio.csv").is_file()
    # a third of the pixels per side (150 / 50 dpi), within the text's rounding at a low resolution (measured 5%)
    assert all(abs(a / (3 * b) - 1) < 0.1 for a, b in zip(sizes[150], sizes[50], strict=True)), sizes
    table = (out / "table_bio.csv").read_text()
    r = runner.invoke(app, ["plot", "--results", str(res), "--out", str(out), "--formats", "SVG, png"])
    assert r.exit_code == 0, r.output
    assert f"removed {out / 'fig8_bio_cpu.pdf'}" in r.output.replace("\n", "")
    names = {p.name for p in out.iterdir()}
    assert {"fig8_bio_cpu.svg", "fig8_bio_cpu.png"} <= names and not any(n.endswith(".pdf") for n in names)
    assert (out / "table_bio.csv").read_text() == table
    assert b"<dc:date>" not in (out / "fig8_bio_cpu.svg").read_bytes()  # drawn again: the same bytes


def test_load_runs_ignores_other_experiments(tmp_path):
    fake_bio_run(tmp_path, "fft")
    other = tmp_path / "cpt" / "x"
    other.mkdir(parents=True)
    write_result(other, {"experiment": "cpt", "preset": "cpu", "method": "fft"})
    assert list(load_runs(Plot.of(tmp_path), BIO_REPORT)["method"]) == ["fft"]
    assert len(summary_table(Plot.of(tmp_path), BIO_REPORT)) == 1


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
    write_result(d, result)
    return d


def build_cpt_results(res):
    """Main cpt runs, the three cpt studies (init, l_fp, collab) and one harness result."""
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


def test_cpt_figures_studies_and_table2(tmp_path):
    res = tmp_path / "results"
    build_cpt_results(res)
    out = tmp_path / "figs"
    r = runner.invoke(app, ["plot", "--results", str(res), "--out", str(out)])
    assert r.exit_code == 0, r.output
    for stem in ("fig9_cpt_cpu", "fig4_width_vs_depth_cpu", "fig5_init_pairs", "fig6_l_fp", "fig7_collab_modules"):
        for ext in draw.FIGURE_FORMATS:  # those in force (tests: PNG; the defaults: test_bio_figure_and_table)
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



# ---------------------------------------------------------------------------------------------------------
# training logs, routing, and the biography Route studies (issues #12, #13)

STEPS = (0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50)
SCORES = (("mean", 0.85), ("q05", 0.6), ("q25", 0.8), ("q50", 0.9), ("q75", 0.95), ("q95", 0.99))


def fake_log(d, steps=50, lr=1e-3, loss0=3.0):
    """A train_log.jsonl as the run layer writes it: one row per step, a noisy falling loss."""
    rows = [{"step": s, "loss": loss0 / s * (1 + 0.3 * (-1) ** s), "lr": lr * (1 - s / (2 * steps)),
             "grad_norm": 1.0, "tokens": 64, "seconds": 0.01, "tokens_per_s": 6400.0}
            for s in range(1, steps + 1)]
    (d / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def fake_route_bio_run(root, preset="cpu", opts=None, older=False, vocab=None, tag="r", end0=0.5,
                       config_vocab=0):
    """A bio Route run with every key the current code writes (older=True: an older run, which has neither
    train_log.jsonl nor answer-position keys). Answer routing ends at half of Task 0's end accuracy."""
    d = root / f"{preset}-scale-route-{tag}"
    log, answers, answer_end = not older, not older, end0 / 2
    d.mkdir(parents=True)
    lines = []
    for i, s in enumerate(STEPS):
        f = i / (len(STEPS) - 1)
        rec = {"step": s, "loss": None if s == 0 else 1.0, "task0/acc": 0.9 - (0.9 - end0) * f,
               "task1/acc": 0.05 + 0.9 * f}
        for t, k in (("task0", 0.5), ("task1", 0.7)):
            rec |= {f"{t}/route_preserve": 1 - k * f, f"{t}/route_adapt": k * f}
        rec |= {"route_preserve": rec["task0/route_preserve"], "route_adapt": rec["task0/route_adapt"]}
        if answers:
            for t, k in (("task0", 0.0), ("task1", 0.05)):
                rec[f"{t}/answer/route_preserve"] = 1 - (1 - answer_end) * f - k * f
                rec |= {f"{t}/answer/route_score/{q}": v - (0.5 + k) * f for q, v in SCORES}
        lines.append(rec)
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    if log:
        fake_log(d)
    result = {
        "experiment": "bio", "preset": preset, "method": "scale-route",
        "method_options": opts or {"tau": 0.9}, "trainable_params": 10, "lr": 1e-3,
        "provenance": {"date": "2026-11-21T00:00:00"},
        "data": {"n_bio": 1000, "n_task1": 200},
        "config": {"model": {"hidden": 128, "layers": 4, "vocab": config_vocab},
                   "stage3": {"steps": 50, "batch": 32, "lr": 1e-4}, "eval": {"slice_people": 100}},
        "priors": {"task0_heldout": {"pooled": 0.05}},
        "summary": {"task0_start": 0.9, "task0_min": end0, "task0_end": end0, "task1_start": 0.05,
                    "task1_end": 0.95},
        "final": {"task0_heldout": {"acc": end0 - 0.01}, "task1": {"acc": 0.94}},
    }
    if vocab:
        result["vocab"] = {"tokenizer": vocab[0], "model": vocab[1]}
    write_result(d, result)
    return d


def fake_cpt_route_run(root):
    """A cpt Route run with old/new-domain routing fractions and a training log."""
    d = root / "cpt" / "cpu-scale-route-new"
    d.mkdir(parents=True)
    lines = [{"step": s, "old/ppl": 10 + i, "new/ppl": 50 - i, "rep_cos": 1.0, "up_norm": 1.0,
              "old/route_preserve": 1 - 0.1 * i, "old/route_adapt": 0.1 * i,
              "new/route_preserve": 1 - 0.2 * i, "new/route_adapt": 0.2 * i}
             for i, s in enumerate((0, 10, 20))]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    fake_log(d, steps=20)
    result = {
        "experiment": "cpt", "preset": "cpu", "method": "scale-route", "method_options": {"tau": 0.9},
        "lr": 1e-3, "trainable_params": 5, "provenance": {"date": "2026-11-21"},
        "base": {"source": "builtin"},
        "data": {"train": "builtin:ko"}, "config": {"train": {"steps": 20, "batch": 8, "seq_len": 64}},
        "summary": {"old_ppl_start": 10, "old_ppl_end": 12, "old_ppl_max": 12, "new_ppl_start": 50,
                    "new_ppl_end": 48, "rep_cos_end": 1.0},
        "final": lines[-1],
    }
    write_result(d, result)


def build_route_results(tmp_path):
    """Two results folders: new-style runs (train logs, answer keys) and older ones (neither), read second: their
    labels say '(yours)' (scalecl.report.runs.marked)."""
    new, old = tmp_path / "runs", tmp_path / "results"
    fake_route_bio_run(new / "bio", tag="new")
    fft = fake_bio_run(new, "fft")
    fake_log(fft, lr=1e-4)
    fake_bio_run(new, "lora")  # no train_log.jsonl: left out of the loss figure, named in its caption
    fake_route_bio_run(old / "bio", preset="old", older=True, tag="old")
    fake_cpt_route_run(new)
    tau = new / "studies" / "tau"
    for t, end in ((0.99, 0.8), (-1, 0.2), (0.5, 0.4)):
        fake_route_bio_run(tau, opts={"tau": t}, tag=f"t{t}", end0=end)
    fake_route_bio_run(old / "studies" / "tau", opts={"tau": 0.9}, older=True, tag="t0.9")
    fake_route_bio_run(new / "studies" / "router", opts={"tau": 0.9, "router": "prob"}, tag="prob")
    fake_route_bio_run(old / "studies" / "router", opts={"tau": 0.9}, older=True, tag="logit")
    fake_route_bio_run(new / "studies" / "router", opts={"tau": 0.9, "router": "centered"}, vocab=(1045, 50304),
                       config_vocab=50304, tag="centered50k")  # the sweep repeated on a padded vocabulary
    fake_route_bio_run(new / "studies" / "vocab", vocab=(1045, 50304), config_vocab=50304, tag="v50304")
    fake_route_bio_run(new / "studies" / "vocab", vocab=(1045, 1045), tag="v0")
    ref = fake_bio_run(new / "studies" / "vocab", "fft", tag="v50304")  # an FFT reference beside the Route runs
    r = json.loads((ref / "result.json").read_text())
    r["vocab"], r["config"]["model"]["vocab"] = {"tokenizer": 1045, "model": 50304}, 50304
    write_result(ref, r)
    return [new, old]


# build_route_results' main bio runs differ in config (FFT/LoRA: 10 steps, no model.vocab; Route: 50 steps,
# model.vocab=0, its default, which groups as the key's absence): separate replicate groups, each labelled with
# what tells it from the others
FFT_CPU = "FFT [10 stage-3 steps]"
ROUTE_CPU = "SCALE-Route [50 stage-3 steps]"

NEW_FIGURES = ("train_loss_bio_cpu", "lr_schedule_bio_cpu", "train_loss_cpt_cpu", "lr_schedule_cpt_cpu",
               "routing_bio_cpu", "routing_bio_old", "routing_cpt_cpu", "router_score_bio_cpu",
               "train_loss_study_tau", "routing_study_tau", "router_score_study_tau", "routing_study_router",
               "router_score_study_vocab", "fig8_route_tau", "fig8_route_router", "fig8_route_vocab")


@pytest.mark.slow
def test_route_figures_and_tables(tmp_path):
    roots = build_route_results(tmp_path)
    out = tmp_path / "figs"
    args = [a for root in roots for a in ("--results", str(root))]
    args += ["--results", str(roots[0] / "studies")]  # a folder inside another: its runs count once
    r = runner.invoke(app, ["plot", *args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    for stem in NEW_FIGURES:
        for ext in draw.FIGURE_FORMATS:  # those in force (tests: PNG; the defaults: test_bio_figure_and_table)
            assert (out / f"{stem}.{ext}").stat().st_size > 0, stem
    # what older runs lack is skipped, not drawn empty
    for stem in ("train_loss_bio_old", "router_score_bio_old", "lr_schedule_study_tau"):
        assert not (out / f"{stem}.png").exists(), stem
    tau = pd.read_csv(out / "table_fig8_route_tau.csv")
    assert tau["tau"].tolist() == [-1, 0.5, 0.9, 0.99] and tau["setting"].iloc[0] == "tau=-1"
    assert tau["task0_end"].tolist() == pytest.approx([0.2, 0.4, 0.5, 0.8])
    assert tau["task0_answer_preserve_end"].tolist()[:2] == pytest.approx([0.1, 0.2])
    # steps 5 and 10 of 50 are the first 20% (step 0 is before training): 1 - (1 - end) * f at f = 0.1, 0.2
    assert tau["task0_answer_preserve_first20"].iloc[0] == pytest.approx(1 - 0.9 * 0.15)
    assert tau["task1_answer_preserve_end"].iloc[0] == pytest.approx(0.1 - 0.05)
    assert "router" not in tau and "vocab_model" not in tau  # neither swept nor recorded here
    old = tau.set_index("tau").loc[0.9]  # the older run: no answer-position keys, empty cells
    assert pd.isna(old["task0_answer_preserve_end"]) and pd.isna(old["task1_answer_preserve_first20"])
    assert old["task0_full_end"] == pytest.approx(0.49) and old["steps"] == 50
    for ext in ("md", "tex"):
        text = (out / f"table_fig8_route_tau.{ext}").read_text()
        assert "tau=0.99" in text and "nan" not in text.lower()  # not recorded: a blank cell
    router = pd.read_csv(out / "table_fig8_route_router.csv")
    assert router["router"].tolist() == ["logit", "prob", "centered"]  # an older run without the key: logits
    assert router["setting"].tolist()[1:] == ["router=prob", "router=centered, vocab 50,304"]
    vocab = pd.read_csv(out / "table_fig8_route_vocab.csv")
    assert vocab["vocab_model"].tolist() == [1045, 50304, 50304] and vocab["vocab_tokenizer"].tolist() == [1045] * 3
    assert vocab["setting"].tolist() == ["vocab=tokenizer's size", "vocab=50,304 (padded)",
                                         "FFT, vocab=50,304 (padded)"]
    assert vocab["method"].tolist()[-1] == "fft" and pd.isna(vocab["task0_answer_preserve_end"].iloc[-1])
    assert len(pd.read_csv(out / "table_bio.csv").query("method == 'fft'")) == 1  # the study's FFT stays out


def test_route_figures_pure_and_tolerant(tmp_path, monkeypatch):
    """Each figure function alone: empty folders give nothing, runs missing files are skipped, not fatal."""
    from scalecl.report import (
        fig_lr_schedule,
        fig_route_studies,
        fig_router_score,
        fig_routing,
        fig_train_loss,
        load_train_log,
        plot_all,
        route_study_table,
    )

    empty = tmp_path / "empty"
    empty.mkdir()
    for spec in SPECS:
        for fig in (fig_train_loss, fig_lr_schedule, fig_routing, fig_router_score, fig_route_studies):
            assert fig(Plot.of(empty, tmp_path / "o"), spec) == []
    assert route_study_table(Plot.of(empty), BIO_REPORT, "tau").empty
    study = tmp_path / "res" / "studies" / "tau"
    d = fake_route_bio_run(study, older=True)
    (d / "train_log.jsonl").write_text("")  # a run that trained no step writes an empty log
    assert load_train_log(Plot.of(study), d) is None
    (fake_route_bio_run(study, opts={"tau": 0.5}, tag="nometrics") / "metrics.jsonl").unlink()
    import scalecl.report.draw as draw

    panels, save = {}, draw.save_figure
    monkeypatch.setattr(draw, "save_figure", lambda plot, fig, stem: panels.setdefault(stem, len(fig.axes))
                        and save(plot, fig, stem))
    names = {p.name for p in plot_all(tmp_path / "res", tmp_path / "o", SPECS).written}
    assert panels["fig8_route_tau"] == 3  # no answer-position records: panel (c) shows all-token routing
    assert {"fig8_route_tau.png", "routing_study_tau.png", "train_loss_study_tau.png",
            "table_fig8_route_tau.csv"} <= names
    assert "router_score_study_tau.png" not in names  # no run recorded the router's score
    table = pd.read_csv(tmp_path / "o" / "table_fig8_route_tau.csv")
    assert len(table) == 2 and table["task0_answer_preserve_end"].isna().all()


# ---------------------------------------------------------------------------------------------------------
# What each figure draws: its panels, titles, axis labels, line labels and the values behind every line


@pytest.fixture
def drawn():
    """Collect a draw_* function's (stem, Figure) pairs as a dict; every figure is closed after the test."""
    figs = []

    def collect(pairs) -> dict:
        pairs = list(pairs)
        figs.extend(fig for _, fig in pairs)
        stems = [stem for stem, _ in pairs]
        assert len(set(stems)) == len(stems), stems  # one file per figure
        return dict(pairs)

    yield collect
    for fig in figs:
        plt.close(fig)


def labels(ax) -> list[str]:
    """The labels of an axes' labelled lines (matplotlib names unlabelled ones '_child<n>')."""
    return [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")]


def texts(legend) -> list[str]:
    return [t.get_text() for t in legend.get_texts()]


def xs(line) -> list[float]:
    return [float(v) for v in line.get_xdata()]


def ys(line) -> list[float]:
    return [float(v) for v in line.get_ydata()]


def line(ax, label: str):
    (found,) = [ln for ln in ax.get_lines() if ln.get_label() == label]
    return found


def caption(fig) -> str:
    return "\n".join(t.get_text() for t in fig.texts)


def test_fig8_draws_a_panel_per_method_with_its_accuracies(tmp_path, drawn):
    task0 = {"fft": (0.9, 0.1, 0.1), "lora": (0.9, 0.3, 0.2), "freeze": (0.8, 0.5, 0.4),
             "llama-pro": (0.9, 0.2, 0.25), "scale-route": (0.9, 0.85, 0.8)}
    for method in ("scale-route", "fft", "lora", "llama-pro", "freeze"):  # written out of method order
        fake_bio_run(tmp_path, method, t0=task0[method])
    figs = drawn(draw_fig8(Plot.of(tmp_path), BIO_REPORT))
    assert list(figs) == ["fig8_bio_cpu"]
    fig = figs["fig8_bio_cpu"]
    shown = [ax for ax in fig.axes if ax.axison]
    assert len(fig.axes) == 8 and len(shown) == 5  # a 2 x 4 grid: a panel per run, the other three off
    assert [ax.get_title() for ax in shown] == ["FFT", "LoRA", "Freeze", "LLaMA Pro", "SCALE-Route"]
    methods = [m for m in METHOD_ORDER if m in task0]
    for ax, method in zip(shown, methods, strict=True):
        assert labels(ax) == ["Task 0 (held-out)", "Task 1", "Task 0 chance floor"]
        assert xs(line(ax, "Task 0 (held-out)")) == [0, 5, 10]
        assert ys(line(ax, "Task 0 (held-out)")) == pytest.approx([100 * a for a in task0[method]])
        assert ys(line(ax, "Task 1")) == pytest.approx([0, 50, 90])
        assert ys(line(ax, "Task 0 chance floor")) == pytest.approx([5, 5])  # the pooled prior, 0.05
        assert ax.get_xlabel() == "Task 1 step"
    assert [ax.get_ylabel() for ax in fig.axes[::4]] == ["first-token acc. (%)"] * 2  # the first column
    assert texts(fig.legends[0]) == ["Task 0 (held-out)", "Task 1", "Task 0 chance floor"]
    assert "preset 'cpu': 1,000 people pre-trained" in caption(fig)


def test_fig9_and_fig4_draw_a_line_per_method_with_its_metrics(tmp_path, drawn):
    old = {"fft": (10.0, 14.0, 13.0), "llama-pro": (10.0, 12.0, 11.0), "scale-preserve": (10.0, 10.0, 10.0),
           "scale-adapt": (10.0, 11.0, 10.5), "scale-route": (10.0, 10.5, 10.2)}
    for method in ("scale-route", "scale-adapt", "fft", "scale-preserve", "llama-pro"):
        fake_cpt_run(tmp_path, method, {"l_fp": 2} if method == "scale-adapt" else {}, old=old[method])
    fig = drawn(draw_fig9(Plot.of(tmp_path), CPT_REPORT))["fig9_cpt_cpu"]
    assert len(fig.axes) == 2
    assert [ax.get_title() for ax in fig.axes] == ["(a) forgetting: old-domain perplexity",
                                                   "(b) learning: new-domain perplexity"]
    names = [f"{m} [lr=0.001]" for m in ("FFT", "LLaMA Pro", "SCALE-Preserve", "SCALE-Adapt", "SCALE-Route")]
    for ax, key in zip(fig.axes, ("old", "new"), strict=True):
        assert labels(ax) == names  # method order, each with its rate
        assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_yscale()) == ("training step", "perplexity (log scale)",
                                                                       "log")
        fft = line(ax, "FFT [lr=0.001]")  # drawn over the others, thick: methods close to it cannot hide it
        assert fft.get_zorder() > max(ln.get_zorder() for ln in ax.get_lines() if ln is not fft)
        assert fft.get_linewidth() > 2 and fft.get_marker() == "o"
        for ln, method in zip(ax.get_lines(), [m for m in METHOD_ORDER if m in old], strict=True):
            assert xs(ln) == [0, 10, 20]
            assert ys(ln) == pytest.approx(old[method] if key == "old" else (50.0, 20.0, 15.0))
    # one legend under the panels (inside the figure's width), none over the axes
    assert all(ax.get_legend() is None for ax in fig.axes) and texts(fig.legends[0]) == names

    fig = drawn(draw_fig4(Plot.of(tmp_path), CPT_REPORT))["fig4_width_vs_depth_cpu"]
    ax_cos, ax_ppl = fig.axes
    assert (ax_cos.get_title(), ax_ppl.get_title()) == ("(a) representation forgetting",
                                                        "(b) forgetting perplexity (old domain)")
    assert ax_cos.get_ylabel() == "cosine of final hidden states\n(step 0 vs now)"
    width_depth = ["Depth (LLaMA Pro) [lr=0.001]", "Width (Preserve) [lr=0.001]",
                   "Width (Adapt), l_fp=2 [lr=0.001]"]  # no FFT, no Route
    assert texts(fig.legends[0]) == width_depth
    for ax in (ax_cos, ax_ppl):
        assert labels(ax) == width_depth and ax.get_legend() is None  # no legend over the lines
        assert ax.get_xlabel() == "training step"
    for ln in ax_cos.get_lines():
        assert ys(ln) == pytest.approx([1.0, 0.99, 0.98])  # the run's rep_cos
    assert [ys(ln) for ln in ax_ppl.get_lines()] == [
        pytest.approx(old[m]) for m in ("llama-pro", "scale-preserve", "scale-adapt")]


def test_fig9_and_fig4_colour_the_method_and_style_the_rate(tmp_path, drawn):
    """Three rates of one method are told apart: one colour per method, one line style per rate (lowest solid),
    and the legend names both."""
    from scalecl.report.draw import COLORS

    rates = {"fft": (3e-5, 1e-4, 3e-4), "scale-adapt": (1e-3, 3e-4), "llama-pro": (1e-3,)}
    for method, lrs in rates.items():
        for lr in lrs:
            d = fake_cpt_run(tmp_path, method, {"l_fp": 2} if method == "scale-adapt" else {}, tag=f"{lr:g}")
            r = json.loads((d / "result.json").read_text())
            r["lr"] = lr
            write_result(d, r)
    fig = drawn(draw_fig9(Plot.of(tmp_path), CPT_REPORT))["fig9_cpt_cpu"]
    want = {"FFT [lr=3e-05]": ("fft", "-"), "FFT [lr=0.0001]": ("fft", "--"), "FFT [lr=0.0003]": ("fft", "-."),
            "LLaMA Pro [lr=0.001]": ("llama-pro", "-"), "SCALE-Adapt [lr=0.0003]": ("scale-adapt", "-"),
            "SCALE-Adapt [lr=0.001]": ("scale-adapt", "--")}
    for ax in fig.axes:
        assert sorted(labels(ax)) == sorted(want)
        for name, (method, ls) in want.items():
            assert (to_rgb(line(ax, name).get_color()), line(ax, name).get_linestyle()) == (to_rgb(COLORS[method]),
                                                                                          ls), name
    assert sorted(texts(fig.legends[0])) == sorted(want)
    assert "line style: its learning rate" in caption(fig)

    fig = drawn(draw_fig4(Plot.of(tmp_path), CPT_REPORT))["fig4_width_vs_depth_cpu"]
    for ax in fig.axes:
        slow, fast = line(ax, "Width (Adapt), l_fp=2 [lr=0.0003]"), line(ax, "Width (Adapt), l_fp=2 [lr=0.001]")
        assert to_rgb(slow.get_color()) == to_rgb(fast.get_color()) == to_rgb(COLORS["scale-adapt"])
        assert (slow.get_linestyle(), fast.get_linestyle()) == ("-", "--")
        assert texts(fig.legends[0]) == labels(ax)
    assert "line style: its learning rate" in caption(fig)

    # Width (Adapt) with W12 in every layer (l_fp = 0, as the paper's Fig. 4, set apart from the preset's l_fp in
    # the run's per-method table) is its own line, in a shade of Adapt's colour; the preset's l_fp keeps the colour
    d = fake_cpt_run(tmp_path, "scale-adapt", {"l_fp": 0}, tag="every-layer")
    r = json.loads((d / "result.json").read_text())
    r["lr"], r["config"]["methods"] = 1e-3, {"scale-adapt": {"l_fp": 0}}
    write_result(d, r)
    fig = drawn(draw_fig4(Plot.of(tmp_path), CPT_REPORT))["fig4_width_vs_depth_cpu"]
    for ax in fig.axes:
        every, some = line(ax, "Width (Adapt), l_fp=0 [lr=0.001]"), line(ax, "Width (Adapt), l_fp=2 [lr=0.001]")
        assert to_rgb(some.get_color()) == to_rgb(COLORS["scale-adapt"]) != to_rgb(every.get_color())
        assert (every.get_linestyle(), some.get_linestyle()) == ("-", "--")  # its only rate; the second of l_fp=2's


def test_study_figures_draw_the_swept_settings(tmp_path, drawn):
    build_cpt_results(tmp_path)
    fig = drawn(draw_fig5(Plot.of(tmp_path), CPT_REPORT))["fig5_init_pairs"]
    assert [ax.get_title() for ax in fig.axes] == ["(a) forgetting PPL", "(b) learning PPL",
                                                   "(c) forgetting minus SVD,0's", "(d) learning minus SVD,0's"]
    for ax, values in zip(fig.axes, ((10.0, 12.0, 11.0), (50.0, 20.0, 15.0)), strict=False):
        assert labels(ax) == ["0,RND", "RND,0", "SVD,0"]  # (W21, W22) per run
        assert all(ys(ln) == pytest.approx(values) for ln in ax.get_lines())
    assert fig.legends[0].get_title().get_text().startswith("W21,W22")  # one legend for every panel
    assert caption(fig).startswith("scale-preserve; preset 'cpu'")

    fig = drawn(draw_fig6(Plot.of(tmp_path), CPT_REPORT))["fig6_l_fp"]
    old, new = (ax.containers[0].lines[0] for ax in fig.axes[:2])  # the means (one base: its own values)
    assert xs(old) == xs(new) == [0, 1, 3]  # sorted by l_fp
    assert ys(old) == [30, 29, 27] and ys(new) == [15, 15, 15]  # each run's end-of-training perplexity
    assert [ax.get_title() for ax in fig.axes] == [
        "(a) forgetting PPL at the end", "(b) learning PPL at the end",
        "(c) forgetting PPL minus l_fp=3's, same base", "(d) learning PPL minus l_fp=3's, same base"]
    diff = fig.axes[2].containers[0].lines[0]  # each l_fp minus the most preserving one, on the same base
    assert xs(diff) == [0, 1] and ys(diff) == [3, 2]
    for ax in fig.axes:
        assert ax.get_xlabel() == "l_fp (function-preserving lower layers)"
        assert list(ax.get_xticks()) == [0, 1, 3]

    fig = drawn(draw_fig7(Plot.of(tmp_path), CPT_REPORT))["fig7_collab_modules"]
    (ax,) = fig.axes
    assert labels(ax) == texts(ax.get_legend()) == ["W12 trains in attn", "W12 trains in mlp"]
    for ln in ax.get_lines():
        assert xs(ln) == [1.0, 2.0, 3.0] and ys(ln) == [10.0, 12.0, 11.0]  # up_norm against old/ppl
    assert ax.get_xlabel() == "average norm of upscaled weights (W12, W21, W22)"
    assert ax.get_ylabel() == "forgetting PPL (old domain)"
    assert caption(fig).startswith("scale-adapt, l_fp=2; preset 'cpu'")


def test_fig5_draws_the_paired_differences_per_base(tmp_path, drawn):
    """Bases far apart hide a pair's difference from (SVD,0) in base-to-base bands; fig5 draws the difference on
    each base (thin lines) and their mean with its t band over the base seeds (a base's run seeds averaged)."""
    init = tmp_path / "studies" / "init"
    diffs = {(0, 0): (0.0, 0.6, 1.6), (0, 1): (0.0, 1.0, 2.0), (1, 0): (0.0, 1.5, 2.5), (2, 0): (0.0, 2.0, 3.0)}
    for base in range(3):
        ref = (10.0 + 5 * base, 12.0 + 5 * base, 11.0 + 5 * base)
        _set_seeds(fake_cpt_run(init, "scale-preserve", {"init": ["svd", "zero"]}, old=ref, tag=f"ref{base}"), base)
        for (b, run), diff in diffs.items():
            if b == base:
                old = tuple(x + d for x, d in zip(ref, diff, strict=True))
                d = fake_cpt_run(init, "scale-preserve", {"init": ["zero", "rnd"]}, old=old, tag=f"z{b}{run}")
                _set_seeds(d, b, run)
    fig = drawn(draw_fig5(Plot.of(tmp_path), CPT_REPORT))["fig5_init_pairs"]
    ax_old_diff, ax_new_diff = fig.axes[2:]
    assert labels(ax_old_diff) == ["0,RND (t over 3 base seeds)"]
    mean = line(ax_old_diff, "0,RND (t over 3 base seeds)")
    per_base = [(0.0, 0.8, 1.8), (0.0, 1.5, 2.5), (0.0, 2.0, 3.0)]  # base 0: its two run seeds averaged
    assert ys(mean) == pytest.approx([sum(v) / 3 for v in zip(*per_base, strict=True)])
    thin = [ys(ln) for ln in ax_old_diff.get_lines() if ln.get_label().startswith("_") and len(ln.get_xdata()) == 3]
    assert sorted(thin) == [pytest.approx(list(v)) for v in per_base]
    (band,) = ax_old_diff.collections
    at_end = [v[-1] for v in per_base]
    sd = (sum((v - sum(at_end) / 3) ** 2 for v in at_end) / 2) ** 0.5
    assert max(band.get_paths()[0].vertices[:, 1]) == pytest.approx(sum(at_end) / 3 + 4.302653 * sd / 3**0.5)
    assert ys(line(ax_new_diff, "0,RND (t over 3 base seeds)")) == pytest.approx([0.0, 0.0, 0.0])
    assert "paired differences" in caption(fig) and "same base seed" in caption(fig)


def test_fig7_draws_the_band_of_a_setting_with_replicates(tmp_path, drawn):
    """A collab setting run on three bases: its mean line and the 95% t band over the base seeds, said so."""
    collab = tmp_path / "studies" / "collab"
    for base, old in enumerate(((10.0, 12.0, 11.0), (10.0, 14.0, 13.0), (10.0, 13.0, 12.0))):
        d = fake_cpt_run(collab, "scale-adapt", {"l_fp": 2, "collab": ["attn"]}, old=old, tag=f"attn{base}")
        _set_seeds(d, base)
    fake_cpt_run(collab, "scale-adapt", {"l_fp": 2, "collab": ["mlp"]}, tag="mlp")
    fig = drawn(draw_fig7(Plot.of(tmp_path), CPT_REPORT))["fig7_collab_modules"]
    (ax,) = fig.axes
    assert labels(ax) == ["W12 trains in attn (t over 3 base seeds)", "W12 trains in mlp"]
    attn = line(ax, "W12 trains in attn (t over 3 base seeds)")
    assert xs(attn) == [1.0, 2.0, 3.0] and ys(attn) == pytest.approx([10.0, 13.0, 12.0])
    (band,) = ax.collections  # the setting with replicates only
    assert band.get_facecolor()[0][:3] == pytest.approx(matplotlib.colors.to_rgb(attn.get_color()))
    h = 4.302653 / 3**0.5  # t_{0.975,2} x sd 1 / sqrt(3), at the last two steps
    assert max(band.get_paths()[0].vertices[:, 1]) == pytest.approx(13.0 + h, rel=1e-6)
    assert "shaded: the 95% Student-t interval of the forgetting PPL" in caption(fig)


def fake_loss(steps: int = 50, loss0: float = 3.0) -> list[float]:
    """The loss column fake_log writes."""
    return [loss0 / s * (1 + 0.3 * (-1) ** s) for s in range(1, steps + 1)]


def test_training_log_figures_draw_each_logged_run(tmp_path, drawn):
    roots = build_route_results(tmp_path)
    figs = drawn(each_spec(draw_train_loss, roots))
    assert list(figs) == ["train_loss_bio_cpu", "train_loss_study_router", "train_loss_study_tau",
                          "train_loss_study_vocab", "train_loss_cpt_cpu"]  # the older preset logged nothing
    (ax,) = figs["train_loss_bio_cpu"].axes
    assert labels(ax) == texts(ax.get_legend()) == [FFT_CPU, ROUTE_CPU]  # LoRA has no train_log.jsonl
    assert len(ax.get_lines()) == 4  # per run: the raw loss (faint) and its running mean (labelled)
    raw, smooth = ax.get_lines()[:2]
    assert xs(raw) == list(range(1, 51)) and ys(raw) == pytest.approx(fake_loss())
    assert ys(smooth) == pytest.approx(pd.Series(fake_loss()).rolling(5, center=True, min_periods=1).mean())
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("Task 1 step", "training loss (per step)")
    lora = "LoRA [10 stage-3 steps]"
    assert f"Not drawn (no train_log.jsonl; older runs): {lora}." in caption(figs["train_loss_bio_cpu"])
    (ax,) = figs["train_loss_study_tau"].axes
    assert labels(ax) == ["tau=-1", "tau=0.5", "tau=0.99"] and ax.get_legend().get_title().get_text() == "tau"
    assert "older runs): tau=0.9 (yours)." in caption(figs["train_loss_study_tau"])
    assert figs["train_loss_cpt_cpu"].axes[0].get_xlabel() == "training step"

    figs = drawn(each_spec(draw_lr_schedule, roots))
    assert list(figs) == ["lr_schedule_bio_cpu", "lr_schedule_cpt_cpu"]  # studies share the main schedule
    (ax,) = figs["lr_schedule_bio_cpu"].axes
    assert labels(ax) == [FFT_CPU, ROUTE_CPU] and ax.get_ylabel() == "learning rate"
    for ln, lr in zip(ax.get_lines(), (1e-4, 1e-3), strict=True):
        assert ys(ln) == pytest.approx([lr * (1 - s / 100) for s in range(1, 51)])
    assert [ln.get_linestyle() for ln in ax.get_lines()] == ["-", "--"] and ax.get_yscale() == "log"


ROUTES = ["preserve", "adapt"]


def test_routing_figure_draws_each_route_run_per_path(tmp_path, drawn):
    figs = drawn(each_spec(draw_routing, build_route_results(tmp_path)))
    assert list(figs) == ["routing_bio_cpu", "routing_bio_old", "routing_study_router", "routing_study_tau",
                          "routing_study_vocab", "routing_cpt_cpu"]
    f = [i / 10 for i in range(11)]
    all_tokens, answer = figs["routing_bio_cpu"].axes  # one Route run: a row of two panels
    assert (all_tokens.get_title(), answer.get_title()) == (f"{ROUTE_CPU}: all tokens", f"{ROUTE_CPU}: answer position")
    lines = [f"{task}, {path}" for task in ("Task 0 (held-out)", "Task 1") for path in ROUTES]
    assert labels(all_tokens) == labels(answer) == lines
    assert ys(line(all_tokens, "Task 1, adapt")) == pytest.approx([100 * 0.7 * x for x in f])
    assert ys(line(answer, "Task 0 (held-out), preserve")) == pytest.approx([100 * (1 - 0.75 * x) for x in f])
    assert ys(line(answer, "Task 0 (held-out), adapt")) == pytest.approx([100 * 0.75 * x for x in f])
    assert xs(line(answer, "Task 1, adapt")) == list(STEPS)
    assert all_tokens.get_ylabel() == "tokens routed (%)" and answer.get_xlabel() == "Task 1 step"
    assert len(figs["routing_bio_old"].axes) == 1  # an older run: no answer-position panel
    tau = figs["routing_study_tau"].axes
    assert [ax.get_title() for ax in tau[::2]] == [f"tau={t}: all tokens" for t in ("-1", "0.5", "0.9 (yours)", "0.99")]
    assert not tau[5].get_lines() and "no answer-position record" in tau[5].texts[0].get_text()
    (cpt,) = figs["routing_cpt_cpu"].axes
    assert cpt.get_title() == "SCALE-Route" and cpt.get_xlabel() == "training step"
    assert labels(cpt) == [f"{d} domain, {path}" for d in ("old", "new") for path in ROUTES]
    assert ys(line(cpt, "old domain, preserve")) == pytest.approx([100, 90, 80])
    assert texts(figs["routing_cpt_cpu"].legends[0]) == labels(cpt)


def test_router_score_figure_draws_median_mean_and_tau(tmp_path, drawn):
    figs = drawn(draw_router_score(Plot.of(build_route_results(tmp_path)), BIO_REPORT))
    assert list(figs) == ["router_score_bio_cpu", "router_score_study_router", "router_score_study_tau",
                          "router_score_study_vocab"]  # runs without the score (older ones) draw nothing
    fig = figs["router_score_bio_cpu"]
    assert [ax.get_title() for ax in fig.axes] == [f"{ROUTE_CPU}: Task 0 (held-out)", f"{ROUTE_CPU}: Task 1"]
    f = [i / 10 for i in range(11)]
    for ax, k in zip(fig.axes, (0.0, 0.05), strict=True):
        tau, median, mean = ax.get_lines()
        assert ys(tau) == [0.9, 0.9]
        assert ys(median) == pytest.approx([0.9 - (0.5 + k) * x for x in f])
        assert ys(mean) == pytest.approx([0.85 - (0.5 + k) * x for x in f])
        assert len(ax.collections) == 2  # the q05-q95 and q25-q75 bands
    assert fig.axes[0].get_ylabel() == "router cosine"
    assert texts(fig.legends[0]) == ["median", "q25-q75", "q05-q95", "mean", "tau (preserve above)"]
    tau = figs["router_score_study_tau"].axes
    assert [ax.get_title() for ax in tau[::2]] == ["tau=-1: Task 0 (held-out)", "tau=0.5: Task 0 (held-out)",
                                                   "tau=0.99: Task 0 (held-out)"]
    assert [ys(ax.get_lines()[0])[0] for ax in tau[::2]] == [-1, 0.5, 0.99]  # each row its own tau
    assert "older runs): tau=0.9 (yours)." in caption(figs["router_score_study_tau"])


def test_route_study_figure_draws_a_line_per_setting(tmp_path, drawn):
    roots = build_route_results(tmp_path)
    fig = drawn(draw_route_study(Plot.of(roots), BIO_REPORT, "tau"))["fig8_route_tau"]
    acc0, acc1, routed = fig.axes
    assert [ax.get_title() for ax in fig.axes] == ["(a) Task 0 (held-out) accuracy", "(b) Task 1 accuracy",
                                                   "(c) routed to preserve at the answer position"]
    settings = ["tau=-1", "tau=0.5", "tau=0.9 (yours)", "tau=0.99"]  # tau=0.9: from the second results folder
    assert labels(acc0) == [*settings, "Task 0 chance floor"] and labels(acc1) == settings
    f = [i / 10 for i in range(11)]
    for setting, end in zip(settings, (0.2, 0.4, 0.5, 0.8), strict=True):
        assert ys(line(acc0, setting)) == pytest.approx([100 * (0.9 - (0.9 - end) * x) for x in f])
        assert ys(line(acc1, setting)) == pytest.approx([100 * (0.05 + 0.9 * x) for x in f])
    assert len(routed.get_lines()) == 3 * 2 + 2  # Task 0 and 1 per run with answer records, 2 legend keys
    assert labels(routed) == ["Task 0 slice", "Task 1 slice"] and routed.get_ylabel() == "answer positions (%)"
    assert ys(routed.get_lines()[0]) == pytest.approx([100 * (1 - 0.9 * x) for x in f])  # tau=-1, Task 0
    assert [ax.get_xlabel() for ax in fig.axes] == ["Task 1 step"] * 3
    assert texts(fig.legends[0]) == [*settings, "Task 0 chance floor", "Task 0 slice", "Task 1 slice"]
    fig = drawn(draw_route_study(Plot.of(roots), BIO_REPORT, "vocab"))["fig8_route_vocab"]
    vocab = ["vocab=tokenizer's size", "vocab=50,304 (padded)", "FFT, vocab=50,304 (padded)"]
    assert labels(fig.axes[0])[:3] == vocab
    assert [line(fig.axes[0], v).get_linestyle() for v in vocab] == ["-", "-", "--"]  # a reference run: dashed
    assert ys(line(fig.axes[0], vocab[2])) == pytest.approx([90, 20, 30])


@pytest.mark.parametrize("key, value, said", [
    ("provenance", "2026-11-21", "'provenance' is a string, not an object"),
    ("provenance", None, "'provenance' is null, not an object"),
    ("provenance", {"date": 20261121}, "'provenance.date' is an integer, not a string"),
    ("method_options", ["rank", 8], "'method_options' is a list, not an object"),
    ("summary", {"task0_start": 0.9, "task0_min": 0.2, "task0_end": "0.99", "task1_end": 0.9},
     "'summary.task0_end' is a string, not a number"),
    ("lr", True, "'lr' is true or false, not a number"),
])
def test_plot_skips_a_result_holding_a_key_of_another_type(tmp_path, key, value, said):
    """Every key plot reads is checked for its type, as the training reader checks the keys every result has: a
    result edited to hold another is skipped with one line naming the file and the key, and the other runs are
    drawn (before: an AttributeError traceback for a text `provenance`, a text accuracy drawn as a number)."""
    fake_bio_run(tmp_path / "res", "fft")
    d = fake_bio_run(tmp_path / "res", "lora")
    write_result(d, {**json.loads((d / "result.json").read_text()), key: value})
    res = runner.invoke(app, ["plot", "--results", str(tmp_path / "res"), "--out", str(tmp_path / "figs")])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    skipped = [ln for ln in res.stderr.splitlines() if ln.startswith("skipped:")]
    assert len(skipped) == 1 and f"{d / 'result.json'}: {said}" in skipped[0], res.stderr
    assert pd.read_csv(tmp_path / "figs" / "table_bio.csv")["method"].tolist() == ["fft"]


@pytest.mark.parametrize("log, bad", [("metrics.jsonl", '"task0/acc": NaN'), ("train_log.jsonl", '"lr": "x"'),
                                      ("metrics.jsonl", '"step": 1.5')])
def test_plot_skips_a_run_whose_log_holds_what_no_run_writes(tmp_path, log, bad):
    """NaN, text or a fractional step in a log is not something a run wrote: the run is skipped with one line
    naming the file and record, and the other runs are drawn (before: a traceback inside a figure)."""
    import shutil
    from pathlib import Path

    from typer.testing import CliRunner

    from scalecl.cli import app

    src = Path(__file__).resolve().parents[2] / "results" / "bio"
    for name in ("cpu-fft-03f5c2ac10", "cpu-lora-45f8c72949"):
        shutil.copytree(src / name, tmp_path / "res" / "bio" / name)
    path = tmp_path / "res" / "bio" / "cpu-lora-45f8c72949" / log
    lines = path.read_text().splitlines()
    key = bad.split(":")[0].strip('"')
    row = json.loads(lines[1])
    lines[1] = json.dumps({k: v for k, v in row.items() if k != key})[:-1] + ", " + bad + "}"
    path.write_text("\n".join(lines) + "\n")
    res = CliRunner().invoke(app, ["plot", "--results", str(tmp_path / "res"), "--out", str(tmp_path / "figs")])
    assert res.exit_code == 0, res.output
    skipped = [ln for ln in res.stderr.splitlines() if ln.startswith("skipped:")]
    assert len(skipped) == 1 and f"{log} (record 2)" in skipped[0], res.stderr
    assert (tmp_path / "figs" / "table_bio.csv").exists()


def _set_seeds(d, base, run=0):
    r = json.loads((d / "result.json").read_text())
    r["seeds"] = {"base": base, "run": run}
    write_result(d, r)


SEEDS_TEXT = "0/0, 1/0, 2/0"  # base/run seed per replicate


def test_study_replicates_are_pooled_in_figures_and_tables(tmp_path, drawn):
    """Runs of one study setting that differ only in their seeds are one line (their per-step mean, the 95% t
    band shaded) and one row of a `_means` table (n, mean, interval); per-run tables keep every run."""
    from scalecl.report import write_study_means

    res = tmp_path / "results"
    tau = res / "studies" / "tau"
    for seed, end in ((0, 0.2), (1, 0.4), (2, 0.3)):
        _set_seeds(fake_route_bio_run(tau, opts={"tau": -1}, tag=f"m1-s{seed}", end0=end), seed)
    _set_seeds(fake_route_bio_run(tau, opts={"tau": 0.9}, tag="t09", end0=0.5), 0)
    for tag, base, run, end in (("a", 0, 0, 0.2), ("b", 0, 1, 0.4), ("c", 1, 0, 0.9)):  # two axes: bases are units
        _set_seeds(fake_route_bio_run(tau, opts={"tau": 0.0}, tag=f"t0-{tag}", end0=end), base, run)
    fig = drawn(draw_route_study(Plot.of(res), BIO_REPORT, "tau"))["fig8_route_tau"]
    acc0 = fig.axes[0]
    assert labels(acc0)[:3] == ["tau=-1 (mean of 3 base seeds)", "tau=0 (mean of 2 base seeds)", "tau=0.9"]
    assert ys(line(acc0, "tau=-1 (mean of 3 base seeds)"))[-1] == pytest.approx(30.0)  # mean of 20, 40, 30 (%)
    assert ys(line(acc0, "tau=0 (mean of 2 base seeds)"))[-1] == pytest.approx(60.0)  # base 0's mean 30, base 1's 90
    assert len(acc0.collections) >= 1  # the band of the pooled setting
    written = write_study_means(Plot.of(res, tmp_path / "figs"), BIO_REPORT, "tau", "table_fig8_route_tau")
    table = pd.read_csv(next(p for p in written if p.suffix == ".csv"))
    row = table[table["setting"] == "tau=-1"].iloc[0]
    assert row["n"] == 3 and row["seeds"] == SEEDS_TEXT, row["seeds"]
    assert row["task0_end"] == pytest.approx(0.3) and row["task0_end_ci_lo"] < 0.3 < row["task0_end_ci_hi"]
    assert table[table["setting"] == "tau=0.9"].iloc[0]["n"] == 1

    l_fp = res / "studies" / "l_fp"
    for seed, last in ((0, 20.0), (1, 22.0)):
        _set_seeds(fake_cpt_run(l_fp, "scale-adapt", {"l_fp": 1}, old=(10, 11, last), tag=f"1-s{seed}"), seed)
    fake_cpt_run(l_fp, "scale-adapt", {"l_fp": 0}, old=(10, 11, 30.0), tag="0")
    fig = drawn(draw_fig6(Plot.of(res), CPT_REPORT))["fig6_l_fp"]
    old = fig.axes[0].containers[0].lines[0]
    assert xs(old) == [0, 1] and ys(old) == pytest.approx([30.0, 21.0])  # replicates pooled per l_fp
    assert "mean of up to 2 base seeds" in fig.axes[0].get_title()


# ---------------------------------------------------------------------------------------------------------
# The registry, the plot's result and the experiments as data


def test_an_output_name_is_registered_once():
    from scalecl.report import registry

    names = [o.name for o in registry.outputs()]
    assert len(set(names)) == len(names) and {"fig8", "summary", "frontier", "table2"} <= set(names)
    with pytest.raises(ValueError, match="registered twice"):
        registry.figure("fig8")(lambda plot, spec: [])
    assert [o.name for o in registry.outputs()] == names  # the refused one is not added


def test_a_spec_naming_an_unknown_output_is_refused(tmp_path):
    import dataclasses

    from scalecl.report import plot_all

    bad = dataclasses.replace(BIO_REPORT, outputs=("fig8", "no-such-figure"))
    with pytest.raises(ValueError, match="no-such-figure"):
        plot_all(tmp_path, tmp_path / "o", [bad])
    with pytest.raises(ValueError, match="share an experiment name"):
        plot_all(tmp_path, tmp_path / "o", [BIO_REPORT, BIO_REPORT])
    assert not (tmp_path / "o").exists()


def test_plot_result_and_an_experiment_known_only_by_its_spec(tmp_path):
    """plot_all returns what it wrote, removed and skipped; the report knows an experiment only from its spec:
    the biography's spec under another name reads that name's results and names its files after it."""
    import dataclasses

    from scalecl.report import PlotResult, plot_all

    res = tmp_path / "results"
    for method in ("fft", "scale-route"):
        d = fake_bio_run(res, method)
        r = json.loads((d / "result.json").read_text())
        write_result(d, {**r, "experiment": "bio2"})
    broken = fake_bio_run(res, "lora")
    (broken / "metrics.jsonl").write_text("{not json\n")
    out = tmp_path / "o"
    spec = dataclasses.replace(BIO_REPORT, name="bio2")
    got = plot_all(res, out, [spec, CPT_REPORT])
    assert isinstance(got, PlotResult) and got.removed == [] and got.skipped == {}  # the lora run is not bio2's
    names = {p.name for p in got.written}
    assert {"fig8_bio2_cpu.png", "table_bio2.csv", "paired_bio2.csv", "frontier_bio2.csv"} <= names
    assert not any("_bio_" in n or n.endswith("_bio.csv") for n in names)
    assert pd.read_csv(out / "table_bio2.csv")["method"].tolist() == ["fft", "scale-route"]
    again = plot_all(res, out, [BIO_REPORT])  # now the lora run alone, and its metrics are unreadable
    assert str(broken / "metrics.jsonl") in again.skipped
    assert out / "table_bio2.csv" in again.removed and not (out / "table_bio2.csv").exists()
    assert {p.name for p in again.written} >= {"table_bio.csv"}


def test_a_key_added_later_at_its_default_keeps_runs_in_one_replicate_group():
    """A run made after `data.text_unit` existed (at its default, "line") and one made before it are replicates;
    a run that set it otherwise is not."""
    from scalecl.report.runs import config_id

    old = {"experiment": "cpt", "preset": "cpu", "method": "fft", "lr": 1e-4, "method_options": {},
           "config": {"data": {"path": "x", "split": "train"}, "seed": 0}}
    new = {**old, "config": {"data": {"path": "x", "split": "train", "text_unit": "line"}, "seed": 1}}
    para = {**old, "config": {"data": {"path": "x", "split": "train", "text_unit": "paragraph"}, "seed": 0}}
    assert config_id(old, CPT_REPORT) == config_id(new, CPT_REPORT) != config_id(para, CPT_REPORT)


def test_a_cached_base_is_one_setting_wherever_its_cache_was():
    """Runs from one GGUF file dequantized into two caches (relative `cache/gguf/<sha>`, absolute elsewhere) are
    replicates and share a base for pairing; another file (another sha) or another model is neither. A pre-trained
    stand-in base pairs by its cache entry and its final loss."""
    from scalecl.report.runs import config_id

    sha = "b179c9523d0e6a0f"

    def run(base: str, seed: int) -> dict:
        return {"experiment": "cpt", "preset": "real", "method": "fft", "lr": 1e-4, "method_options": {},
                "config": {"base": base, "seed": 0, "run_seed": seed}, "base": {"source": base}}

    a, b = run(f"cache/gguf/{sha}", 0), run(f"/home/me/scalecl/cache/gguf/{sha}", 1)
    other, model = run("cache/gguf/0123456789abcdef", 0), run("HuggingFaceTB/SmolLM2-135M", 0)
    assert config_id(a, CPT_REPORT) == config_id(b, CPT_REPORT)
    assert config_id(a, CPT_REPORT, pair=True) == config_id(b, CPT_REPORT, pair=True)
    assert len({config_id(r, CPT_REPORT) for r in (a, other, model)}) == 3
    assert base_identity(a) == base_identity(b) == ("model", f"gguf:{sha}") != base_identity(other)
    assert base_identity(model) == ("model", "HuggingFaceTB/SmolLM2-135M")
    # a stand-in base train-cpt pre-trained: its cache entry and final loss, in whichever cache
    built = {"source": "cache/cpt/base-2ee50184a1", "final_loss": 0.8019}
    here, there = {"base": built}, {"base": built | {"source": "/tmp/other/cache/cpt/base-2ee50184a1"}}
    rebuilt = {"base": built | {"final_loss": 0.8023}}  # the same entry built again on another CPU type
    assert base_identity(here) == base_identity(there) == ("model", "cpt:base-2ee50184a1", 0.8019)
    assert base_identity(rebuilt) != base_identity(here)


def test_heldout_table_means_intervals_and_route_pairs_by_run_seed(tmp_path):
    """heldout_cpt: per method the base's and final models' whole-set perplexities at both lengths with a t
    interval over run seeds; paired_heldout_cpt: Route minus each other method per run seed. Runs without a
    final held-out evaluation add no row."""
    import math

    from scalecl.report.stats import t_interval

    res = tmp_path / "results"
    ends = {"fft": (40.0, 42.0, 47.0), "scale-route": (44.0, 44.5, 45.5)}
    for method, olds in ends.items():
        for seed, old in enumerate(olds):
            d = fake_cpt_run(res / "cpt", method, tag=f"s{seed}")
            r = json.loads((d / "result.json").read_text())
            at = {n: {"tokens": 100, "sequences": 2, "start": {"ppl": 45.9 + k}, "end": {"ppl": old + k}}
                  for k, n in enumerate(("128", "2048"))}
            r |= {"seeds": {"base": 0, "run": seed}, "config": r["config"] | {"seed": 0, "run_seed": seed},
                  "heldout": {"take": 0, "lengths": [128, 2048], "train_seq_len": 128,
                              "old": {"slice": "en", "documents": 9, "at": at},
                              "new": {"slice": "ko", "documents": 9, "at": {n: {**v, "end": {"ppl": 4.0}}
                                                                           for n, v in at.items()}}}}
            write_result(d, r)
    fake_cpt_run(res / "cpt", "lora", tag="plain")  # no heldout: in table_cpt only
    out = tmp_path / "figs"
    r = runner.invoke(app, ["plot", "--results", str(res), "--out", str(out)])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "heldout_cpt.csv").set_index("method")
    assert sorted(df.index) == ["fft", "scale-route"] and (df["n"] == 3).all()
    for method, olds in ends.items():
        for k, role in enumerate(("train", "context")):
            iv = t_interval(o + k for o in olds)
            row = df.loc[method]
            assert row[f"old_{role}_end"] == pytest.approx(iv.mean)
            assert (row[f"old_{role}_end_ci_lo"], row[f"old_{role}_end_ci_hi"]) == pytest.approx((iv.lo, iv.hi))
            assert row[f"old_{role}_start"] == pytest.approx(45.9 + k) and row[f"new_{role}_end"] == 4.0
        assert (df.loc[method, "train_len"], df.loc[method, "context_len"]) == (128, 2048)
        assert "run seeds of base 0" in df.loc[method, "interval"]
    paired = pd.read_csv(out / "paired_heldout_cpt.csv")
    row = paired[(paired["metric"] == "old_train_end") & paired["interval"].str.contains("run seeds")].iloc[0]
    diffs = [a - b for a, b in zip(ends["scale-route"], ends["fft"], strict=True)]
    iv = t_interval(diffs)
    assert row["b"] == "FFT" and (row["diff_mean"], row["diff_ci_lo"], row["diff_ci_hi"]) == pytest.approx(
        (iv.mean, iv.lo, iv.hi))
    assert not math.isnan(iv.lo) and "± " in (out / "heldout_cpt.md").read_text()


def test_route_only_options_neither_split_nor_label_other_methods(tmp_path):
    """tau and router are read by SCALE-Route alone: Adapt runs recorded under two default taus are one
    replicate group without a tau label; Route runs at two taus stay two groups, labelled by tau."""
    res = tmp_path / "results"
    for seed, tau in enumerate((0.9, 0.5)):
        for method in ("scale-adapt", "scale-route"):
            d = fake_cpt_run(res / "cpt", method, {"l_fp": 1, "tau": tau, "router": "logit"}, tag=f"s{seed}")
            r = json.loads((d / "result.json").read_text())
            write_result(d, r | {"seeds": {"base": seed, "run": 0}, "config": r["config"] | {"seed": seed}})
    out = tmp_path / "figs"
    r = runner.invoke(app, ["plot", "--results", str(res), "--out", str(out)])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "table_cpt.csv")
    adapt, route = df[df["method"] == "scale-adapt"], df[df["method"] == "scale-route"]
    assert len(adapt) == 1 and adapt["n"].item() == 2 and "tau" not in str(adapt["setting"].item())
    assert len(route) == 2 and sorted(route["setting"]) == ["tau=0.5", "tau=0.9"]


def test_study_paired_tables_subtract_the_reference_on_each_base(tmp_path):
    """paired_table_fig5_init: each init pair minus (SVD,0) at the end, per base seed, mean and t interval over
    the bases; a base's run seeds are averaged first (never pooled with the bases)."""
    from scalecl.report.stats import t_interval

    init = tmp_path / "results" / "studies" / "init"
    ref_new = {0: 10.0, 1: 12.0, 2: 11.0}
    svd_new = {0: (10.5, 10.7), 1: (12.1,), 2: (11.6,)}  # base 0: two run seeds
    for base, v in ref_new.items():
        _set_seeds(fake_cpt_run(init, "scale-preserve", {"init": ["svd", "zero"]}, new=(50, 20, v), tag=f"r{base}"),
                   base)
        for run, w in enumerate(svd_new[base]):
            _set_seeds(fake_cpt_run(init, "scale-preserve", {"init": ["svd", "svd"]}, new=(50, 20, w),
                                    tag=f"s{base}-{run}"), base, run)
    out = tmp_path / "figs"
    r = runner.invoke(app, ["plot", "--results", str(tmp_path / "results"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    paired = pd.read_csv(out / "paired_table_fig5_init.csv")
    row = paired[(paired["a"] == "SVD,SVD") & (paired["metric"] == "new_ppl_end")].iloc[0]
    iv = t_interval([sum(svd_new[b]) / len(svd_new[b]) - ref_new[b] for b in ref_new])
    assert row["b"] == "SVD,0" and row["n_bases"] == 3 and row["interval"] == "t over 3 base seeds"
    assert (row["diff_mean"], row["diff_ci_lo"], row["diff_ci_hi"]) == pytest.approx((iv.mean, iv.lo, iv.hi))


def test_l_fp_paired_table_subtracts_the_most_preserving_setting(tmp_path):
    """paired_table_fig6_l_fp: each l_fp minus the largest l_fp the study ran (the most function-preserving),
    per base seed, mean and t interval over the bases."""
    from scalecl.report.stats import t_interval

    lfp = tmp_path / "results" / "studies" / "l_fp"
    old_end = {0: {0: 7.0, 2: 4.0, 3: 3.5}, 1: {0: 5.0, 2: 4.4, 3: 3.1}, 2: {0: 6.0, 2: 3.9, 3: 3.3}}
    for base, by_lfp in old_end.items():
        for k, v in by_lfp.items():
            _set_seeds(fake_cpt_run(lfp, "scale-adapt", {"l_fp": k}, old=(3.0, 3.0, v), tag=f"{k}-{base}"), base)
    out = tmp_path / "figs"
    r = runner.invoke(app, ["plot", "--results", str(tmp_path / "results"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    paired = pd.read_csv(out / "paired_table_fig6_l_fp.csv")
    assert set(paired["b"]) == {"l_fp=3"} and sorted(set(paired["a"])) == ["l_fp=0", "l_fp=2"]
    row = paired[(paired["a"] == "l_fp=0") & (paired["metric"] == "old_ppl_end")].iloc[0]
    iv = t_interval([old_end[b][0] - old_end[b][3] for b in old_end])
    assert (row["diff_mean"], row["diff_ci_lo"], row["diff_ci_hi"]) == pytest.approx((iv.mean, iv.lo, iv.hi))
    assert row["per_base"] == "0: +3.5; 1: +1.9; 2: +2.7"
