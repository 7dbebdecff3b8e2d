"""Figures of the training logs (train_log.jsonl): the loss per step, raw and smoothed, and the learning rate
as the schedule set it, a line per method (per setting in a study). Older runs have no log: they are named in
the caption, not drawn."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker
import pandas as pd

from scalecl.report.context import Plot
from scalecl.report.draw import (
    COLORS,
    LINESTYLES,
    UNIT_NOTE,
    Drawn,
    draw_mean,
    mean_curve,
    missing_note,
    ordered_colors,
    save_figures,
    unit_frames,
    with_inputs,
)
from scalecl.report.registry import figure
from scalecl.report.runs import (
    config_rest,
    dotted_json,
    load_train_log,
    replicate_groups,
    setting_parts,
    varying_keys,
)
from scalecl.report.settings import figure_groups, line_label
from scalecl.report.spec import ReportSpec

SMOOTH_FRACTION = 0.02  # the loss's running mean spans this fraction of a run's steps,
SMOOTH_MIN = 5  # and at least this many, but never more than a quarter of the run (its shape must show)
LOG_RATIO = {"loss": 20, "lr": 3}  # a log y-axis when a figure's largest value exceeds its smallest this much


def _draw_train_log(plot: Plot, spec: ReportSpec, column: str, stem: str) -> Drawn:
    """One figure per group of runs: a per-step train_log.jsonl column against the step, a line per replicate
    group (main runs; its mean over replicates, shaded 95% t interval) or per run (a study). A study whose runs
    start from different bases (the init study's embedding variants) gets a panel per base."""
    for tag, study, runs in figure_groups(plot, spec):
        if column == "lr" and study is not None:
            continue  # a study's runs share one schedule; the main runs' figure shows it
        lines, missing = _train_log_lines(plot, spec, runs, study, column)
        if not lines:
            continue
        panels = list(dict.fromkeys(line[0] for line in lines))
        fig, axes = plt.subplots(len(panels), 1, figsize=(8, 4.2 if len(panels) == 1 else 3.0 * len(panels) + 0.8),
                                 squeeze=False, sharex=True)
        n_max = max(len(log) for *_, logs in lines for log in logs)
        window = max(1, min(n_max // 4, max(SMOOTH_MIN, round(SMOOTH_FRACTION * n_max))))
        names = list(dict.fromkeys(line[2] for line in lines))
        colors = dict(zip(names, ordered_colors(len(names)), strict=True))
        for ax, panel in zip(axes[:, 0], panels, strict=True):
            mine = [line for line in lines if line[0] == panel]
            styles = [colors[lab] if study is not None else COLORS.get(g.iloc[0]["method"]) for _, g, lab, _ in mine]
            _train_log_panel(ax, mine, styles, column, window)
            ax.set_title(panel if len(panels) > 1 else "", fontsize=9)
            ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5),
                      title=study if study is not None else None)
        axes[-1, 0].set_xlabel(spec.step_label)
        what = (f"Training loss per step (faint) and its centred running mean over {window} step(s) (bold)"
                if column == "loss" else "Learning rate per step as the schedule set it")
        title = f"{what}{spec.train_log_note}, from train_log.jsonl" + (f"; study '{study}'" if study else "") + "."
        if len(panels) > 1:
            title += " The study's runs start from different bases or settings: a panel per one (its title)."
        band = "\n" + UNIT_NOTE if any(len(logs) >= 2 for *_, logs in lines) else ""
        fig.text(0.5, -0.02, title + band + "\n" + spec.caption(lines[0][1].iloc[0]["result"])
                 + missing_note(missing, "train_log.jsonl"), ha="center", va="top", fontsize=8, wrap=True)
        fig.tight_layout()
        yield f"{stem}_{tag}", with_inputs(fig, runs, f"{stem}_{tag}: {column} per step from train_log.jsonl")


def _train_log_panel(ax, lines: list, colors: list, column: str, window: int) -> None:
    """One panel of a training-log figure: per line its mean over replicates (loss: faint raw, bold smoothed)."""
    for i, ((_, _, label, logs), color) in enumerate(zip(lines, colors, strict=True)):
        if column == "loss":
            raw = mean_curve(logs, column)
            ax.plot(raw["step"], raw["mean"], color=color, alpha=0.2, lw=0.6)
            smooth = [pd.DataFrame({"step": log["step"], column: log[column].astype(float).rolling(
                window, center=True, min_periods=1).mean()}) for log in logs]
            draw_mean(ax, mean_curve(smooth, column), color=color, lw=1.4, label=label)
        else:  # equal schedules coincide: a style per method keeps each visible
            draw_mean(ax, mean_curve(logs, column), color=color, lw=1.6, ls=LINESTYLES[i % len(LINESTYLES)],
                       label=label)
    vals = pd.concat([log[column] for *_, logs in lines for log in logs]).astype(float).dropna()
    if len(vals) and vals.min() > 0 and vals.max() / vals.min() > LOG_RATIO[column]:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylabel("training loss (per step)" if column == "loss" else "learning rate")
    ax.grid(alpha=0.3, which="both")


def _train_log_lines(plot: Plot, spec: ReportSpec, runs: pd.DataFrame, study: str | None, column: str
                     ) -> tuple[list[list], list[str]]:
    """The lines of a training-log figure, [panel, group, label, logs] each, and the labels of the groups that
    logged nothing. Labels equal within a panel get what tells their runs apart appended."""
    lines, missing = [], []
    for g in replicate_groups(runs):
        got = [load_train_log(plot, d) for d in g["dir"]]
        has = [log is not None and column in log and not log[column].isna().all() for log in got]
        if not any(has):
            missing.append(line_label(spec, study, g))
            continue
        g = g[has]  # the units of its mean and band: base seeds (run seeds averaged first), else run seeds
        logs = unit_frames(g, [log for log, ok in zip(got, has, strict=True) if ok])[0]
        variant = spec.study_variant if study is not None else None
        panel = variant(g.iloc[0]["result"]) if variant else ""
        lines.append([panel, g, line_label(spec, study, g), logs])
    for panel, label in {(line[0], line[2]) for line in lines}:
        same = [line for line in lines if (line[0], line[2]) == (panel, label)]
        if len(same) < 2:
            continue
        flats = [dotted_json({**config_rest(line[1].iloc[0]["result"], spec),
                        "options": line[1].iloc[0]["result"].get("method_options") or {}}) for line in same]
        keys = varying_keys(flats)
        for line, flat in zip(same, flats, strict=True):
            extra = ", ".join(setting_parts(flat, keys[:3]))
            line[2] = f"{label} [{extra}]" if extra else f"{label} #{Path(str(line[1].iloc[0]['dir'])).name}"
    return lines, missing


@figure("train_loss")
def fig_train_loss(plot: Plot, spec: ReportSpec) -> list[Path]:
    """Training loss per step, raw and smoothed, a line per method (per setting in a study): does it learn?"""
    return save_figures(plot, draw_train_loss(plot, spec))


def draw_train_loss(plot: Plot, spec: ReportSpec) -> Drawn:
    """The training-loss figures: per run a faint raw line and a bold smoothed one that carries its label."""
    return _draw_train_log(plot, spec, "loss", "train_loss")


@figure("lr_schedule")
def fig_lr_schedule(plot: Plot, spec: ReportSpec) -> list[Path]:
    """The learning-rate schedule each method trained with, as logged: rates differ per method (lr_scale)."""
    return save_figures(plot, draw_lr_schedule(plot, spec))


def draw_lr_schedule(plot: Plot, spec: ReportSpec) -> Drawn:
    """The learning-rate figures of the main runs (a study's runs share one schedule): a line per run."""
    return _draw_train_log(plot, spec, "lr", "lr_schedule")
