"""SCALE-Route's mechanism: how much of each path's logits falls on vocabulary rows that are never a training
target, next to where the router sends those positions. The biography's figure (at the scored answer
positions, a row per Route setting) and the CPT table (at every evaluated position of both domains)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from scalecl.report.context import Plot
from scalecl.report.draw import (
    UNIT_NOTE,
    Drawn,
    _draw_mean,
    _figure_legend,
    _has,
    _save_all,
    _with_inputs,
    mean_curve,
    unit_frames,
)
from scalecl.report.registry import figure, table
from scalecl.report.runs import (
    RUN_COLUMNS,
    UNVERIFIED,
    _config_id,
    _lr_text,
    _metrics_or_none,
    _settings,
    inputs_text,
    load_runs,
    marked,
    study_names,
)
from scalecl.report.settings import ROUTER_ORDER, _tau, _vocab_key, _vocab_text
from scalecl.report.spec import EvalSet, ReportSpec
from scalecl.report.tables import write_table

NEVER_KEY = "{task}/answer/never_share_{path}/mean"
MECHANISM_PATHS = (("preserve", "-", "tab:green"), ("adapt", "--", "tab:purple"))
MECHANISM_CAPTION = (
    "SCALE-Route at the scored answer positions (the last prompt token) of each evaluation. (a, b) Share of the "
    "squared logit norm that falls on vocabulary rows never a training target (result.json never_target_rows of "
    "vocab.model rows), for the preserve path's logits (green, solid) and the adapt path's (purple, dashed), "
    "averaged over the "
    "answer positions of the Task 0 (held-out) and Task 1 slices (metrics.jsonl <task>/answer/never_share_<path>/"
    "mean; q05-q95 over the positions are recorded beside it). (c) Share of answer positions routed to preserve. "
    "(d) The router's score, mean over answer positions; tau dotted (preserve above). A row per Route setting "
    "(vocabulary rows, tau, router), from the main runs and the biography studies; a run found in several folders "
    "counts once; lr: the run's learning rate. (a, b) of a row share one y-axis, from the row's lowest to its highest "
    "mean with a tenth of that span (at least half a percentage point) beyond each, within 0-100%: shares near "
    "100% are drawn apart, not flattened (read the axis' values); a wider band is cut.")


def _has_never_share(m: pd.DataFrame, sets: tuple[EvalSet, ...]) -> bool:
    """Whether a run's metrics record the never-target share at the answer positions of some set and path."""
    return any(_has(m, NEVER_KEY.format(task=t, path=p)) for t, _, _ in sets for p, _, _ in MECHANISM_PATHS)


def route_runs(plot: Plot, spec: ReportSpec) -> pd.DataFrame:
    """Every SCALE-Route run of an experiment: the main runs, then each study's (load_runs rows)."""
    frames = [load_runs(plot, spec)] + [load_runs(plot, spec, study=s) for s in study_names(plot, spec)]
    frames = [f[f["method"] == "scale-route"] for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=RUN_COLUMNS)


def _mechanism_groups(plot: Plot, spec: ReportSpec) -> list[tuple[pd.DataFrame, list[pd.DataFrame]]]:
    """SCALE-Route runs (main and every study) that recorded the never-target share, as replicate groups
    (config without seeds and method options; one run per seed pair, the newest): (runs, their metrics)."""
    runs = route_runs(plot, spec)
    if runs.empty:
        return []
    runs["group"] = [_config_id(r, spec) for r in runs["result"]]
    runs = runs.sort_values("date", kind="stable").drop_duplicates(["group", "base_seed", "run_seed"], keep="last")
    out = []
    for _, g in runs.groupby("group", sort=False):
        picked = [(i, m) for i, m in zip(g.index, (_metrics_or_none(plot, d) for d in g["dir"]), strict=True)
                  if m is not None and _has_never_share(m, spec.eval_sets)]
        if picked:
            out.append((g.loc[[i for i, _ in picked]], [m for _, m in picked]))
    out.sort(key=lambda gm: _mechanism_key(gm[0].iloc[0]["result"]))
    return out


def _mechanism_key(r: dict) -> tuple:
    """Route settings in order: preset, vocabulary rows (the tokenizer's size first), tau, router."""
    key = _vocab_key(r)
    router = (r.get("method_options") or {}).get("router", "logit")
    return (r["preset"], 0 if key == "tokenizer" else key, _tau(r) if _tau(r) is not None else -math.inf,
            ROUTER_ORDER.index(router) if router in ROUTER_ORDER else len(ROUTER_ORDER), str(router))


def _mechanism_label(r: dict, presets: int) -> str:
    """A Route setting's name: its vocabulary rows (and how many are never a target), tau, router and learning
    rate."""
    never = r.get("never_target_rows")
    label = _vocab_text(_vocab_key(r), r) + (f" ({never:,} never a target)" if isinstance(never, int) else "")
    tau = _tau(r)
    label += (f", tau={tau:g}" if tau is not None else "") + f", router={(r.get('method_options') or {}).get('router', 'logit')}"
    label += f", lr={_lr_text(r)}" if _lr_text(r) else ""
    return marked((f"{r['preset']}: " if presets > 1 else "") + label, r)


def _mechanism_labels(groups: list[tuple[pd.DataFrame, list[pd.DataFrame]]], spec: ReportSpec) -> list[str]:
    """Each group's _mechanism_label; groups of one label (settings that differ elsewhere, another config) add
    what tells them apart, the setting label of the other figures (runs._settings) among them."""
    presets = len({g.iloc[0]["preset"] for g, _ in groups})
    labels = [_mechanism_label(g.iloc[0]["result"], presets) for g, _ in groups]
    out = list(labels)
    for label in {x for x in labels if labels.count(x) > 1}:
        twins = [i for i, x in enumerate(labels) if x == label]
        settings = _settings(pd.concat([groups[i][0] for i in twins]), spec)
        for i in twins:
            setting = settings[groups[i][0].index[0]]
            out[i] += f" [{setting}]" if setting else ""
    return out


@figure("route_mechanism")
def fig_route_mechanism(plot: Plot, spec: ReportSpec) -> list[Path]:
    """route_mechanism: never-target logit share per path, answer routing and router score (skipped when no run
    recorded the never-target share)."""
    return _save_all(plot, draw_route_mechanism(plot, spec))


def draw_route_mechanism(plot: Plot, spec: ReportSpec) -> Drawn:
    """The mechanism figure: a row per Route setting group, the mean over its units (base seeds, else run
    seeds) with t bands."""
    groups = _mechanism_groups(plot, spec)
    if not groups:
        return
    labels = _mechanism_labels(groups, spec)
    scored = any(_has(m, f"{t}/answer/route_score/mean") for _, ms in groups for m in ms
                 for t, _, _ in spec.eval_sets)
    ncols = 4 if scored else 3
    fig, axes = plt.subplots(len(groups), ncols, figsize=(4.2 * ncols + 1.8, 2.9 * len(groups) + 0.8),
                             squeeze=False)
    for ax_row, (g, ms), label in zip(axes, groups, labels, strict=True):
        units, note = unit_frames(g, ms)
        _mechanism_row(ax_row, spec.eval_sets, units, f"{label}; {note}", _tau(g.iloc[0]["result"]))
        ax_row[1].sharey(ax_row[0])
        ax_row[0].set_ylim(*_share_limits(ax_row[:2]))
    for col in range(2, ncols):  # routing and score: one scale down each column
        for ax in axes[1:, col]:
            ax.sharey(axes[0, col])
    for ax in axes[-1]:
        ax.set_xlabel(spec.step_label)
    _figure_legend(fig, axes.flat)
    band = "\n" + UNIT_NOTE if any(len(ms) >= 2 for _, ms in groups) else ""
    fig.text(0.5, -0.01, MECHANISM_CAPTION + band + "\n" + spec.caption(groups[0][0].iloc[0]["result"]),
             ha="center", va="top", fontsize=8, wrap=True)
    fig.tight_layout()
    runs = pd.concat([g for g, _ in groups])
    yield "route_mechanism", _with_inputs(fig, runs, "route_mechanism: a row per Route setting group")


def _share_limits(axes) -> tuple[float, float]:
    """The y-range of a row's never-target shares (in %): its lowest to its highest mean drawn, a tenth of that
    span (at least half a point) beyond each, within 0-100; a band wider than that is cut."""
    means = [float(v) for ax in axes for ln in ax.get_lines() for v in ln.get_ydata() if math.isfinite(v)]
    if not means:
        return 0.0, 100.0
    lo, hi = min(means), max(means)
    pad = max(0.1 * (hi - lo), 0.5)
    return max(0.0, lo - pad), min(100.0, hi + pad)


def _mechanism_row(ax_row, sets: tuple[EvalSet, ...], ms: list[pd.DataFrame], label: str, tau: float | None
                   ) -> None:
    """One Route setting: never-target share per path (Task 0, Task 1), answer routing, router score."""
    for i, (ax, (task, task_label, _)) in enumerate(zip(ax_row[:2], sets, strict=True)):
        for path, ls, color in MECHANISM_PATHS:
            curve = mean_curve(ms, NEVER_KEY.format(task=task, path=path))
            if curve is not None:
                _draw_mean(ax, curve, 100, color=color, ls=ls, lw=1.4, label=f"{path} path")
        panel = f"({'ab'[i]}) {task_label}: never-target share"
        ax.set_title(f"{label}\n{panel}" if i == 0 else panel, fontsize=8, loc="left")
        ax.set_ylabel("squared logit norm on never-target rows (%)", fontsize=8)
    for i, (task, task_label, color) in enumerate(sets):
        ls = "-" if i == 0 else "--"
        curve = mean_curve(ms, f"{task}/answer/route_preserve")
        if curve is not None:
            _draw_mean(ax_row[2], curve, 100, color=color, ls=ls, lw=1.4, label=f"{task_label} slice")
        curve = mean_curve(ms, f"{task}/answer/route_score/mean") if len(ax_row) > 3 else None
        if curve is not None:
            _draw_mean(ax_row[3], curve, color=color, ls=ls, lw=1.4, label=f"{task_label} slice")
    ax_row[2].set_title("(c) answer positions routed to preserve", fontsize=8, loc="left")
    ax_row[2].set_ylabel("answer positions (%)", fontsize=8)
    ax_row[2].set_ylim(-3, 103)
    if len(ax_row) > 3:
        if tau is not None:
            ax_row[3].axhline(tau, color="tab:red", ls=":", lw=1.2, label="tau (preserve above)")
        ax_row[3].set_title("(d) router score at the answer position", fontsize=8, loc="left")
        ax_row[3].set_ylabel("router cosine (mean)", fontsize=8)
    for ax in ax_row:
        ax.grid(alpha=0.3)


# In continual pre-training: at every evaluated position of both domains, the router's score and each path's
# share of its logit norm on the vocabulary rows the new-domain training text never uses (train-cpt with
# eval.never_tokens > 0).
CPT_MECHANISM_CAPTION = (
    "SCALE-Route in continual pre-training, at every position of each evaluation set (old = forgetting text, new = "
    "learning text): share of positions routed to preserve (the averaged branch); the router's score (cosine of the "
    "two paths' logits, or of their probability vectors for the prob router), mean and 5/50/95% quantiles over "
    "the positions; and, for each path's logits (original channels), the share of the squared norm on vocabulary "
    "rows absent from the new-domain training text (never_rows of the rows), mean over positions "
    "(metrics.jsonl <set>/route_score/*, <set>/never_share_<path>/mean). One row per run and evaluation step, main "
    "runs and studies; a position goes to preserve when its score is above tau; lr: the run's learning rate.")


def route_mechanism_cpt(plot: Plot, spec: ReportSpec) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(table, runs): a row per SCALE-Route CPT run that measured its never rows, per evaluation step and set."""
    runs = route_runs(plot, spec)
    runs = runs[~runs["dir"].map(lambda d: Path(d).resolve()).duplicated()]  # a referenced run counts once
    rows, used = [], []
    for i, run in runs.iterrows():
        r, m = run["result"], _metrics_or_none(plot, run["dir"])
        never = (r.get("data") or {}).get("never_rows")
        if m is None or not isinstance(never, dict) or not _has(m, "new/never_share_preserve/mean"):
            continue
        used.append(i)
        opts = r.get("method_options") or {}
        for _, rec in m.iterrows():
            for split, _, _ in spec.eval_sets:
                row = {"preset": r["preset"], "lr": r.get("lr"), "tau": _tau(r), "router": opts.get("router", "logit"),
                       "base_seed": run["base_seed"], "run_seed": run["run_seed"], "step": int(rec["step"]),
                       "set": split, "never_rows": f"{never.get('never_rows')} of {never.get('rows')}"}
                row |= {UNVERIFIED: "yes"} if r.get(UNVERIFIED) else {}  # a column only when one is drawn so
                for key, col in (("route_preserve", "preserve_share"), ("route_score/mean", "score_mean"),
                                 ("route_score/q05", "score_q05"), ("route_score/q50", "score_q50"),
                                 ("route_score/q95", "score_q95"), ("never_share_preserve/mean", "never_share_preserve"),
                                 ("never_share_adapt/mean", "never_share_adapt")):
                    row[col] = rec.get(f"{split}/{key}", math.nan)
                rows.append(row)
    return pd.DataFrame(rows), runs.loc[used]


@table("route_mechanism_table")
def table_route_mechanism_cpt(plot: Plot, spec: ReportSpec) -> list[Path]:
    """route_mechanism_<name>: route_mechanism_cpt's table (nothing when no run measured its never rows)."""
    df, runs = route_mechanism_cpt(plot, spec)
    if df.empty:
        return []
    stem = f"route_mechanism_{spec.name}"
    return write_table(plot, df, stem, float_fmt="{:.4f}", caption=CPT_MECHANISM_CAPTION,
                       inputs=inputs_text(runs, f"{stem}: SCALE-Route CPT runs with never rows measured"))
