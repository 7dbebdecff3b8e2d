"""SCALE-Route's routing over training: the share of tokens (and of scored answer positions) each Route run
sends to the preserve or adapt path per evaluation set, and the router's score at the answer position
against tau. Runs that recorded less (older runs) draw what they have."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from scalecl.report.context import Plot
from scalecl.report.draw import (
    BAND_ALPHA,
    UNIT_NOTE,
    Drawn,
    has_values,
    mean_curve,
    mean_frame,
    missing_note,
    save_figures,
    unit_frames,
    with_inputs,
)
from scalecl.report.registry import figure
from scalecl.report.runs import metrics_or_none, replicate_groups
from scalecl.report.settings import figure_groups, line_label, route_tau
from scalecl.report.spec import ReportSpec

QUANTILE_BANDS = (("q05", "q95", 0.15), ("q25", "q75", 0.3))  # (low, high, alpha): the router-score bands
PATHS = (("preserve", "-"), ("adapt", "--"))


def _route_key(m: pd.DataFrame, prefix: str, path: str) -> str | None:
    """The column holding the share of a slice's tokens routed to a path (`prefix/route_<path>`; Task 0 also
    reads legacy keys), or None."""
    for key in (f"{prefix}/route_{path}",) + ((f"route_{path}",) if prefix == "task0" else ()):
        if has_values(m, key):
            return key
    return None


def route_series(m: pd.DataFrame, prefix: str, path: str) -> pd.Series | None:
    """Share of a slice's tokens routed to a path, or None."""
    key = _route_key(m, prefix, path)
    return m[key] if key is not None else None


def answer_preserve(m: pd.DataFrame, task: str) -> pd.Series | None:
    key = f"{task}/answer/route_preserve"
    return m[key] if has_values(m, key) else None


def _route_runs(plot: Plot, runs: pd.DataFrame) -> list[tuple[pd.DataFrame, pd.DataFrame, list[pd.DataFrame]]]:
    """SCALE-Route replicate groups (a study: runs) with metrics: (the group's runs that have them, the mean of
    their units' metrics per step, the units: its base seeds with each base's run seeds averaged, else its run
    seeds; draw.unit_frames). Runs without a metrics file are left out."""
    picked = []
    for g in replicate_groups(runs[runs["method"] == "scale-route"]):
        ms = [metrics_or_none(plot, d) for d in g["dir"]]
        g = g[[m is not None for m in ms]]
        if len(g):
            units, _ = unit_frames(g, [m for m in ms if m is not None])
            picked.append((g, mean_frame(units), units))
    return picked


def _route_band(ax, frames: list[pd.DataFrame], key: str | None, flip: bool, color) -> None:
    """The 95% t band of a routing share over >= 2 replicates (flip: of 1 - share), in percent."""
    c = mean_curve(frames, key) if key is not None and len(frames) >= 2 else None
    if c is not None and (c["n"] >= 2).any():
        lo, hi = (1 - c["hi"], 1 - c["lo"]) if flip else (c["lo"], c["hi"])
        ax.fill_between(c["step"], 100 * lo, 100 * hi, color=color, alpha=BAND_ALPHA / 2, lw=0)


def _score(m: pd.DataFrame, task: str, stat: str) -> pd.Series | None:
    key = f"{task}/answer/route_score/{stat}"
    return m[key] if has_values(m, key) else None


@figure("routing")
def fig_routing(plot: Plot, spec: ReportSpec) -> list[Path]:
    """Share of tokens each SCALE-Route run sends to the preserve / adapt path over training, per eval set.

    All tokens of each evaluation set (bio: the Task 0 and Task 1 slices; cpt: old- and new-domain text) and,
    where the experiment records it, the scored answer position (adapt = 1 - preserve there). One row per Route
    run of a group.
    """
    return save_figures(plot, draw_routing(plot, spec))


def draw_routing(plot: Plot, spec: ReportSpec) -> Drawn:
    """The routing figures: a row of panels per Route run (all tokens; the answer position where recorded)."""
    for tag, study, runs in figure_groups(plot, spec):
        picked = [(row, m, frames) for row, m, frames in _route_runs(plot, runs)
                  if any(route_series(m, p, "preserve") is not None for p, _, _ in spec.eval_sets)]
        if not picked:
            continue
        answers = spec.answer_positions and any(answer_preserve(m, t) is not None for _, m, _ in picked
                                                for t, _, _ in spec.eval_sets)
        ncols = 2 if answers else 1
        fig, axes = plt.subplots(len(picked), ncols, figsize=(5.6 * ncols + 1.6, 2.7 * len(picked) + 0.6),
                                 squeeze=False, sharey=True)
        for pick, ax_row in zip(picked, axes, strict=True):
            _routing_row(ax_row, pick, line_label(spec, study, pick[0]), spec, answers)
        for ax in axes[-1]:
            ax.set_xlabel(spec.step_label)
        handles, labels = max((ax.get_legend_handles_labels() for ax in axes.flat), key=lambda h: len(h[0]))
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
        r0 = picked[0][0].iloc[0]["result"]
        what = spec.routing_what + (spec.routing_answers_what if answers else "")
        tau = route_tau(r0)
        if study == "tau":
            what += "; tau per row"
        elif tau is not None:
            what += f"; tau={tau}"
        band = "\n" + UNIT_NOTE if any(len(frames) >= 2 for _, _, frames in picked) else ""
        fig.text(0.5, -0.01, what + (f"; study '{study}'." if study else ".") + band + "\n" + spec.caption(r0),
                 ha="center", va="top", fontsize=8, wrap=True)
        fig.tight_layout()
        yield f"routing_{tag}", with_inputs(fig, runs[runs["method"] == "scale-route"], f"routing_{tag}")


def _routing_row(ax_row, pick: tuple, name: str, spec: ReportSpec, answers: bool) -> None:
    """One routing row: per evaluation set and path the share routed (all tokens; with `answers` also the answer
    position), the mean over a group's replicates with its band."""
    _, m, frames = pick
    for (prefix, set_label, color), lw in zip(spec.eval_sets, (2.4, 1.2), strict=True):  # equal: both show
        for path, ls in PATHS:
            key = _route_key(m, prefix, path)
            if key is not None:
                ax_row[0].plot(m["step"], 100 * m[key], ls=ls, lw=lw, color=color, label=f"{set_label}, {path}")
                _route_band(ax_row[0], frames, key, False, color)
        y = answer_preserve(m, prefix) if answers else None
        if y is not None:
            for path, ls in PATHS:
                ax_row[1].plot(m["step"], 100 * (y if path == "preserve" else 1 - y), ls=ls,
                               lw=lw, color=color, label=f"{set_label}, {path}")
                _route_band(ax_row[1], frames, f"{prefix}/answer/route_preserve", path != "preserve", color)
    ax_row[0].set_title(f"{name}: all tokens" if spec.answer_positions else name, fontsize=9)
    if answers:
        ax_row[1].set_title(f"{name}: answer position", fontsize=9)
        if not ax_row[1].lines:
            ax_row[1].set_xlim(ax_row[0].get_xlim())
            ax_row[1].text(0.5, 0.5, "no answer-position record (older run)", ha="center",
                           va="center", transform=ax_row[1].transAxes, fontsize=8, color="grey")
    ax_row[0].set_ylabel("tokens routed (%)")
    for ax in ax_row:
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)


@figure("router_score")
def fig_router_score(plot: Plot, spec: ReportSpec) -> list[Path]:
    """The router's cosine at the answer position over training, against tau: why answers go where they do.

    Per Route run and task: median line, q25-q75 and q05-q95 bands, the mean dashed, tau dotted.
    """
    return save_figures(plot, draw_router_score(plot, spec))


def draw_router_score(plot: Plot, spec: ReportSpec) -> Drawn:
    """The router-score figures: a row per Route run with the score recorded, a panel per task."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    for tag, study, runs in figure_groups(plot, spec):
        picked, missing = [], []
        for g, m, frames in _route_runs(plot, runs):
            if any(_score(m, t, "q50") is not None for t, _, _ in spec.eval_sets):
                picked.append((g, m, len(frames)))
            else:
                missing.append(line_label(spec, study, g))
        if not picked:
            continue
        fig, axes = plt.subplots(len(picked), 2, figsize=(11.5, 2.7 * len(picked) + 0.6), squeeze=False,
                                 sharey=True)
        for (g, m, _), ax_row in zip(picked, axes, strict=True):
            name = line_label(spec, study, g)
            tau = route_tau(g.iloc[0]["result"])
            for ax, (task, task_label, color) in zip(ax_row, spec.eval_sets, strict=True):
                ax.set_title(f"{name}: {task_label}", fontsize=9)
                ax.grid(alpha=0.3)
                if tau is not None:
                    ax.axhline(tau, color="tab:red", ls=":", lw=1.2)
                med = _score(m, task, "q50")
                if med is None:
                    ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes,
                            fontsize=8, color="grey")
                    continue
                for lo, hi, alpha in QUANTILE_BANDS:
                    low, high = _score(m, task, lo), _score(m, task, hi)
                    if low is not None and high is not None:
                        ax.fill_between(m["step"], low, high, color=color, alpha=alpha, lw=0)
                ax.plot(m["step"], med, color=color, lw=1.6)
                mean = _score(m, task, "mean")
                if mean is not None:
                    ax.plot(m["step"], mean, color="black", lw=0.8, ls=(0, (3, 2)))
            ax_row[0].set_ylabel("router cosine")
        for ax in axes[-1]:
            ax.set_xlabel(spec.step_label)
        legend = [Line2D([], [], color="grey", lw=1.6, label="median"),
                  *(Patch(color="grey", alpha=alpha, lw=0, label=f"{lo}-{hi}") for lo, hi, alpha in
                    reversed(QUANTILE_BANDS)),
                  Line2D([], [], color="black", lw=0.8, ls=(0, (3, 2)), label="mean"),
                  Line2D([], [], color="tab:red", ls=":", lw=1.2, label="tau (preserve above)")]
        fig.legend(handles=legend, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
        r0 = picked[0][0].iloc[0]["result"]
        tau = route_tau(r0)
        tau_note = "" if study == "tau" or tau is None else f" (tau={tau})"
        fig.text(0.5, -0.01, "SCALE-Route: the router's score (the cosine it compares, per its 'router' "
                 "option) at the scored answer position (the last prompt token) of the Task 0 (held-out, "
                 "blue) and Task 1 (orange) evaluation slices; an answer goes to the preserve path when its "
                 f"score exceeds tau{tau_note}" + (f"; study '{study}'." if study else ".") + "\n"
                 + spec.caption(r0) + ("\nA group with replicates: each statistic averaged over the units its title names "
                                       "per step (base seeds, each base's run seeds averaged first, else run "
                                       "seeds)." if any(n >= 2 for _, _, n in picked) else "")
                 + missing_note(missing, "answer-position record"), ha="center", va="top", fontsize=8,
                 wrap=True)
        fig.tight_layout()
        yield f"router_score_{tag}", with_inputs(fig, runs[runs["method"] == "scale-route"], f"router_score_{tag}")
