"""Issue #18 items 3, 4, 6 in `scalecl plot`: the learning-forgetting frontier (bio and cpt), SCALE-Route's
mechanism figure, and the FFT reference of the Route studies. Synthetic result folders shaped like
results/bio/*/ and results/cpt/*/ with known numbers; every expected value below is computed by hand."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.colors import to_rgb
from matplotlib.text import Text

from scalecl.experiments.reports import BIO_REPORT, CPT_REPORT
from scalecl.report import (
    Plot,
    draw_frontier,
    draw_route_mechanism,
    draw_route_study,
    draw_train_loss,
    frontier_table,
    plot_all,
)
from scalecl.report.draw import COLORS
from tests.report.fake_runs import write_result

SPECS = [BIO_REPORT, CPT_REPORT]  # what `scalecl plot` reports
T2 = 4.302653  # t_{0.975, 2}
T1 = 12.706205  # t_{0.975, 1}
STEPS = (0, 5, 10, 15)
ATTRS = ("birthday", "birth_city", "university", "major", "company", "company_city")


def half(sd: float, n: int, t: float) -> float:
    return t * sd / math.sqrt(n)


def bio_run(root: Path, method: str, base: int, *, stage3_lr: float = 1e-4, scale: float = 1.0, t1=(0.0, 0.3, 0.6, 0.7),
            t0=(0.9, 0.8, 0.6, 0.5), final=(0.7, 0.5), steps3: int = 10, date: str = "2026-12-01T00:00:00",
            extra: dict | None = None) -> Path:
    """A biography run folder like results/bio/*/: result.json (lr = stage3.lr x lr_scale[method]) and
    metrics.jsonl with Task 0 / Task 1 accuracy at STEPS, plus a step-3 record without any evaluation."""
    d = root / "bio" / f"cpu-{method}-s{base}-lr{stage3_lr * scale:g}-x{scale:g}-{steps3}-{date[:10]}"
    d.mkdir(parents=True)
    lines = [{"step": s, "loss": None if s == 0 else 1.0, "task0/acc": a, "task1/acc": b}
             for s, a, b in zip(STEPS, t0, t1, strict=True)]
    lines.insert(1, {"step": 3, "loss": 1.2})  # a training record: not an evaluated step
    for rec in lines:
        if "task0/acc" in rec:
            rec |= extra or {}
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    config = {"data": "cpu", "model": {"hidden": 128, "layers": 4, "vocab": 0},
              "stage3": {"steps": steps3, "batch": 32, "lr": stage3_lr}, "eval": {"slice_people": 100},
              "lr_scale": {"fft": 1.0, "lora": 10.0, "scale-route": 10.0, method: scale},
              "methods": {"scale": {"hidden_up": 32}}, "seed": base, "run_seed": 0}
    result = {
        "experiment": "bio", "preset": "cpu", "method": method, "method_options": {}, "trainable_params": 10,
        "lr": stage3_lr * scale, "provenance": {"date": date}, "seeds": {"base": base, "run": 0},
        "data": {"n_bio": 1000, "n_task1": 200, "seed": base}, "config": config,
        "vocab": {"tokenizer": 1045, "model": 1045},
        "priors": {"task0_heldout": {**{a: 0.05 for a in ATTRS}, "pooled": 0.05}},
        "summary": {"task0_start": t0[0], "task0_min": min(t0), "task0_end": t0[-1], "task1_start": t1[0],
                    "task1_end": t1[-1]},
        "final": {"task1": {"acc": final[0]}, "task0_heldout": {"acc": final[1]}},
    }
    write_result(d, result)
    return d


# FFT at three stage-3 rates (config.stage3.lr; three replicate groups), bases 0-2 each:
# rate -> per base (Task 1 curve, Task 0 curve, (final Task 1, final Task 0))
FFT = {
    1e-4: [((0.0, 0.3, 0.6, 0.7), (0.9, 0.8, 0.6 - 0.1 * b, 0.5), (0.70 + 0.02 * b, 0.5 - 0.1 * b)) for b in range(3)],
    3e-4: [((0.0, 0.5, 0.85, 0.9), (0.9, 0.7, 0.5, 0.4), (0.90, 0.35)),
           ((0.0, 0.5, 0.85, 0.9), (0.9, 0.6, 0.4, 0.3), (0.90, 0.25)),
           ((0.0, 0.4, 0.7, 0.85), (0.9, 0.65, 0.45, 0.35), (0.84, 0.30))],
    1e-3: [((0.0, 0.9, 0.95, 1.0), (0.9, 0.2 + 0.1 * b, 0.1, 0.1), (1.0, 0.1 + 0.1 * b)) for b in range(3)],
}


def frontier_results(root: Path) -> Path:
    """FFT: 3 rates x 3 bases. Route: 2 rates (via lr_scale: 10 and 30 at stage3.lr 1e-4) x 2 bases, plus an
    older run at one of them (stage3.lr 3e-4, lr_scale 10: another replicate group, same rate and seeds) that
    the newer one replaces. LoRA: one rate, 2 bases. FFT with 20 Task 1 steps: a line of its own."""
    for lr, per_base in FFT.items():
        for b, (t1, t0, final) in enumerate(per_base):
            bio_run(root, "fft", b, stage3_lr=lr, t1=t1, t0=t0, final=final)
    route = {10.0: [((0.0, 0.3, 0.55, 0.6), (0.9, 0.9, 0.85, 0.8), (0.8, 0.8)),
                    ((0.0, 0.3, 0.45, 0.6), (0.9, 0.9, 0.8, 0.8), (0.9, 0.7))],
             30.0: [((0.0, 0.6, 0.9, 0.95), (0.9, 0.7, 0.6, 0.6), (0.95, 0.6)),
                    ((0.0, 0.6, 0.9, 0.95), (0.9, 0.8, 0.5, 0.5), (0.97, 0.5))]}
    for scale, per_base in route.items():
        for b, (t1, t0, final) in enumerate(per_base):
            bio_run(root, "scale-route", b, scale=scale, t1=t1, t0=t0, final=final)
    bio_run(root, "scale-route", 0, stage3_lr=3e-4, scale=10.0, final=(0.0, 0.0), date="2026-11-01T00:00:00")
    for b, final in enumerate(((0.6, 0.5), (0.7, 0.6))):
        bio_run(root, "lora", b, stage3_lr=1e-4, scale=10.0, final=final)
    bio_run(root, "fft", 0, stage3_lr=1e-4, steps3=20, final=(0.99, 0.01))
    return root


@pytest.fixture
def closing():
    figs = []
    yield figs.append
    for fig in figs:
        plt.close(fig)


def test_frontier_table_means_intervals_and_thresholds(tmp_path):
    table = frontier_table(Plot.of(frontier_results(tmp_path)), BIO_REPORT)
    rows = {(r["line"], round(r["lr"], 9)): r for _, r in table.iterrows()}
    fft = "FFT [10 stage-3 steps]"
    assert sorted(rows) == sorted([(fft, 1e-4), (fft, 3e-4), (fft, 1e-3), ("FFT [20 stage-3 steps]", 1e-4),
                                   ("LoRA [10 stage-3 steps]", 1e-3), ("SCALE-Route [10 stage-3 steps]", 1e-3),
                                   ("SCALE-Route [10 stage-3 steps]", 3e-3)])
    a = rows[(fft, 1e-4)]
    assert (a["n"], a["seeds"], a["interval"], a["unit"]) == (3, "0/0, 1/0, 2/0", "t over 3 base seeds", "3 base seeds")
    assert a["task1_full"] == pytest.approx(0.72) and a["task0_full"] == pytest.approx(0.4)
    assert a["task1_full_ci_hi"] - 0.72 == pytest.approx(half(0.02, 3, T2), rel=1e-6)
    assert 0.4 - a["task0_full_ci_lo"] == pytest.approx(half(0.1, 3, T2), rel=1e-6)
    # Task 1 first reaches 0.5 at step 10 (0.6) in every run; Task 0 there: 0.6, 0.5, 0.4. It never reaches 0.8
    assert (a["curves"], a["task0_at_task1_50_reached"], a["task0_at_task1_50_step"]) == (3, 3, 10)
    assert a["task0_at_task1_50"] == pytest.approx(0.5)
    assert a["task0_at_task1_50_ci_hi"] - 0.5 == pytest.approx(half(0.1, 3, T2), rel=1e-6)
    assert a["task0_at_task1_80_reached"] == 0 and pd.isna(a["task0_at_task1_80"])
    b = rows[(fft, 3e-4)]
    assert b["task1_full"] == pytest.approx(0.88)
    assert b["task1_full_ci_hi"] - 0.88 == pytest.approx(half(math.sqrt(0.0012), 3, T2), rel=1e-6)
    # 0.5 is reached exactly (>=) at step 5 on bases 0 and 1 (Task 0 0.7, 0.6), at step 10 on base 2 (0.45)
    assert b["task0_at_task1_50"] == pytest.approx((0.7 + 0.6 + 0.45) / 3)
    assert b["task0_at_task1_50_step"] == pytest.approx(20 / 3)
    sd = math.sqrt(sum((v - 1.75 / 3) ** 2 for v in (0.7, 0.6, 0.45)) / 2)
    assert b["task0_at_task1_50_ci_lo"] == pytest.approx(1.75 / 3 - half(sd, 3, T2), rel=1e-6)
    # 0.8: at step 10 on bases 0, 1 (0.5, 0.4) and at step 15 on base 2 (0.35)
    assert b["task0_at_task1_80"] == pytest.approx(1.25 / 3) and b["task0_at_task1_80_reached"] == 3
    c = rows[(fft, 1e-3)]
    assert c["task1_full"] == 1.0 and c["task1_full_ci_lo"] == pytest.approx(1.0)  # sd 0: a zero-width interval
    assert c["task0_at_task1_50"] == pytest.approx(0.3) == c["task0_at_task1_80"]  # both at step 5: 0.2, 0.3, 0.4
    route = rows[("SCALE-Route [10 stage-3 steps]", 1e-3)]
    assert route["n"] == 2 and route["task1_full"] == pytest.approx(0.85)
    assert route["task1_full_ci_hi"] - 0.85 == pytest.approx(half(math.sqrt(0.005), 2, T1), rel=1e-6)
    # base 0 reaches 0.5 at step 10 (Task 0 there 0.85), base 1 at step 15 (0.45 at 10; Task 0 0.8); 0.8 never
    assert route["task0_at_task1_50_reached"] == 2 and route["task0_at_task1_50"] == pytest.approx(0.825)
    assert route["task0_at_task1_80_reached"] == 0
    fast = rows[("SCALE-Route [10 stage-3 steps]", 3e-3)]
    # two replicate groups reach lr 3e-3 with seeds 0/0: the newer (lr_scale 30) replaces the older
    assert fast["n"] == 2 and fast["task0_full"] == pytest.approx(0.55) and fast["seeds"] == "0/0, 1/0"
    one = rows[("FFT [20 stage-3 steps]", 1e-4)]
    assert one["n"] == 1 and one["task0_full"] == 0.01 and pd.isna(one["task0_full_ci_lo"])
    assert one["interval"] == "n=1 (no interval)" and one["unit"] == "1 run"


def test_frontier_threshold_counts_only_the_runs_that_reach_it(tmp_path):
    for b, t1 in enumerate(((0.0, 0.6, 0.7, 0.8), (0.0, 0.1, 0.2, 0.3), (0.0, 0.2, 0.5, 0.9))):
        bio_run(tmp_path, "fft", b, t1=t1, t0=(0.9, 0.7, 0.6, 0.4))
    row = frontier_table(Plot.of(tmp_path), BIO_REPORT).iloc[0]
    # 0.5: base 0 at step 5 (0.7), base 2 at step 10 (0.6), base 1 never: mean over the two that reached it
    assert (row["curves"], row["task0_at_task1_50_reached"]) == (3, 2)
    assert row["task0_at_task1_50"] == pytest.approx(0.65)
    assert row["task0_at_task1_50_ci_hi"] - 0.65 == pytest.approx(half(math.sqrt(0.005), 2, T1), rel=1e-6)
    # 0.8: base 0 at step 15 (0.4), base 2 at 15 (0.4): one value twice; base 1 never
    assert row["task0_at_task1_80_reached"] == 2 and row["task0_at_task1_80"] == pytest.approx(0.4)
    (tmp_path / "bio").rename(tmp_path / "only")
    bio_run(tmp_path, "fft", 0, t1=(0.0, 0.6, 0.7, 0.9), t0=(0.9, 0.7, 0.6, 0.4))
    row = frontier_table(Plot.of(tmp_path / "bio"), BIO_REPORT).iloc[0]
    assert row["task0_at_task1_50_reached"] == 1 and row["task0_at_task1_50"] == pytest.approx(0.7)
    assert pd.isna(row["task0_at_task1_50_ci_lo"])  # one run reached it: its value, no interval


def test_frontier_figure_lines_points_and_error_bars(tmp_path, closing):
    fig = dict(draw_frontier(Plot.of(frontier_results(tmp_path)), BIO_REPORT))["frontier_bio"]
    closing(fig)
    (ax,) = fig.axes
    assert ax.get_xlabel() == "Task 1 learned: full-range final accuracy (%)"
    assert ax.get_ylabel() == "Task 0 retained: held-out full-range final accuracy (%)"
    bars = {c.get_label(): c for c in ax.containers}
    assert sorted(bars) == ["FFT [10 stage-3 steps]", "FFT [20 stage-3 steps]", "LoRA [10 stage-3 steps]",
                            "SCALE-Route [10 stage-3 steps]"]
    data, _, (xbars, ybars) = bars["FFT [10 stage-3 steps]"].lines
    assert data.get_linestyle() == "-"  # three rates: joined in lr order
    assert [float(v) for v in data.get_xdata()] == pytest.approx([72, 88, 100])
    assert [float(v) for v in data.get_ydata()] == pytest.approx([40, 30, 20])
    h = 100 * half(0.02, 3, T2)  # the first point's x interval, in %
    assert xbars.get_segments()[0].ravel().tolist() == pytest.approx([72 - h, 40, 72 + h, 40])
    h = 100 * half(0.1, 3, T2)
    assert ybars.get_segments()[0].ravel().tolist() == pytest.approx([72, 40 - h, 72, 40 + h])
    for single in ("LoRA [10 stage-3 steps]", "FFT [20 stage-3 steps]"):  # one rate: a point, no line
        data = bars[single].lines[0]
        assert data.get_linestyle() == "None" and len(data.get_xdata()) == 1
    route = bars["SCALE-Route [10 stage-3 steps]"].lines
    assert route[0].get_linestyle() == "-"
    h = 100 * half(math.sqrt(0.005), 2, T1)  # 85 ± 63.5: the bar is cut at 100%, an accuracy's end
    assert route[2][0].get_segments()[0].ravel().tolist() == pytest.approx([85 - h, 75, 100, 75])
    assert not bars["FFT [20 stage-3 steps]"].lines[2][0].get_segments()[0].size  # n = 1: no error bar
    notes = [t.get_text() for t in ax.texts]  # the panel's points have no unit in common: each label names its own
    assert {"0.0001 (3 base seeds)", "0.0003 (3 base seeds)", "0.001 (3 base seeds)", "0.003 (2 base seeds)",
            "0.0001"} <= set(notes)
    assert ax.get_title() == "preset 'cpu'"
    assert "joined in learning-rate order" in fig.texts[-1].get_text()
    # FFT's two lines: the one with most rates keeps FFT's colour, the other a shade of it and another style
    main, other = (bars[f"FFT [{s} stage-3 steps]"].lines[0] for s in (10, 20))
    assert to_rgb(main.get_color()) == to_rgb(COLORS["fft"]) and to_rgb(other.get_color()) != to_rgb(COLORS["fft"])
    assert other.get_marker() != main.get_marker()


def cpt_run(root: Path, method: str, base: int, lr: float, old_end: float, new_end: float, tag: str = "") -> Path:
    """A CPT result folder like results/cpt/*/ (its per-method rate table config.lr sets `lr`)."""
    d = root / "cpt" / f"cpu-{method}-s{base}-lr{lr:g}{tag}"
    d.mkdir(parents=True)
    lines = [{"step": s, "old/ppl": 10 + (old_end - 10) * i / 2, "new/ppl": 50 + (new_end - 50) * i / 2,
              "rep_cos": 1.0, "up_norm": 1.0} for i, s in enumerate((0, 10, 20))]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    config = {"base": "builtin", "data": {"path": "builtin:ko"}, "train": {"steps": 20, "batch": 8, "seq_len": 64},
              "lr": {"fft": 1e-4, "scale-route": 1e-3, method: lr}, "seed": base, "run_seed": 0}
    result = {"experiment": "cpt", "preset": "cpu", "method": method, "method_options": {}, "lr": lr,
              "trainable_params": 5, "provenance": {"date": "2026-12-01"}, "seeds": {"base": base, "run": 0},
              "config": copy.deepcopy(config),
              "summary": {"old_ppl_start": 10.0, "old_ppl_end": old_end, "old_ppl_max": old_end,
                          "new_ppl_start": 50.0, "new_ppl_end": new_end, "rep_cos_end": 1.0},
              "final": lines[-1]}
    write_result(d, result)
    return d


def test_cpt_frontier_table_and_log_axes(tmp_path, closing):
    for b, (old, new) in enumerate(((11.0, 20.0), (13.0, 22.0))):
        cpt_run(tmp_path, "fft", b, 1e-4, old, new)
    for b, (old, new) in enumerate(((14.0, 12.0), (16.0, 14.0))):
        cpt_run(tmp_path, "fft", b, 3e-4, old, new)
    for b, (old, new) in enumerate(((10.5, 21.0), (11.5, 23.0))):
        cpt_run(tmp_path, "scale-route", b, 1e-3, old, new)
    table = frontier_table(Plot.of(tmp_path), CPT_REPORT).set_index(["method", "lr"])
    a = table.loc[("fft", 1e-4)]
    assert (a["n"], a["new_ppl_end"], a["old_ppl_end"]) == (2, pytest.approx(21.0), pytest.approx(12.0))
    assert a["old_ppl_end_ci_lo"] == pytest.approx(12 - half(math.sqrt(2), 2, T1), rel=1e-6)  # below 1: -0.71
    assert table.loc[("scale-route", 1e-3), "new_ppl_end"] == pytest.approx(22.0)
    assert "task0_at_task1_50" not in table
    fig = dict(draw_frontier(Plot.of(tmp_path), CPT_REPORT))["frontier_cpt"]
    closing(fig)
    (ax,) = fig.axes
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert "log scale" in ax.get_xlabel() and "log scale" in ax.get_ylabel()
    assert ax.get_xlabel().startswith("learning") and ax.get_ylabel().startswith("forgetting")
    bars = {c.get_label(): c for c in ax.containers}
    assert bars["FFT"].lines[0].get_linestyle() == "-" and bars["SCALE-Route"].lines[0].get_linestyle() == "None"
    ys_segment = bars["FFT"].lines[2][1].get_segments()[0]  # the 1e-4 point's perplexity interval, cut at 1
    assert ys_segment[:, 1].tolist() == pytest.approx([1.0, 12 + half(math.sqrt(2), 2, T1)], rel=1e-6)


def test_frontier_labels_of_points_close_together_do_not_overlap(tmp_path, closing):
    """Five methods ending at almost one point (as the real model's do): every rate label is drawn, inside the
    axes, and no two overlap (a label moved away from its point gets a leader line)."""
    ends = {"fft": (42.0, 4.10), "freeze": (42.5, 4.12), "llama-pro": (42.2, 4.14), "scale-adapt": (43.0, 4.11),
            "scale-preserve": (900.0, 8.0), "scale-route": (42.8, 4.13)}
    for method, (old, new) in ends.items():
        for lr in (1e-4, 1e-3):
            cpt_run(tmp_path, method, 0, lr, old * (1 + 10 * lr), new)
    fig = dict(draw_frontier(Plot.of(tmp_path), CPT_REPORT))["frontier_cpt"]
    closing(fig)
    (ax,) = fig.axes
    fig.canvas.draw()
    notes = [t for t in ax.texts if t.get_text() in ("0.0001", "0.001")]
    assert len(notes) == 2 * len(ends)
    boxes = [Text.get_window_extent(t) for t in notes]  # the text alone, not its leader line
    inside = ax.get_window_extent()
    assert all(inside.contains(b.x0, b.y0) and inside.contains(b.x1, b.y1) for b in boxes)
    clashes = [(a.get_text(), b.get_text()) for i, (a, p) in enumerate(zip(notes, boxes, strict=True))
               for b, q in zip(notes[i + 1:], boxes[i + 1:], strict=True) if p.overlaps(q)]
    assert not clashes


def test_plot_writes_frontier_files(tmp_path, all_figure_formats):
    out = tmp_path / "figs"
    names = {p.name for p in plot_all(frontier_results(tmp_path / "res"), out, SPECS).written}
    assert {"frontier_bio.png", "frontier_bio.pdf", "frontier_bio.csv", "frontier_bio.md", "frontier_bio.tex",
            "frontier_bio.inputs.txt"} <= names
    assert "frontier_cpt.csv" not in names and "route_mechanism.png" not in names  # no cpt runs, no keys
    csv = pd.read_csv(out / "frontier_bio.csv")
    assert {"preset", "method", "lr", "n", "task1_full", "task1_full_ci_lo", "task1_full_ci_hi", "task0_full",
            "task0_full_ci_lo", "task0_full_ci_hi", "task0_at_task1_50", "task0_at_task1_50_reached",
            "task0_at_task1_80", "curves"} <= set(csv.columns)
    md = (out / "frontier_bio.md").read_text()
    assert "Task 0 when Task 1 first reaches 0.5" in md and "Task 0 when Task 1 first reaches 0.8" in md
    assert f"0.500 ± {half(0.1, 3, T2):.3f} (3 of 3 runs reached it; mean step 10)" in md
    assert "never (0 of 3 runs)" in md and "Student-t" in md
    inputs = (out / "frontier_bio.inputs.txt").read_text()
    assert "2026-11-01" not in inputs and "n = 3 (seeds 0/0, 1/0, 2/0)" in inputs


# ---------------------------------------------------------------------------------------------------------
# SCALE-Route's mechanism: never-target logit share per path


def route_run(root: Path, base: int, rows: int, *, never: int | None, keys: bool = True, tau: float = 0.9,
              share=0.1, tag: str = "") -> Path:
    """A SCALE-Route run with (keys=True) the never-target share per path at the answer positions: preserve
    `share` flat, adapt rising from 0 to 2 x share; answer routing and the router score as recorded today."""
    t1 = (0.0, 0.3, 0.6, 0.9)
    t0 = (0.9, 0.8, 0.7, 0.6)
    extra = {"task0/answer/route_preserve": 0.5, "task1/answer/route_preserve": 0.25,
             "task0/answer/route_score/mean": 0.8, "task1/answer/route_score/mean": 0.6}
    d = bio_run(root, "scale-route", base, scale=10.0, t1=t1, t0=t0, extra=extra,
                date=f"2026-12-0{1 + base}T00:00:00")
    d = d.rename(d.with_name(d.name + f"-v{rows}{tag}"))
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    for i, rec in enumerate(x for x in lines if "task0/acc" in x):
        if keys:
            for task in ("task0", "task1"):
                rec[f"{task}/answer/never_share_preserve/mean"] = share
                rec[f"{task}/answer/never_share_adapt/mean"] = 2 * share * i / 3
                rec |= {f"{task}/answer/never_share_{p}/{q}": share for p in ("preserve", "adapt")
                        for q in ("q05", "q25", "q50", "q75", "q95")}
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = json.loads((d / "result.json").read_text())
    r["method_options"] = {"tau": tau, "router": "logit"}
    r["vocab"] = {"tokenizer": 1045, "model": rows}
    r["config"]["model"]["vocab"] = 0 if rows == 1045 else rows
    if never is not None:
        r["never_target_rows"] = never
    write_result(d, r)
    return d


def _rows(fig) -> dict[str, list]:
    """route_mechanism's rows of panels by the title of the legend beside them: {title: [(a), (b), (c)]} (rows
    of one title, a vocabulary split in two, get ' #2' added)."""
    rows: dict[str, list] = {}
    axes = fig.axes
    for i in range(0, len(axes), 4):
        title = axes[i + 3].get_legend().get_title().get_text()
        rows[title if title not in rows else f"{title} #2"] = axes[i:i + 3]
    return rows


def test_route_mechanism_drawn_when_keys_exist(tmp_path, closing, all_figure_formats):
    res = tmp_path / "res"
    route_run(res, 0, 1045, never=600, share=0.1)  # main run
    route_run(res / "studies" / "vocab", 0, 50304, never=49859, share=0.2)  # a study: two base seeds
    route_run(res / "studies" / "vocab", 1, 50304, never=49859, share=0.4)
    route_run(res / "studies" / "tau", 0, 1045, never=None, keys=False, tau=0.5)  # older: not drawn
    fig = dict(draw_route_mechanism(Plot.of(res), BIO_REPORT))["route_mechanism"]
    closing(fig)
    rows = _rows(fig)  # a row per vocabulary size: three panels and the row's legend
    assert list(rows) == ["1,045 vocab rows (tokenizer's size); 600 never a target",
                          "50,304 vocab rows; 49,859 never a target"]
    small, big = rows.values()
    assert [ln.get_label() for ln in small[0].get_lines()][:1] == ["tau=0.9, lr=0.001; preserve 10.0%"]
    (gap,) = [ln for ln in big[0].get_lines() if not ln.get_label().startswith("_")]
    # the label names the band's unit and the frozen path's share (the mean of 20% and 40%)
    assert gap.get_label() == "tau=0.9, lr=0.001 (2 base seeds); preserve 30.0%"
    # (a) adapt minus preserve on the same run, in points: base 0 [-20, -6.7, 6.7, 20], base 1 twice that
    assert [float(v) for v in gap.get_ydata()] == pytest.approx([-30, -10, 10, 30])
    band = big[0].collections[0].get_paths()[0].vertices
    h = 100 * half(math.sqrt(0.02), 2, T1)  # at step 0 the gaps are -0.2 and -0.4
    assert max(band[:, 1][band[:, 0] == 0]) == pytest.approx(-30 + h, rel=1e-6)
    assert not small[0].collections  # one run: no band
    assert [float(v) for v in big[1].get_lines()[0].get_ydata()] == pytest.approx([50] * 4)  # (b) answers routed
    assert [float(v) for v in big[2].get_lines()[0].get_ydata()] == pytest.approx([0.8] * 4)  # (c) the score
    assert "never a training target" in fig.texts[-1].get_text()
    out = tmp_path / "o"
    assert {"route_mechanism.png", "route_mechanism.pdf", "route_mechanism.inputs.txt"} <= {
        p.name for p in plot_all(res, out, SPECS).written}
    assert "studies/tau" not in (out / "route_mechanism.inputs.txt").read_text()


def _rewrite(d: Path, *, lr: float | None = None, steps3: int | None = None, run: int | None = None,
             shares: tuple[float, float] | None = None) -> None:
    """Change a route_run's rate, Task 1 steps, run seed or its (preserve, adapt) never-target shares."""
    r = json.loads((d / "result.json").read_text())
    if lr is not None:
        r["lr"], r["config"]["lr_scale"]["scale-route"] = lr, lr / r["config"]["stage3"]["lr"]
    if steps3 is not None:
        r["config"]["stage3"]["steps"] = steps3
    if run is not None:
        r["seeds"]["run"] = r["config"]["run_seed"] = run
    write_result(d, r)
    if shares is not None:
        lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        for rec in lines:
            rec |= {k: shares[k.split("_")[-1].startswith("adapt")] for k in rec if "/never_share_" in k}
        (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_route_mechanism_lines_name_rate_and_unit_and_keep_one_build_per_base(tmp_path, closing):
    """A line per Route group names its learning rate; groups that differ elsewhere are named by the setting the
    other figures use, never by a hash; a line is over base seeds (each base's run seeds averaged first), never
    over base and run seeds pooled; a second build of a base seed (stages trained again on another machine) is
    never averaged with the first."""
    res = tmp_path / "res"
    route_run(res, 0, 1045, never=600, share=0.1)  # lr 1e-3 (stage3.lr 1e-4 x 10)
    _rewrite(route_run(res, 0, 1045, never=600, share=0.1, tag="-fast"), lr=3e-3)
    _rewrite(route_run(res, 0, 1045, never=600, share=0.1, tag="-long"), steps3=20)
    vocab = res / "studies" / "vocab"  # base 0 with run seeds 0 and 1, base 1: two base seeds
    for base, run, preserve in ((0, 0, 0.990), (0, 1, 0.996), (1, 0, 0.997)):
        _rewrite(route_run(vocab, base, 50304, never=49859, tag=f"-r{run}"), run=run, shares=(preserve, 0.999))
    d = route_run(res / "studies" / "vocab-control", 1, 50304, never=49859, tag="-b")  # base 1, second build
    _rewrite(d, shares=(0.5, 0.5))
    r = json.loads((d / "result.json").read_text())
    r |= {"stage1": {"final_loss": 0.41}, "stage2": {"final_loss": 0.01}, "provenance": {"date": "2026-12-09"}}
    write_result(d, r)
    fig = dict(draw_route_mechanism(Plot.of(res), BIO_REPORT))["route_mechanism"]
    closing(fig)
    rows = _rows(fig)
    small = [ln.get_label() for ln in rows["1,045 vocab rows (tokenizer's size); 600 never a target"][0].get_lines()
             if not ln.get_label().startswith("_")]
    assert sorted(small) == sorted(["tau=0.9, lr=0.001 [10 stage-3 steps]; preserve 10.0%",
                                    "tau=0.9, lr=0.001 [20 stage-3 steps]; preserve 10.0%",
                                    "tau=0.9, lr=0.003; preserve 10.0%"])
    big = rows["50,304 vocab rows; 49,859 never a target"]
    (gap,) = [ln for ln in big[0].get_lines() if not ln.get_label().startswith("_")]
    # preserve: base 0's two run seeds averaged (99.3), then with base 1 (99.7): 99.5, not 99.43 pooled, and
    # base 1's second build (50%) left out
    assert gap.get_label() == "tau=0.9, lr=0.001 (2 base seeds); preserve 99.5%"
    assert [float(v) for v in gap.get_ydata()] == pytest.approx([0.4] * 4)  # adapt 99.9 minus 99.5, in points
    band = big[0].collections[0].get_paths()[0].vertices
    h = 100 * half(math.sqrt(0.000008), 2, T1)  # over the base gaps 0.006 and 0.002
    assert max(band[:, 1]) == pytest.approx(0.4 + h, rel=1e-6)
    caption = fig.texts[-1].get_text()
    assert "one build of each base seed" in caption and "base seeds" in caption


def test_route_mechanism_skipped_without_keys(tmp_path):
    route_run(tmp_path, 0, 1045, never=None, keys=False)
    assert list(draw_route_mechanism(Plot.of(tmp_path), BIO_REPORT)) == []
    assert "route_mechanism.png" not in {p.name for p in plot_all(tmp_path, tmp_path / "o", SPECS).written}


# ---------------------------------------------------------------------------------------------------------
# fig8_route_*: the FFT reference trained on the same vocabulary rows, the replicate mean


def test_route_study_fft_reference_matches_vocabulary(tmp_path, closing):
    res = tmp_path / "res"
    bio_run(res, "fft", 0, t0=(0.9, 0.4, 0.3, 0.2))  # main FFT on the tokenizer's rows: two bases
    bio_run(res, "fft", 1, t0=(0.9, 0.6, 0.5, 0.4))
    ref = bio_run(res / "studies" / "vocab", "fft", 0, t0=(0.9, 0.1, 0.1, 0.1))  # FFT on 50,304 rows
    r = json.loads((ref / "result.json").read_text())
    r["vocab"], r["config"]["model"]["vocab"] = {"tokenizer": 1045, "model": 50304}, 50304
    write_result(ref, r)
    router = res / "studies" / "router"
    route_run(router, 0, 1045, never=600)
    route_run(router, 1, 1045, never=600, tag="-b1")
    route_run(router, 0, 50304, never=49859, tag="-big")
    fig = dict(draw_route_study(Plot.of(res), BIO_REPORT, "router"))["fig8_route_router"]
    closing(fig)
    assert len(fig.axes) == 2 * 3  # a row of panels per vocabulary
    small, big = fig.axes[0], fig.axes[3]
    assert small.get_title() == "(a) Task 0 (held-out) accuracy\n1,045 vocab rows (tokenizer's size)"
    assert big.get_title() == "(a) Task 0 (held-out) accuracy\n50,304 vocab rows"
    (mean,) = [ln for ln in small.get_lines() if ln.get_color() == "black"]
    assert mean.get_label() == "FFT, main runs (2 base seeds)"
    assert [float(v) for v in mean.get_ydata()] == pytest.approx([90, 50, 40, 30])  # the mean of both bases
    bands = [c for c in small.collections if tuple(c.get_facecolor()[0][:3]) == (0.0, 0.0, 0.0)]
    assert len(bands) == 1  # the reference's t band over its 2 replicates
    (other,) = [ln for ln in big.get_lines() if ln.get_color() == "black"]
    assert other.get_label() == "FFT reference" and [float(v) for v in other.get_ydata()] == pytest.approx(
        [90, 10, 10, 10])  # the 50,304-row FFT, not the main one
    text = fig.texts[-1].get_text()
    assert "FFT reference with 50,304 vocab rows: study 'vocab' run" in text
    assert "FFT reference with 1,045 vocab rows (tokenizer's size): the mean of 2 base seeds, main runs" in text
    # the vocab study: one row; the study's own 50,304-row FFT is its dashed line, the main FFT the reference
    route_run(res / "studies" / "vocab", 0, 1045, never=600)
    route_run(res / "studies" / "vocab", 0, 50304, never=49859, tag="-big")
    fig = dict(draw_route_study(Plot.of(res), BIO_REPORT, "vocab"))["fig8_route_vocab"]
    closing(fig)
    assert len(fig.axes) == 3
    black = [ln for ln in fig.axes[0].get_lines() if ln.get_color() == "black"]
    # the study's Route runs are on base seed 0 only: the reference is base 0's FFT, never pooled with base 1's
    assert [ln.get_label() for ln in black] == ["FFT, main run, 1,045 vocab rows (tokenizer's size)"]
    assert [float(v) for v in black[0].get_ydata()] == pytest.approx([90, 40, 30, 20])
    assert "(the study's own FFT line)" in fig.texts[-1].get_text()


def cpt_study_run(root: Path, init: list[str], tied: bool, tag: str) -> Path:
    """A cpt init-study run with a training log, on a tied or untied base."""
    d = cpt_run(root / "studies" / "init", "scale-preserve", 0, 1e-3, 11.0, 20.0, tag=f"-{tag}")
    (d / "train_log.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3.0 - 0.01 * s + (0.5 if tied else 0),
                                                           "lr": 1e-3}) + "\n" for s in range(1, 21)))
    r = json.loads((d / "result.json").read_text())
    r["method_options"] = {"init": init}
    r["config"]["model"] = {"tie_embeddings": tied}
    write_result(d, r)
    return d


def test_study_loss_figure_separates_bases(tmp_path, closing):
    for tied in (True, False):
        for init in (["svd", "zero"], ["zero", "rnd"]):
            cpt_study_run(tmp_path, init, tied, f"{init[0]}{tied}")
    fig = dict(draw_train_loss(Plot.of(tmp_path), CPT_REPORT))["train_loss_study_init"]
    closing(fig)
    panels = {ax.get_title(): ax for ax in fig.axes}
    assert sorted(panels) == ["tied base, new embedding columns zero", "untied base, new embedding columns zero"]
    for ax in fig.axes:
        names = [t.get_text() for t in ax.get_legend().get_texts()]
        assert names == ["SVD,0", "0,RND"]  # each label once per panel
    tied = panels["tied base, new embedding columns zero"]
    tied_line = [ln for ln in tied.get_lines() if ln.get_label() == "SVD,0"][0]
    assert float(tied_line.get_ydata()[10]) == pytest.approx(3.5 - 0.11, abs=0.02)
