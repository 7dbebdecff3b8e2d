"""The rules every figure the documentation shows keeps, checked on figures drawn from synthetic runs and on the
committed ones:

- readable at README width (scalecl.report.draw: READ_WIDTH_IN, READ_ASPECT, READ_FONT_PT): saved as `scalecl
  plot` saves (150 dpi, tight box), at most 1,800 px wide and 1.6 times as tall as wide, no text under 7 pt;
- every band names its unit: each shaded interval and each error bar has, in the label of its line or in its
  panel's title or point labels, the seeds it is over ('3 base seeds', '2 run seeds of base 0');

and the fixes behind them: one unit per line (run seeds and base seeds never pooled), one build of each base,
the whole held-out sets where runs have them, one colour rule for the settings of one method, the tokenizer's
sizes of every run drawn."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgb
from matplotlib.container import ErrorbarContainer
from matplotlib.text import Text
from PIL import Image

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
    draw_frontier,
    draw_route_mechanism,
    draw_route_study,
    frontier_table,
)
from scalecl.report.draw import COLORS, READ_ASPECT, READ_FONT_PT, READ_WIDTH_IN, shades
from scalecl.report.ensemble import draw_ensemble
from tests.report.fake_runs import write_result
from tests.report.test_frontier_and_mechanism import _rewrite, bio_run, cpt_run, frontier_results, route_run

REPO = Path(__file__).resolve().parents[2]
DPI = 150  # what scalecl plot saves at
UNIT = re.compile(r"\b\d+ (base|run) seeds\b")


# ---------------------------------------------------------------------------------------------------------
# the rules


def saved_size(fig) -> tuple[int, int]:
    """The figure's size in pixels as scalecl plot saves it (PNG at 150 dpi, tight box)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return Image.open(io.BytesIO(buf.getvalue())).size


def size_problems(size: tuple[int, int]) -> list[str]:
    w, h = size
    out = [f"{w} px wide, more than {READ_WIDTH_IN * DPI:.0f}"] if w > READ_WIDTH_IN * DPI else []
    return out + ([f"{w} x {h} px: taller than {READ_ASPECT} x its width"] if h > READ_ASPECT * w else [])


def small_text(fig) -> list[str]:
    """Visible text under READ_FONT_PT."""
    return [f"{t.get_text()[:40]!r} at {t.get_fontsize()} pt" for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip() and t.get_fontsize() < READ_FONT_PT]


def unnamed_bands(fig) -> list[str]:
    """Bands (shaded intervals) and error bars whose unit neither their line's label nor their panel's title
    (or its point labels) names."""
    out = []
    for ax in fig.axes:
        where = " ".join([ax.get_title(), ax.get_title("left"), *(t.get_text() for t in ax.texts)])
        for band in (c for c in ax.collections if isinstance(c, PolyCollection) and len(c.get_paths())):
            color = tuple(band.get_facecolor()[0][:3])
            names = [ln.get_label() for ln in ax.get_lines() if to_rgb(ln.get_color()) == color]
            if not any(UNIT.search(x) for x in [*names, where]):
                out.append(f"band in {ax.get_title() or ax.get_title('left')!r} ({names})")
        for bars in (c for c in ax.containers if isinstance(c, ErrorbarContainer)):
            drawn = any(len(seg) for coll in bars.lines[2] for seg in coll.get_segments())
            if drawn and not (UNIT.search(bars.get_label() or "") or UNIT.search(where)):
                out.append(f"error bars {bars.get_label()!r} in {ax.get_title()!r}")
    return out


def check(fig, stem: str) -> list[str]:
    return [f"{stem}: {p}" for p in size_problems(saved_size(fig)) + small_text(fig) + unnamed_bands(fig)]


# ---------------------------------------------------------------------------------------------------------
# synthetic results that give every family of figures the documentation shows, with replicates


def cpt_heldout(d: Path, old: float, new: float, seed: int) -> None:
    """A real-preset CPT run with a final evaluation on the whole held-out sets (result.json heldout)."""
    r = json.loads((d / "result.json").read_text())
    at = {"128": {"start": {"ppl": 46.0}, "end": {"ppl": old}}}
    r |= {"preset": "real", "seeds": {"base": 0, "run": seed}, "heldout": {
        "take": 0, "lengths": [128], "old": {"documents": 68, "at": at},
        "new": {"documents": 39, "at": {"128": {"start": {"ppl": 11.0}, "end": {"ppl": new}}}}}}
    r["config"] |= {"eval": {"every": 0, "final_take": 0}, "run_seed": seed, "seed": 0}
    write_result(d, r)


def cpt_study(root: Path, study: str, base: int, opts: dict, old: float, new: float, tag: str) -> None:
    d = cpt_run(root / "studies" / study, "scale-adapt" if study != "init" else "scale-preserve", base, 1e-3, old,
                new, tag=f"-{tag}")
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    for i, rec in enumerate(lines):
        rec["up_norm"] = 1.0 + i
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = json.loads((d / "result.json").read_text())
    r["method_options"] = opts
    write_result(d, r)


def ensemble_study(root: Path) -> None:
    """The ensemble study on 2 bases: Route at two taus, FFT as it is, averaged in training (two rates) and when
    scored, LoRA at two ranks."""
    variants = [("scale-route", 10.0, {"tau": 0.5}, "none"), ("scale-route", 10.0, {"tau": -1.0}, "none"),
                ("fft", 1.0, {}, "none"), ("fft", 1.0, {}, "train"), ("fft", 3.0, {}, "train"),
                ("fft", 1.0, {}, "eval"), ("lora", 10.0, {"rank": 8}, "none"), ("lora", 10.0, {"rank": 34}, "none")]
    for i, (method, scale, options, mode) in enumerate(variants):
        for base in (0, 1):
            d = bio_run(root, method, base, scale=scale, t0=(0.9, 0.5 + 0.05 * i, 0.5, 0.4 + 0.05 * base),
                        date=f"2026-12-{i + 1:02d}T00:00:00")
            r = json.loads((d / "result.json").read_text())
            r["method_options"] = options
            r["config"]["ensemble"] = {"mode": mode, "base_weight": 0.5}
            write_result(d, r)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("results")
    frontier_results(root)  # biography: FFT at 3 rates x 3 bases, Route and LoRA on 2 bases
    for base, run in ((0, 0), (0, 1), (1, 0)):  # the mechanism at 50,304 rows: run and base seeds
        _rewrite(route_run(root / "studies" / "vocab", base, 50304, never=49859, tag=f"-r{run}"), run=run)
    fft = bio_run(root / "studies" / "vocab", "fft", 0, t0=(0.9, 0.2, 0.3, 0.3))
    r = json.loads((fft / "result.json").read_text())
    r["vocab"], r["config"]["model"]["vocab"] = {"tokenizer": 1045, "model": 50304}, 50304
    write_result(fft, r)
    for tau in (0.5, -1.0):
        for base in (0, 1):
            route_run(root / "studies" / "tau", base, 1045, never=600, tau=tau, tag=f"-t{tau}")
    for method in ("fft", "llama-pro", "scale-preserve", "scale-adapt", "scale-route"):  # CPT on 2 bases
        for base in (0, 1):
            cpt_run(root, method, base, 1e-3, 12.0 + base, 20.0 - base)
    for seed in (0, 1, 2):  # the real preset: 3 run seeds with the whole held-out sets, and a single run
        cpt_heldout(cpt_run(root, "fft", 0, 1e-4, 42.0, 4.6, tag=f"-real{seed}"), 41.0 + seed, 6.0 + seed, seed)
    single = cpt_run(root, "fft", 0, 1e-3, 168.0, 4.8, tag="-real-single")
    r = json.loads((single / "result.json").read_text())
    r["preset"], r["config"]["eval"] = "real", {"every": 15}
    write_result(single, r)
    ensemble_study(root / "studies" / "ensemble")
    for base in (0, 1):
        for i, init in enumerate((["svd", "zero"], ["rnd", "zero"])):
            cpt_study(root, "init", base, {"init": init}, 11.0 + i, 20.0 + i + base, f"i{i}")
        for l_fp in (0, 1, 2):
            cpt_study(root, "l_fp", base, {"l_fp": l_fp}, 14.0 - l_fp + base, 18.0 + l_fp, f"l{l_fp}")
        for collab in ("attn", "mlp"):
            cpt_study(root, "collab", base, {"l_fp": 2, "collab": [collab]}, 12.0 + base, 20.0, collab)
    return root


DRAW = {  # the families of the figures the documentation shows: stem prefix -> (draw, experiment)
    "fig8_bio": (draw_fig8, BIO_REPORT), "fig9_cpt": (draw_fig9, CPT_REPORT),
    "fig4_width_vs_depth": (draw_fig4, CPT_REPORT), "fig5_init_pairs": (draw_fig5, CPT_REPORT),
    "fig6_l_fp": (draw_fig6, CPT_REPORT), "fig7_collab_modules": (draw_fig7, CPT_REPORT),
    "frontier_bio": (draw_frontier, BIO_REPORT), "frontier_cpt": (draw_frontier, CPT_REPORT),
    "route_mechanism": (draw_route_mechanism, BIO_REPORT),
    "fig8_ensemble": (draw_ensemble, BIO_REPORT), "frontier_ensemble": (draw_ensemble, BIO_REPORT),
    "fig8_route_": (lambda plot, spec: (f for s in ("tau", "vocab") for f in draw_route_study(plot, spec, s)),
                    BIO_REPORT),
}


def documented_figures() -> set[str]:
    """The stems of the paper_figures/*.png that a Markdown file of the repository shows."""
    found = set()
    for md in [*REPO.glob("*.md"), *REPO.glob("docs/**/*.md"), *REPO.glob("results/**/*.md")]:
        found |= set(re.findall(r"paper_figures/([\w.-]+)\.png", md.read_text()))
    return found


def test_every_figure_the_docs_show_belongs_to_a_family_checked_here():
    stems = documented_figures()
    assert len(stems) >= 10
    assert not [s for s in stems if not any(s.startswith(prefix) for prefix in DRAW)]


@pytest.mark.parametrize("family", sorted(DRAW))
def test_drawn_figures_are_readable_at_readme_width_and_name_their_bands_units(results, family):
    draw, spec = DRAW[family]
    figures = list(draw(Plot.of(results), spec))
    assert figures, f"the synthetic results draw no {family} figure"
    problems = []
    for stem, fig in figures:
        try:
            problems += check(fig, stem)
            if family not in ("fig8_bio",) and stem != "fig8_ensemble":  # fig8_bio: a panel per group, its title
                # names the unit; fig8_ensemble: means without bands (they overlap), the intervals in its tables
                assert any(isinstance(c, PolyCollection) for ax in fig.axes for c in ax.collections) or any(
                    ax.containers for ax in fig.axes), f"{stem}: the synthetic replicates draw no band"
        finally:
            plt.close(fig)
    assert not problems, "\n".join(problems)


@pytest.mark.slow  # about the committed figures, like test_committed_results_still_plot: fails until they are redrawn
def test_the_committed_figures_the_docs_show_are_readable_at_readme_width():
    """What the READMEs show (paper_figures, regenerated by `scalecl plot --results results --out paper_figures`)
    keeps the size rule: a figure drawn before the rule fails here until it is drawn again."""
    problems = []
    for stem in sorted(documented_figures()):
        problems += [f"{stem}: {p}" for p in size_problems(Image.open(REPO / "paper_figures" / f"{stem}.png").size)]
    assert not problems, "\n".join(problems)


def test_the_rules_catch_what_they_are_for():
    fig, ax = plt.subplots(figsize=(20, 4))
    try:
        (ln,) = ax.plot([0, 1], [0, 1], color="tab:blue", label="FFT (n=3)")
        ax.fill_between([0, 1], [0, 0], [1, 1], color="tab:blue", alpha=0.2)
        ax.text(0, 0, "tiny", fontsize=5)
        problems = check(fig, "bad")
        assert any("px wide" in p for p in problems) and any("tiny" in p for p in problems)
        assert any("band in" in p for p in problems)
        ln.set_label("FFT (3 base seeds)")
        assert not unnamed_bands(fig)
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------------------------------------
# the fixes behind the rules


def test_method_colours_are_far_apart_and_a_methods_settings_are_shades_of_it():
    def lab(c) -> tuple[float, float, float]:  # CIE L*a*b* (D65), to compare colours as they are seen
        def lin(v):
            return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4
        r, g, b = (lin(v) for v in to_rgb(c))
        xyz = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.9505, 0.2126 * r + 0.7152 * g + 0.0722 * b, (
            0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.089

        def f(t):
            return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116
        fx, fy, fz = (f(v) for v in xyz)
        return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)

    def delta(a, b) -> float:
        return math.dist(lab(a), lab(b))

    assert min(delta(COLORS[a], COLORS[b]) for a in METHOD_ORDER for b in METHOD_ORDER if a < b) > 25
    assert delta(COLORS["scale-adapt"], COLORS["scale-route"]) > 60  # drawn side by side in every figure
    for n in (2, 3, 4):
        tones = shades(COLORS["scale-route"], n)
        assert to_rgb(tones[0]) == to_rgb(COLORS["scale-route"])
        assert min(delta(a, b) for i, a in enumerate(tones) for b in tones[i + 1:]) > 10


def test_route_study_reference_is_over_base_seeds_never_pooled_with_run_seeds(tmp_path):
    """The FFT reference with run seeds on one base and single runs on others is the mean of its base seeds,
    each base's run seeds averaged first, and its label says so."""
    vocab = tmp_path / "studies" / "vocab"
    for base, run, end in ((0, 0, 0.1), (0, 1, 0.3), (1, 0, 0.6)):
        d = bio_run(vocab, "fft", base, t0=(0.9, 0.5, 0.5, end))
        _rewrite(d, run=run)
        r = json.loads((d / "result.json").read_text())
        r["vocab"], r["config"]["model"]["vocab"] = {"tokenizer": 1045, "model": 50304}, 50304
        write_result(d, r)
        d.rename(d.with_name(d.name + f"-r{run}"))
    for base in (0, 1):
        route_run(vocab, base, 50304, never=49859)
    route_run(vocab, 0, 1045, never=600, tag="-small")
    fig = dict(draw_route_study(Plot.of(tmp_path), BIO_REPORT, "vocab"))["fig8_route_vocab"]
    try:
        ref = [ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("FFT")]
        assert [ln.get_label() for ln in ref] == ["FFT, vocab=50,304 (padded) (mean of 2 base seeds)"]
        assert float(ref[0].get_ydata()[-1]) == pytest.approx(40.0)  # (0.2 + 0.6) / 2, not (0.1+0.3+0.6) / 3
    finally:
        plt.close(fig)


def test_route_study_fft_reference_is_one_build_of_each_base_seed_never_pooled(tmp_path):
    """The main FFT runs as a Route study's reference: base 0's two run seeds averaged into its value first, and
    base 1's second build (stages trained again elsewhere: another base) left out of the mean."""
    for base, run, end in ((0, 0, 0.1), (0, 1, 0.3), (1, 0, 0.6)):
        _rewrite(bio_run(tmp_path, "fft", base, t0=(0.9, 0.5, 0.5, end), date=f"2026-12-0{1 + run}T00:00:00"),
                 run=run)
    d = bio_run(tmp_path / "elsewhere", "fft", 1, t0=(0.9, 0.5, 0.5, 1.0), date="2026-12-09T00:00:00")
    _rewrite(d, run=1)  # base 1's run seed 1, on a second build of its stages
    r = json.loads((d / "result.json").read_text())
    r |= {"stage1": {"final_loss": 0.41}, "stage2": {"final_loss": 0.01}}
    write_result(d, r)
    for base in (0, 1):
        route_run(tmp_path / "studies" / "tau", base, 1045, never=600)
    fig = dict(draw_route_study(Plot.of(tmp_path), BIO_REPORT, "tau"))["fig8_route_tau"]
    try:
        (ref,) = [ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("FFT")]
        assert ref.get_label() == "FFT, main runs (2 base seeds)"
        assert float(ref.get_ydata()[-1]) == pytest.approx(40.0)  # (0.2 + 0.6) / 2: base 1's 1.0 is another build
    finally:
        plt.close(fig)


def test_route_study_titles_name_every_tokenizer_size(tmp_path):
    """Each base seed trains its own tokenizer: a row of panels says the sizes of all its runs, not one run's."""
    tau = tmp_path / "studies" / "tau"
    for base, size in ((0, 1045), (1, 1043)):
        d = route_run(tau, base, 1045, never=600)
        r = json.loads((d / "result.json").read_text())
        r["vocab"] = {"tokenizer": size, "model": size}
        write_result(d, r)
    route_run(tau, 0, 50304, never=49859, tag="-big")
    fig = dict(draw_route_study(Plot.of(tmp_path), BIO_REPORT, "tau"))["fig8_route_tau"]
    try:
        assert fig.axes[0].get_title() == "(a) Task 0 (held-out) accuracy\n1,043-1,045 vocab rows (tokenizer's size)"
    finally:
        plt.close(fig)


def test_frontier_uses_the_whole_held_out_sets_where_runs_have_them(results):
    """The real preset's replicates are drawn and tabled at their whole held-out sets (result.json heldout), in
    a panel of their own; runs with only their slices in another; legends name methods, not config keys."""
    table = frontier_table(Plot.of(results), CPT_REPORT).query("preset == 'real'")
    whole = table[table["measure"].str.startswith("whole held-out sets")]
    assert len(whole) == 1 and whole["new_ppl_end"].iloc[0] == pytest.approx(7.0)  # 6, 7, 8: not the slice 4.6
    assert whole["old_ppl_end"].iloc[0] == pytest.approx(42.0) and whole["unit"].iloc[0] == "3 run seeds of base 0"
    assert table[~table.index.isin(whole.index)]["new_ppl_end"].tolist() == pytest.approx([4.8])
    fig = dict(draw_frontier(Plot.of(results), CPT_REPORT))["frontier_cpt"]
    try:
        titles = [ax.get_title() for ax in fig.axes if ax.axison]
        assert "preset 'real': whole held-out sets at the training length (result.json heldout)\n(intervals over 3 " \
               "run seeds of base 0)" in titles
        assert "preset 'real': evaluation slices (summary.*_ppl_end)" in titles
        legend = [t.get_text() for leg in [*fig.legends, *(ax.get_legend() for ax in fig.axes)] if leg
                  for t in leg.get_texts()]
        assert legend and not [x for x in legend if "eval." in x or "=" in x.replace("l_fp=", "")]
    finally:
        plt.close(fig)


def test_fig9_draws_each_method_at_its_presets_rate_and_rows_by_evaluation(results, tmp_path):
    """A run at another rate (its method's entry of the per-method rate table changed) is a frontier point,
    not a fig9 line; runs of one preset evaluated differently get a row of panels each, named in words."""
    for base in (0, 1):
        cpt_run(tmp_path, "fft", base, 1e-4, 12.0, 20.0)
        cpt_run(tmp_path, "scale-route", base, 1e-3, 11.0, 21.0)
        cpt_run(tmp_path, "fft", base, 3e-4, 14.0, 18.0)  # lr.fft=3e-4: another rate table
    fig = dict(draw_fig9(Plot.of(tmp_path), CPT_REPORT))["fig9_cpt_cpu"]
    try:
        names = [ln.get_label() for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")]
        assert names == ["FFT [lr=0.0001] (2 base seeds)", "SCALE-Route [lr=0.001] (2 base seeds)"]
        assert "frontier_cpt" in fig.texts[-1].get_text()
    finally:
        plt.close(fig)
    fig = dict(draw_fig9(Plot.of(results), CPT_REPORT))["fig9_cpt_real"]
    try:
        titles = [ax.get_title() for ax in fig.axes]
        assert len(fig.axes) == 4
        assert titles[0].endswith("slices at steps 0 and 20; whole held-out sets at the end (heldout_cpt)")
        assert titles[2].endswith("slices every 15 steps")
        names = [t.get_text() for t in fig.legends[0].get_texts()]
        assert names == ["FFT [lr=0.0001] (3 run seeds of base 0)", "FFT [lr=0.001]"]
    finally:
        plt.close(fig)


def test_fig6_draws_the_paired_differences_the_text_relies_on(results):
    """Fig. 6 (c, d): each l_fp minus the most preserving one on the same base, with the t interval over the base
    seeds of paired_table_fig6_l_fp, beside the unpaired levels (a, b)."""
    fig = dict(draw_fig6(Plot.of(results), CPT_REPORT))["fig6_l_fp"]
    try:
        ax = fig.axes[2]
        assert ax.get_title() == ("(c) forgetting PPL minus l_fp=2's, same base\n(paired: mean and 95% t interval "
                                  "over 2 base seeds)")
        mean = ax.containers[0].lines[0]
        # old_end = 14 - l_fp + base: the difference from l_fp = 2 is 2 - l_fp on both bases, so sd 0
        assert [float(v) for v in mean.get_xdata()] == [0, 1] and [float(v) for v in mean.get_ydata()] == [2, 1]
    finally:
        plt.close(fig)
