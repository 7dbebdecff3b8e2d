"""SCALE-Route's ensemble controls on the biography task (study 'ensemble'): is what keeps Task 0 the width, the
routing, or averaging with the frozen model?

The study's runs share their stages 1-2 per base seed: SCALE-Route at its default tau and at tau = -1 (every token
on the averaged branch), FFT, LoRA, LLaMA Pro and SCALE-Adapt as they are, each of them averaged with its frozen
stage-2 model in training (ensemble.mode=train: Route's averaged branch for any method) or only when scored
(ensemble.mode=eval), and LoRA and LLaMA Pro at other sizes (trainable parameters matched to Route's or
bracketing them), and the averaged controls at higher rates (matched learning). Figure `fig8_ensemble`: one column
per method, its variants against the two Route lines, Task 0 above and Task 1 below, means over the base seeds (no
bands: they overlap; the tables give the intervals). Table `table_fig8_ensemble_means`: each variant's end points
and continual-learning metrics; the paired differences are `paired_bio_ensemble`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.colors import to_rgb

from scalecl.report.context import Plot
from scalecl.report.draw import (
    COLORS,
    READ_WIDTH_IN,
    Drawn,
    legend_below,
    mean_curve,
    save_figures,
    with_inputs,
)
from scalecl.report.registry import figure
from scalecl.report.runs import LABELS, load_runs, metrics_with, study_names, value_at
from scalecl.report.settings import ENSEMBLE_STUDY, control_label, ensemble_mode
from scalecl.report.spec import ReportSpec
from scalecl.report.stats import t_interval
from scalecl.report.tables import write_study_means

FAMILIES = ("fft", "lora", "llama-pro", "scale-adapt")  # a column each
STYLE = {"none": "--", "train": "-", "eval": ":"}  # how a variant is averaged with its base
MARKERS = {"none": "o", "train": "D", "eval": "D"}  # the frontier's points by how they are averaged (eval: open)
LEGEND_COLUMNS = 3  # fig8_ensemble's legend, under its panels
SHADES = (1.0, 0.65, 0.4)  # a variant's colour at its lowest rate, then darker for each higher rate


@dataclass(frozen=True)
class Variant:
    """One setting of the study: its runs (one per base seed), what it is, and its mean curves per task."""

    label: str
    runs: pd.DataFrame
    method: str
    option: str  # what tells a size apart ('r=34', 'n=2', 'tau=-1'; '' for FFT and Adapt)
    mode: str  # ensemble.mode
    lr: float
    curves: dict


def _variants(plot: Plot, runs: pd.DataFrame) -> list[Variant]:
    """The study's settings (control_label) with their mean curves over the base seeds (runs with metrics)."""
    out = []
    for label, g in runs.groupby(runs["result"].map(control_label), sort=False):
        frames = [m for m in (metrics_with(plot, d, "task0/acc", "task1/acc") for d in g["dir"]) if m is not None]
        if not frames:
            continue
        r = g.iloc[0]["result"]
        option = control_label({**r, "lr": None}).split(" + ")[0]
        out.append(Variant(label, g, r["method"], option, ensemble_mode(r), float(r["lr"]),
                           {t: mean_curve(frames, f"{t}/acc") for t in ("task0", "task1")}))
    return out


def _styles(variants: list[Variant]) -> dict[str, dict]:
    """Line style per variant: Route black (its default tau) or grey; a method's own size in its colour, dashed as
    trained, solid averaged in training, dotted averaged when scored, darker at each higher rate; another size of
    the method olive, dash-dot."""
    styles: dict[str, dict] = {}
    routes = sorted((v for v in variants if v.method == "scale-route"), key=lambda v: v.option.endswith("tau=-1)"))
    for i, v in enumerate(routes):
        styles[v.label] = {"color": "black" if i == 0 else "grey", "lw": 1.6, "ls": "-"}
    for family in FAMILIES:
        mine = [v for v in variants if v.method == family]
        if not mine:
            continue
        own = Counter(v.option for v in mine).most_common(1)[0][0]  # the preset's size: most variants
        for v in mine:
            if v.option != own:
                styles[v.label] = {"color": "tab:olive", "lw": 1.3, "ls": "-."}
                continue
            rates = sorted({w.lr for w in mine if w.option == own and w.mode == v.mode})
            shade = SHADES[min(rates.index(v.lr), len(SHADES) - 1)]
            color = tuple(shade * c for c in to_rgb(COLORS.get(family, "tab:blue")))
            styles[v.label] = {"color": color, "lw": 1.3, "ls": STYLE[v.mode]}
    return styles


def draw_ensemble(plot: Plot, spec: ReportSpec) -> Drawn:
    """fig8_ensemble and frontier_ensemble (see the module docstring); nothing when the study has no runs."""
    if ENSEMBLE_STUDY not in study_names(plot, spec):
        return
    runs = load_runs(plot, spec, study=ENSEMBLE_STUDY)
    variants = _variants(plot, runs)
    families = [f for f in FAMILIES if any(v.method == f for v in variants)]
    if not variants or not families:
        return
    styles = _styles(variants)
    caption = spec.caption(runs.iloc[0]["result"])
    yield "fig8_ensemble", with_inputs(_curves_figure(variants, families, styles, spec, runs, caption), runs,
                                        f"fig8_ensemble: the runs of study '{ENSEMBLE_STUDY}'")
    yield "frontier_ensemble", with_inputs(_frontier_figure(variants, styles, runs, caption), runs,
                                            f"frontier_ensemble: the runs of study '{ENSEMBLE_STUDY}'")


def _curves_figure(variants: list[Variant], families: list[str], styles: dict, spec: ReportSpec,
                   runs: pd.DataFrame, caption: str):
    """Task 0 (top) and Task 1 (bottom) per Task 1 step, one column per method with the Route lines in each."""
    labels = {v.label for v in variants if v.method in (*families, "scale-route")}
    rows = -(-len(labels) // LEGEND_COLUMNS)  # the legend's rows under the panels (the figure keeps READ_WIDTH_IN)
    fig, axes = plt.subplots(2, len(families), figsize=(min(READ_WIDTH_IN - 0.5, 2.6 * len(families) + 0.9),
                                                         5.0 + 0.2 * rows), squeeze=False, sharex=True, sharey=True)
    for col, family in enumerate(families):
        shown = [v for v in variants if v.method in (family, "scale-route")]
        for row, task in enumerate(("task0", "task1")):
            ax = axes[row, col]
            for v in shown:
                if v.curves[task] is not None:
                    ax.plot(v.curves[task]["step"], 100 * v.curves[task]["mean"], label=v.label, **styles[v.label])
            ax.grid(alpha=0.3)
            ax.set_ylim(-3, 103)
        axes[0, col].set_title(LABELS.get(family, family), fontsize=10)
        axes[1, col].set_xlabel(spec.step_label)
    axes[0, 0].set_ylabel("Task 0 held-out acc. (%)")
    axes[1, 0].set_ylabel("Task 1 acc. (%)")
    n = runs["base_seed"].nunique()
    fig.text(0.5, -0.01, (f"Each method as trained (dashed), averaged with its frozen stage-2 model in training "
                          f"(solid) or only when scored (dotted), darker at higher rates, and at another size (olive, "
                          f"dash-dot), against SCALE-Route (black: default tau; grey: tau = -1, every token on the "
                          f"averaged branch). Lines: means over {n} base seeds, without bands (they overlap): the "
                          f"intervals are in table_fig8_ensemble_means and, paired with Route, paired_bio_ensemble.\n"
                          + caption), ha="center", va="top", fontsize=7, wrap=True)
    legend_below(fig, axes.flat, ncol=LEGEND_COLUMNS, fontsize=7.5)
    return fig


def _frontier_figure(variants: list[Variant], styles: dict, runs: pd.DataFrame, caption: str):
    """Full-range Task 0 against Task 1 at the end, a point per variant (mean over base seeds, 95% t intervals as
    bars), the rates of one variant joined."""
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    lines: dict[tuple, list] = {}
    for v in variants:
        xs = t_interval(value_at(r, "final.task1.acc") for r in v.runs["result"])
        ys = t_interval(value_at(r, "final.task0_heldout.acc") for r in v.runs["result"])
        st = styles[v.label]
        bars = [[100 * (iv.mean - iv.lo)] if iv.n >= 2 else None for iv in (xs, ys)]
        marker = "*" if v.method == "scale-route" else MARKERS[v.mode]
        ax.errorbar(100 * xs.mean, 100 * ys.mean, xerr=bars[0], yerr=bars[1], color=st["color"], marker=marker,
                    ms=10 if marker == "*" else 6, mfc="none" if v.mode == "eval" else st["color"], lw=0.7,
                    capsize=2, label=v.label, ls="none", alpha=0.9)
        lines.setdefault((v.method, v.option, v.mode), []).append((v.lr, 100 * xs.mean, 100 * ys.mean, st))
    for pts in lines.values():
        if len(pts) > 1:
            pts.sort()
            ax.plot([p[1] for p in pts], [p[2] for p in pts], color=pts[-1][3]["color"], ls=pts[-1][3]["ls"], lw=0.8)
    ax.set_xlabel("Task 1 learned: full-range accuracy at the end (%)")
    ax.set_ylabel("Task 0 kept: held-out full-range accuracy (%)")
    ax.set_xlim(-3, 103)
    ax.set_ylim(-3, 103)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=7, frameon=False)
    n = runs["base_seed"].nunique()
    ax.set_title(f"Means over {n} base seeds, 95% t intervals", fontsize=9)
    fig.text(0.5, -0.01, (f"Upper right is better. A point per setting: the mean over {n} base seeds with 95% t "
                          f"intervals over them as bars; a method's rates joined. Circles: the method as it is; "
                          f"diamonds: averaged with its frozen stage-2 model in training (filled) or when scored "
                          f"(open); stars: SCALE-Route.\n" + caption),
             ha="center", va="top", fontsize=7, wrap=True)
    fig.tight_layout()
    return fig


@figure("ensemble")
def fig_ensemble(plot: Plot, spec: ReportSpec) -> list[Path]:
    """fig8_ensemble, frontier_ensemble and the study's table of means (its paired differences come with the
    summary tables)."""
    paths = save_figures(plot, draw_ensemble(plot, spec))
    if not paths:
        return []
    return paths + write_study_means(plot, spec, ENSEMBLE_STUDY, "table_fig8_ensemble")
