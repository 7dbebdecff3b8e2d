"""SCALE-Route's ensemble controls on the biography task (study 'ensemble'): is what keeps Task 0 the width, the
routing, or averaging with the frozen model?

The study's runs share their stages 1-2 per base seed: SCALE-Route at its default tau and at tau = -1 (every token
on the averaged branch), FFT, LoRA, LLaMA Pro and SCALE-Adapt as they are, each of them averaged with its frozen
stage-2 model in training (ensemble.mode=train: Route's averaged branch for any method) or only when scored
(ensemble.mode=eval), and LoRA and LLaMA Pro at other sizes (trainable parameters matched to Route's or
bracketing them). Figure `fig8_ensemble`: one column per method, its variants against the two Route lines, Task 0
above and Task 1 below, means over the base seeds with their t bands. Table `table_fig8_ensemble_means`: each
variant's end points and continual-learning metrics; the paired differences are `paired_bio_ensemble`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from scalecl.report.context import Plot
from scalecl.report.draw import (
    COLORS,
    UNIT_NOTE,
    Drawn,
    _draw_mean,
    _figure_legend,
    _save_all,
    _with_inputs,
    mean_curve,
)
from scalecl.report.registry import figure
from scalecl.report.runs import LABELS, _metrics_with, load_runs, study_names
from scalecl.report.settings import ENSEMBLE_STUDY, control_label, ensemble_mode
from scalecl.report.spec import ReportSpec
from scalecl.report.tables import write_study_means

FAMILIES = ("fft", "lora", "llama-pro", "scale-adapt")  # a column each
STYLE = {"none": "--", "train": "-", "eval": ":"}  # how a variant is averaged with its base


def _curves(plot: Plot, runs: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, dict]]:
    """Per variant (control_label): its runs and, per task, the mean curve over its base seeds."""
    out = {}
    for label, g in runs.groupby(runs["result"].map(control_label), sort=False):
        frames = [m for m in (_metrics_with(plot, d, "task0/acc", "task1/acc") for d in g["dir"]) if m is not None]
        if frames:
            out[label] = (g, {t: mean_curve(frames, f"{t}/acc") for t in ("task0", "task1")})
    return out


def _route_lines(curves: dict) -> list[tuple[str, dict, dict]]:
    """The Route variants, drawn in every column: the default tau black, another tau grey."""
    routes = [(label, c) for label, (g, c) in curves.items() if g.iloc[0]["method"] == "scale-route"]
    routes.sort(key=lambda x: x[0].endswith("(tau=-1)"))
    return [(label, c, {"color": "black" if i == 0 else "grey", "lw": 1.6}) for i, (label, c) in enumerate(routes)]


def draw_ensemble(plot: Plot, spec: ReportSpec) -> Drawn:
    """fig8_ensemble (see the module docstring); nothing when the study has no runs."""
    if ENSEMBLE_STUDY not in study_names(plot, spec):
        return
    runs = load_runs(plot, spec, study=ENSEMBLE_STUDY)
    curves = _curves(plot, runs)
    families = [f for f in FAMILIES if any(g.iloc[0]["method"] == f for g, _ in curves.values())]
    if not curves or not families:
        return
    fig, axes = plt.subplots(2, len(families), figsize=(2.9 * len(families) + 2.2, 5.2), squeeze=False,
                             sharex=True, sharey=True)
    routes = _route_lines(curves)
    for col, family in enumerate(families):
        mine = [(label, g, c) for label, (g, c) in curves.items() if g.iloc[0]["method"] == family]
        # the preset's size: the one with most variants (the others are a plain run at another size)
        default = Counter(label.split(" +")[0] for label, _, _ in mine).most_common(1)[0][0]
        for row, task in enumerate(("task0", "task1")):
            ax = axes[row, col]
            for label, c, style in routes:
                if c[task] is not None:
                    _draw_mean(ax, c[task], 100, label=label, **style)
            for label, g, c in mine:
                own = label.split(" +")[0] == default
                if c[task] is not None:
                    _draw_mean(ax, c[task], 100, label=label, lw=1.3,
                               ls=STYLE[ensemble_mode(g.iloc[0]["result"])] if own else "-.",
                               color=COLORS.get(family) if own else "tab:olive")
            ax.grid(alpha=0.3)
            ax.set_ylim(-3, 103)
        axes[0, col].set_title(LABELS.get(family, family), fontsize=10)
        axes[1, col].set_xlabel(spec.step_label)
    axes[0, 0].set_ylabel("Task 0 held-out acc. (%)")
    axes[1, 0].set_ylabel("Task 1 acc. (%)")
    _figure_legend(fig, axes.flat)
    n = runs["base_seed"].nunique()
    fig.text(0.5, -0.01, (f"Each method as trained (dashed), averaged with its frozen stage-2 model in training "
                          f"(solid) or only when scored (dotted), and at another size (olive, dash-dot), against "
                          f"SCALE-Route (black: default tau; grey: tau = -1, every token on the averaged branch). "
                          f"Lines: means over {n} base seeds. " + UNIT_NOTE + "\n" + spec.caption(runs.iloc[0]["result"])),
             ha="center", va="top", fontsize=7, wrap=True)
    fig.tight_layout()
    yield "fig8_ensemble", _with_inputs(fig, runs, f"fig8_ensemble: the runs of study '{ENSEMBLE_STUDY}'")


@figure("ensemble")
def fig_ensemble(plot: Plot, spec: ReportSpec) -> list[Path]:
    """fig8_ensemble and the study's table of means (its paired differences come with the summary tables)."""
    paths = _save_all(plot, draw_ensemble(plot, spec))
    if not paths:
        return []
    return paths + write_study_means(plot, spec, ENSEMBLE_STUDY, "table_fig8_ensemble")
