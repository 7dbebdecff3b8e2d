"""The biography experiment's own figure (paper Fig. 8: Task 0 / Task 1 accuracy per Task 1 step) and what
its ReportSpec refers to: the caption of a biography run, its evaluation slices, the questions in a slice."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from scalecl.report.context import Plot
from scalecl.report.draw import (
    FIG_WIDTH_IN,
    UNIT_NOTE,
    Drawn,
    draw_mean,
    group_units,
    mean_curve,
    save_figures,
    unit_label,
    with_inputs,
)
from scalecl.report.registry import figure
from scalecl.report.runs import group_label, load_runs, replicate_groups, value_at
from scalecl.report.spec import ReportSpec
from scalecl.report.stats import t_interval

# Paper Sec. 5.2 / Fig. 8, quoted for comparison (the paper gives these in prose, not as a table)
PAPER_FIG8 = ("paper (Pythia-160M, 100k people): FFT and LLaMA Pro Task 0 fall to ~15% within 200 steps; "
              "SCALE-Route stays at 100% for 4,000 steps and ends at 36.9%")
# the evaluation slices: (metrics prefix, label, colour)
TASKS = (("task0", "Task 0 (held-out)", "tab:blue"), ("task1", "Task 1", "tab:orange"))


def bio_caption(r: dict) -> str:
    """What a biography run trained on: people, model, Task 1 steps, batch and rate, the evaluation slices."""
    d, m, s3 = r["data"], r["config"]["model"], r["config"]["stage3"]
    return (f"preset '{r['preset']}': {d['n_bio']:,} people pre-trained, {d['n_bio'] // 2:,} QA-trained (Task 0), "
            f"{d['n_task1']:,} new (Task 1); GPT-NeoX d={m['hidden']}, {m['layers']} layers; Task 1: "
            f"{s3['steps']} steps x batch {s3['batch']}, FFT lr {s3['lr']:g}. Accuracy on "
            f"{r['config']['eval']['slice_people']}-person slices.")


def slice_questions(r: dict) -> int | None:
    """Questions in one evaluation slice: slice_people x the attributes asked per person (the keys of
    priors.task0_heldout besides 'pooled'); None when the result does not say."""
    attrs = [k for k in (value_at(r, "priors.task0_heldout") or {}) if k != "pooled"]
    people = value_at(r, "config.eval.slice_people")
    return people * len(attrs) if attrs and isinstance(people, int) else None


@figure("fig8")
def fig8(plot: Plot, spec: ReportSpec) -> list[Path]:
    """Task 0 / Task 1 first-token accuracy vs Task 1 steps, one panel per method (paper Fig. 8)."""
    return save_figures(plot, draw_fig8(plot, spec))


def draw_fig8(plot: Plot, spec: ReportSpec) -> Drawn:
    """Paper Fig. 8 per preset: a panel per replicate group (method), titled by its label, in method order;
    the mean over replicates with its t-interval band."""
    runs = load_runs(plot, spec)
    for preset, group in runs.groupby("preset", sort=False):
        reps = replicate_groups(group)
        n = len(reps)
        ncols = min(4, n)
        nrows = math.ceil(n / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(FIG_WIDTH_IN, 2.6 * nrows + 0.8), squeeze=False,
                                 sharey=True)
        for ax, g in zip(axes.flat, reps, strict=False):
            g, units = group_units(plot, g, "task0/acc", "task1/acc")
            if units:  # else each run is recorded as skipped
                _fig8_panel(ax, g, units, spec)
        for ax in axes[:, 0]:
            ax.set_ylabel("first-token acc. (%)")
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", ncol=3, frameon=False, bbox_to_anchor=(0.5, 1.0))
        first = group.iloc[0]["result"]
        band = "\n" + UNIT_NOTE if any(len(g) >= 2 for g in reps) else ""
        fig.text(0.5, -0.02, spec.caption(first) + "\n" + PAPER_FIG8 + band, ha="center", va="top", fontsize=8,
                 wrap=True)
        fig.tight_layout(rect=(0, 0, 1, 0.96))
        stem = f"fig8_{spec.name}_{preset}"
        yield stem, with_inputs(fig, group, f"{stem}: Task 0 / Task 1 accuracy per step")


def _fig8_panel(ax, g: pd.DataFrame, units: list[pd.DataFrame], spec: ReportSpec) -> None:
    """One Fig. 8 panel: Task 0 and Task 1 accuracy (mean and band over the group's units, named in its title:
    base seeds, else run seeds), the chance floor."""
    prior = t_interval(r["priors"]["task0_heldout"]["pooled"] for r in g["result"]).mean
    for task, label, color in spec.eval_sets:
        draw_mean(ax, mean_curve(units, f"{task}/acc"), 100, marker=".", ms=2, color=color, label=label)
    ax.axhline(100 * prior, color="grey", ls=":", lw=1, label="Task 0 chance floor")
    name, unit = group_label(g.iloc[0]), unit_label("", g).strip()
    ax.set_title(f"{name}\n{unit}" if unit else name, fontsize=8.5)
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.set_xlabel(spec.step_label, fontsize=9)
    ax.tick_params(labelsize=8)
