"""SCALE-Route's mechanism: how much of each path's logits falls on vocabulary rows that are never a training
target, next to where the router sends those positions. The biography's figure (at the scored answer
positions, a row per Route setting) and the CPT table (at every evaluated position of both domains)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D

from scalecl.report.context import Plot
from scalecl.report.draw import (
    BAND_ALPHA,
    FIG_WIDTH_IN,
    UNIT_NOTE,
    Drawn,
    draw_mean,
    has_values,
    mean_curve,
    save_figures,
    unit_frames,
    unit_label,
    with_inputs,
)
from scalecl.report.registry import figure, table
from scalecl.report.runs import (
    RUN_COLUMNS,
    config_id,
    group_settings,
    inputs_text,
    load_runs,
    lr_text,
    marked,
    marks,
    metrics_or_none,
    one_build,
    study_names,
)
from scalecl.report.settings import ROUTER_ORDER, route_tau, vocab_key, vocab_text
from scalecl.report.spec import EvalSet, ReportSpec
from scalecl.report.tables import write_table

NEVER_KEY = "{task}/answer/never_share_{path}/mean"
MECHANISM_PER_ROW = 5  # Route settings per row of panels: more lines and bands than this in a panel run together
MECHANISM_CAPTION = (
    "SCALE-Route at the scored answer positions (the last prompt token) of the held-out Task 0 slice, a line per "
    "Route setting (tau, the router where not logit, learning rate), a row of panels per vocabulary size (and per {per_row} settings). "
    "(a) The adapt path's share of its squared logit norm on the vocabulary rows never a training target "
    "(result.json never_target_rows), minus the preserve path's share on the same run, in percentage points "
    "(metrics.jsonl task0/answer/never_share_<path>/mean, means over the answer positions): how far training "
    "moves the adapt path's logits onto rows the task never uses; the preserve path is frozen, and its share "
    "itself (mean over the setting's runs and steps) ends each label. (b) Share of answer positions routed to the "
    "preserve path. (c) The router's score at the answer position, mean over answers; each setting's tau dotted "
    "in its colour (preserve above). Task 1's answers are recorded beside Task 0's (routing_* and router_score_* "
    "draw them). Main runs and the biography studies; a run found in several folders counts once, and a group "
    "keeps one build of each base seed (the build with most of its runs there; ties: the earliest), since two "
    "builds are two bases.")


def _has_never_share(m: pd.DataFrame, sets: tuple[EvalSet, ...]) -> bool:
    """Whether a run's metrics record the never-target share at the answer positions of some set and path."""
    return any(has_values(m, NEVER_KEY.format(task=t, path=p)) for t, _, _ in sets for p in ("preserve", "adapt"))


def route_runs(plot: Plot, spec: ReportSpec) -> pd.DataFrame:
    """Every SCALE-Route run of an experiment: the main runs, then each study's (load_runs rows)."""
    frames = [load_runs(plot, spec)] + [load_runs(plot, spec, study=s) for s in study_names(plot, spec)]
    frames = [f[f["method"] == "scale-route"] for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=RUN_COLUMNS)


def _mechanism_groups(plot: Plot, spec: ReportSpec) -> list[tuple[pd.DataFrame, list[pd.DataFrame]]]:
    """SCALE-Route runs (main and every study) that recorded the never-target share, as replicate groups
    (config without seeds and method options; one run per seed pair and build, the newest; one build of each
    base seed, runs.one_build): (runs, their metrics)."""
    runs = route_runs(plot, spec)
    if runs.empty:
        return []
    runs["group"] = [config_id(r, spec) for r in runs["result"]]
    runs = runs.sort_values("date", kind="stable").drop_duplicates(["group", "base_build", "base_seed", "run_seed"],
                                                                   keep="last")
    out = []
    for _, g in runs.groupby("group", sort=False):
        picked = [(i, m) for i, m in zip(g.index, (metrics_or_none(plot, d) for d in g["dir"]), strict=True)
                  if m is not None and _has_never_share(m, spec.eval_sets)]
        if picked:
            kept = one_build(g.loc[[i for i, _ in picked]])
            out.append((kept, [m for i, m in picked if i in set(kept.index)]))
    out.sort(key=lambda gm: _mechanism_key(gm[0].iloc[0]["result"]))
    return out


def _mechanism_key(r: dict) -> tuple:
    """Route settings in order: preset, vocabulary rows (the tokenizer's size first), router, tau, rate."""
    key = vocab_key(r)
    router = (r.get("method_options") or {}).get("router", "logit")
    lr = r.get("lr") if isinstance(r.get("lr"), int | float) else math.inf
    return (r["preset"], 0 if key == "tokenizer" else key,
            ROUTER_ORDER.index(router) if router in ROUTER_ORDER else len(ROUTER_ORDER), str(router),
            route_tau(r) if route_tau(r) is not None else -math.inf, lr)


def _mechanism_label(r: dict) -> str:
    """A Route setting's name within its vocabulary size: tau, the router when not the paper's (logit), and the
    learning rate."""
    tau, router = route_tau(r), (r.get("method_options") or {}).get("router", "logit")
    parts = [f"tau={tau:g}" if tau is not None else "", f"{router} router" if router != "logit" else "",
             f"lr={lr_text(r)}" if lr_text(r) else ""]
    return marked(", ".join(p for p in parts if p), r)


def _mechanism_labels(groups: list[tuple[pd.DataFrame, list[pd.DataFrame]]], spec: ReportSpec) -> list[str]:
    """Each group's _mechanism_label; groups of one label and vocabulary (settings that differ elsewhere) add
    what tells them apart, the setting label of the other figures (runs.group_settings) among them."""
    labels = [_mechanism_label(g.iloc[0]["result"]) for g, _ in groups]
    rows = [_row_key(g) for g, _ in groups]
    out = list(labels)
    for i, label in enumerate(labels):
        twins = [j for j, x in enumerate(labels) if x == label and rows[j] == rows[i]]
        if len(twins) > 1:
            settings = group_settings(pd.concat([groups[j][0] for j in twins]), spec)
            setting = settings[groups[i][0].index[0]]
            out[i] += f" [{setting}]" if setting else ""
    return out


def _row_key(g: pd.DataFrame) -> tuple:
    r = g.iloc[0]["result"]
    return r["preset"], vocab_key(r)


def _mechanism_rows(groups: list, labels: list[str]) -> list[tuple[str, list[tuple[pd.DataFrame, list, str]]]]:
    """The figure's rows: per preset and vocabulary size its settings in order, split evenly into rows of at most
    MECHANISM_PER_ROW; each row titled by its vocabulary (and preset, when there are several)."""
    keyed: dict[tuple, list] = {}
    for (g, ms), label in zip(groups, labels, strict=True):
        keyed.setdefault(_row_key(g), []).append((g, ms, label))
    presets = len({k[0] for k in keyed})
    rows = []
    for (preset, key), members in keyed.items():
        results = [r for g, _, _ in members for r in g["result"]]
        never = sorted({r["never_target_rows"] for r in results if isinstance(r.get("never_target_rows"), int)})
        title = vocab_text(key, *results) + (f"; {never[0]:,}" + (f"-{never[-1]:,}" if len(never) > 1 else "")
                                              + " never a target" if never else "")
        title = (f"preset '{preset}': " if presets > 1 else "") + title
        k = math.ceil(len(members) / MECHANISM_PER_ROW)
        size = math.ceil(len(members) / k)
        rows += [(title, members[i:i + size]) for i in range(0, len(members), size)]
    return rows


@figure("route_mechanism")
def fig_route_mechanism(plot: Plot, spec: ReportSpec) -> list[Path]:
    """route_mechanism: never-target logit share per path, answer routing and router score (skipped when no run
    recorded the never-target share)."""
    return save_figures(plot, draw_route_mechanism(plot, spec))


def draw_route_mechanism(plot: Plot, spec: ReportSpec) -> Drawn:
    """The mechanism figure: per vocabulary size a row of panels, a line per Route setting group (its mean over
    its units, base seeds else run seeds, with the t band), and the row's legend beside it."""
    groups = _mechanism_groups(plot, spec)
    if not groups:
        return
    rows = _mechanism_rows(groups, _mechanism_labels(groups, spec))
    task = spec.eval_sets[0][0]
    scored = any(has_values(m, f"{task}/answer/route_score/mean") for _, ms in groups for m in ms)
    ncols = 3 if scored else 2
    fig = plt.figure(figsize=(FIG_WIDTH_IN, 2.75 * len(rows) + 1.6))
    grid = fig.add_gridspec(len(rows), ncols + 1, width_ratios=[1.0] * ncols + [1.3])
    axes = []
    for i, (title, members) in enumerate(rows):
        ax_row = [fig.add_subplot(grid[i, j]) for j in range(ncols)]
        _mechanism_row(ax_row, task, members)
        legend_ax = fig.add_subplot(grid[i, ncols])
        legend_ax.axis("off")
        handles, names = ax_row[0].get_legend_handles_labels()
        handles += [Line2D([], [], color="grey", ls=":", lw=1.0)]
        names += ["(c) dotted: the setting's tau"]
        legend_ax.legend(handles, names, loc="center left", fontsize=7, title=title, title_fontsize=7.5,
                         frameon=False, alignment="left")
        axes.append(ax_row)
    for ax_row in axes[1:]:  # routing and score: one scale down each column
        for ax, top in zip(ax_row[1:], axes[0][1:], strict=True):
            ax.sharey(top)
    for ax in axes[-1]:
        ax.set_xlabel(spec.step_label)
    fig.text(0.5, -0.01, MECHANISM_CAPTION.format(per_row=MECHANISM_PER_ROW) + "\n" + UNIT_NOTE + "\n"
             + spec.caption(groups[0][0].iloc[0]["result"]), ha="center", va="top", fontsize=7, wrap=True)
    fig.tight_layout()
    runs = pd.concat([g for g, _ in groups])
    yield "route_mechanism", with_inputs(fig, runs, "route_mechanism: a line per Route setting group")


NEVER_GAP = "{task}/answer/never_gap"  # adapt minus preserve share, per run and step (added by _mechanism_row)


def _mechanism_row(ax_row, task: str, members: list[tuple[pd.DataFrame, list[pd.DataFrame], str]]) -> None:
    """One row: per setting (a colour each) the adapt path's never-target share minus the preserve path's on the
    same run, the answers routed to preserve and the router score with its tau, at the answer positions of
    `task`; each label names its units and the preserve path's share itself."""
    gap = NEVER_GAP.format(task=task)
    adapt, preserve = (NEVER_KEY.format(task=task, path=p) for p in ("adapt", "preserve"))
    for i, (g, ms, label) in enumerate(members):
        color = f"C{i % 10}"
        ms = [m.assign(**{gap: m[adapt] - m[preserve]}) if adapt in m and preserve in m else m for m in ms]
        units, _ = unit_frames(g, ms)
        shares = [float(v) for u in units if preserve in u for v in u[preserve].dropna()]
        name = unit_label(label, g) + (f"; preserve {100 * sum(shares) / len(shares):.1f}%" if shares else "")
        for ax, key, scale in ((ax_row[0], gap, 100), (ax_row[1], f"{task}/answer/route_preserve", 100),
                               (ax_row[2] if len(ax_row) > 2 else None, f"{task}/answer/route_score/mean", 1)):
            curve = mean_curve(units, key) if ax is not None else None
            if curve is not None:  # bands lighter where several lines share the panel
                draw_mean(ax, curve, scale, color=color, lw=1.4, label=name, alpha=BAND_ALPHA / 2)
        tau = route_tau(g.iloc[0]["result"])
        if len(ax_row) > 2 and tau is not None:
            ax_row[2].axhline(tau, color=color, ls=":", lw=1.0)
    ax_row[0].axhline(0, color="black", lw=0.8)
    ax_row[0].set_title("(a) adapt minus preserve path", fontsize=9, loc="left")
    ax_row[0].set_ylabel("never-target share of the squared\nlogit norm, difference (points)", fontsize=8)
    ax_row[1].set_title("(b) answers routed to preserve", fontsize=9, loc="left")
    ax_row[1].set_ylabel("answer positions (%)", fontsize=8)
    ax_row[1].set_ylim(-3, 103)
    if len(ax_row) > 2:
        ax_row[2].set_title("(c) router score at the answer", fontsize=9, loc="left")
        ax_row[2].set_ylabel("router cosine (mean)", fontsize=8)
    for ax in ax_row:
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)


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
        r, m = run["result"], metrics_or_none(plot, run["dir"])
        never = (r.get("data") or {}).get("never_rows")
        if m is None or not isinstance(never, dict) or not has_values(m, "new/never_share_preserve/mean"):
            continue
        used.append(i)
        opts = r.get("method_options") or {}
        for _, rec in m.iterrows():
            for split, _, _ in spec.eval_sets:
                row = {"preset": r["preset"], "lr": r.get("lr"), "tau": route_tau(r), "router": opts.get("router", "logit"),
                       "base_seed": run["base_seed"], "run_seed": run["run_seed"], "step": int(rec["step"]),
                       "set": split, "never_rows": f"{never.get('never_rows')} of {never.get('rows')}"}
                row |= {m: "yes" for m in marks(r)}  # a column only when one is drawn so (unverified, yours)
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
