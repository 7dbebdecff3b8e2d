"""The learning-forgetting frontier: one method at several learning rates. Runs of a method that differ only
in their rate (config.lr_scale, config.stage3.lr, cpt's per-method config.lr) are separate replicate groups;
here they form one line of points, one point per rate. What is learned and what is kept comes from the
experiment's FrontierSpec."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker
import pandas as pd
from matplotlib.path import Path as MplPath
from matplotlib.transforms import Bbox

from scalecl.common.schema import named_dict
from scalecl.report.context import Plot
from scalecl.report.draw import (
    COLORS,
    FIG_WIDTH_IN,
    LINESTYLES,
    Drawn,
    legend_below,
    save_figures,
    shades,
    unit_name,
    with_inputs,
)
from scalecl.report.registry import figure
from scalecl.report.runs import (
    METHOD_KEYS,
    config_rest,
    dotted_json,
    group_label,
    inputs_text,
    load_runs,
    marked,
    marks,
    metrics_or_none,
    one_build,
    seeds_text,
    setting_parts,
    used_options,
    value_at,
    varying_keys,
)
from scalecl.report.spec import FrontierSpec, ReportSpec
from scalecl.report.stats import t_interval
from scalecl.report.tables import replicate_unit, table_cell, write_table

FRONTIER_CAPTION = (
    "Each point: one method at one learning rate (result.json `lr`, the rate its Task 1 / new-domain training "
    "used), the mean over its units with the 95% Student-t interval in both directions (mean ± t_0.975,n-1 · "
    "s/√n; none for one run): its base seeds (each base's run seeds averaged first), else the run seeds of its "
    "one base, never the two pooled; a panel's title names the unit its points share, else each point's label "
    "does. Points of a method (with its options and the rest of the config equal) are joined in learning-rate "
    "order where it has >= 2 rates; a method with one rate is a point alone. Each point is labelled with its "
    "rate. A method's lines (another option, such as tau) are shades of its colour and other line styles.")


def _threshold_column(threshold: float) -> str:
    return f"task0_at_task1_{round(100 * threshold)}"


def _frontier_config(r: dict, spec: ReportSpec) -> dict:
    """What a frontier line's runs share: the config without seeds, what run names leave out (spec.not_named),
    method tables and the stage-3 rate."""
    rest = {k: v for k, v in config_rest(r, spec, pair=True).items() if k not in METHOD_KEYS}
    ensemble = (r.get("config") or {}).get("ensemble")
    if ensemble is not None and named_dict({"ensemble": ensemble}, (), spec.named_when_set):
        rest["ensemble"] = ensemble  # averaged with the base: another line, not a point of the method's own
    if isinstance(rest.get("stage3"), dict):
        rest["stage3"] = {k: v for k, v in rest["stage3"].items() if k != "lr"}
    return rest


def _unverified_part(r: dict) -> list[str]:
    """What keeps a line of runs drawn unverified, or from a later results folder, apart from the first folder's
    proven runs' (nothing for those)."""
    return marks(r)


def _short_hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:8]


def frontier_runs(plot: Plot, spec: ReportSpec) -> pd.DataFrame:
    """The main runs with their frontier `line` (preset, config outside seeds, rates and method tables, method,
    method options), `point` (line and lr to 6 significant digits) and `measure` (what x and y were measured on:
    '' for the evaluation slices alone, else FrontierSpec.whole_text or part_text); one run per point and seed
    pair (the newest); `setting` what tells a line from the other lines of its method measured alike in its
    preset, `line_label` its name."""
    runs = load_runs(plot, spec)
    ok = [isinstance(r["lr"], int | float) and not isinstance(r["lr"], bool) and math.isfinite(r["lr"])
          for r in runs["result"]]
    for f in runs[[not x for x in ok]]["dir"] if len(runs) else []:
        plot.skip(Path(f) / "result.json", f"result {Path(f) / 'result.json'}: its lr is not a number")
    runs = runs[ok].copy() if len(runs) else runs
    if runs.empty:
        return runs
    runs["front"] = [_short_hash([spec.name, r["preset"], _frontier_config(r, spec)]) for r in runs["result"]]
    runs["line"] = [_short_hash([f, r["method"], used_options(r)] + _unverified_part(r))
                    for f, r in zip(runs["front"], runs["result"], strict=True)]
    runs["lr"] = [float(r["lr"]) for r in runs["result"]]
    whole = spec.frontier.whole
    runs["measure"] = [spec.frontier.whole_text if whole is not None and whole(r) is not None else ""
                       for r in runs["result"]]
    if runs["measure"].astype(bool).any():  # a preset with both: the slice values' panel says so
        runs["measure"] = runs["measure"].where(runs["measure"].astype(bool), spec.frontier.part_text)
    runs["point"] = runs["line"] + runs["lr"].map(lambda v: f"@{v:.6g}")
    newest = runs.sort_values("date", kind="stable").drop_duplicates(["point", "base_seed", "run_seed"], keep="last")
    runs = runs.loc[[i for i in runs.index if i in newest.index]]
    runs["setting"] = _frontier_settings(runs, spec)
    runs["line_label"] = [group_label(row) for _, row in runs.iterrows()]
    return runs.sort_values(["preset", "measure", "order", "setting", "lr"], kind="stable").reset_index(drop=True)


def _frontier_settings(runs: pd.DataFrame, spec: ReportSpec, most: int = 4) -> pd.Series:
    """Per run, what tells its frontier line from the others of its preset measured alike (one panel): config
    keys that differ across those lines and method options that differ across the method's lines ('' if
    none)."""
    labels = {}
    for _, g in runs.drop_duplicates("line").groupby(["preset", "measure"], sort=False):
        fronts = {row["front"]: dotted_json(_frontier_config(row["result"], spec)) for _, row in g.iterrows()}
        keys = varying_keys(list(fronts.values()))
        for _, row in g.iterrows():
            same = [dotted_json(used_options(r)) for r in g[g["method"] == row["method"]]["result"]]
            opts = dotted_json(used_options(row["result"]))
            parts = setting_parts(fronts[row["front"]], keys)
            parts += setting_parts(opts, varying_keys(same), options=True)
            label = ", ".join(parts[:most]) + (f", +{len(parts) - most} more" if len(parts) > most else "")
            labels[row["line"]] = marked(label, row["result"])
    return runs["line"].map(labels)


def _task0_when(m: pd.DataFrame | None, threshold: float) -> tuple[float, float] | None:
    """(step, Task 0 accuracy) at the first evaluated step where Task 1 accuracy reaches `threshold`, or None
    (never reached, or Task 0 not evaluated at that step)."""
    if m is None or "task1/acc" not in m or "task0/acc" not in m:
        return None
    hit = m[m["task1/acc"].notna() & (m["task1/acc"] >= threshold)]
    if hit.empty or pd.isna(hit["task0/acc"].iloc[0]):
        return None
    return float(hit["step"].iloc[0]), float(hit["task0/acc"].iloc[0])


def _threshold_columns(plot: Plot, g: pd.DataFrame, thresholds: tuple[float, ...]) -> dict:
    """Per threshold: Task 0 when Task 1 first reaches it, mean and t interval over the runs that reached it
    (`_reached` of `curves`, the runs with Task 0 and Task 1 curves), and the mean step it happened at."""
    curves = [m for m in (metrics_or_none(plot, d) for d in g["dir"])
              if m is not None and "task1/acc" in m and "task0/acc" in m]
    rec: dict = {"curves": len(curves)}
    for threshold in thresholds:
        col = _threshold_column(threshold)
        hits = [h for h in (_task0_when(m, threshold) for m in curves) if h is not None]
        iv = t_interval(v for _, v in hits)
        rec |= {col: iv.mean, f"{col}_ci_lo": iv.lo, f"{col}_ci_hi": iv.hi, f"{col}_reached": len(hits),
                f"{col}_step": t_interval(step for step, _ in hits).mean}
    return rec


def frontier_table(plot: Plot, spec: ReportSpec, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per frontier point (preset, method, setting, lr): n, seeds, then the frontier's x and y as mean
    with 95% t interval (`_ci_lo`, `_ci_hi`), then Task 0 when Task 1 first reaches each of its thresholds."""
    runs = frontier_runs(plot, spec) if runs is None else runs
    rows = []
    for _, g in runs.groupby("point", sort=False) if len(runs) else []:
        first = g.iloc[0]
        g = one_build(g)
        units, note = replicate_unit(g)
        rec = {"preset": first["preset"], "measure": first["measure"], "method": first["method"],
               "setting": first["setting"], "line": first["line_label"], "lr": first["lr"], "n": len(units),
               "interval": note, "unit": unit_name(g), "seeds": seeds_text(g)}
        for col, path, _ in (spec.frontier.x, spec.frontier.y):
            iv = t_interval(t_interval(_point_value(spec.frontier, r, col, path) for r in u["result"]).mean
                            for u in units)
            rec |= {col: iv.mean, f"{col}_ci_lo": iv.lo, f"{col}_ci_hi": iv.hi}
        if spec.frontier.thresholds:
            rec |= _threshold_columns(plot, g, spec.frontier.thresholds)
        rows.append(rec)
    return pd.DataFrame(rows)


def _point_value(frontier: FrontierSpec, r: dict, col: str, path: str) -> float | None:
    """A run's x or y: on the whole held-out sets where it has them (FrontierSpec.whole), else at `path`."""
    whole = frontier.whole(r) if frontier.whole is not None else None
    return whole[col] if whole is not None else value_at(r, path)


def _shown_frontier(df: pd.DataFrame, frontier: FrontierSpec) -> pd.DataFrame:
    """The Markdown/LaTeX view of a frontier table: 'mean ± half-width' cells, threshold cells with how many runs
    reached the threshold and at which step on average."""
    fmt = frontier.fmt
    cols = ["preset"] + (["measure"] if df["measure"].astype(bool).any() else []) + ["method"]
    cols += ["setting"] if df["setting"].astype(bool).any() else []
    shown = df[cols].copy()
    shown["lr"] = df["lr"].map(lambda v: f"{v:g}")
    shown[["n", "interval", "seeds"]] = df[["n", "interval", "seeds"]]
    for col, _, _ in (frontier.x, frontier.y):
        shown[col] = [table_cell(row, col, fmt) for _, row in df.iterrows()]
    for threshold in frontier.thresholds:
        col = _threshold_column(threshold)
        shown[f"Task 0 when Task 1 first reaches {threshold:g}"] = [
            (f"{table_cell(row, col, fmt)} ({row[f'{col}_reached']} of {row['curves']} runs reached it; mean step "
             f"{row[f'{col}_step']:.0f})" if row[f"{col}_reached"] else f"never (0 of {row['curves']} runs)")
            for _, row in df.iterrows()]
    return shown


@figure("frontier")
def fig_frontier(plot: Plot, spec: ReportSpec) -> list[Path]:
    """The learning-forgetting frontier frontier_<name>, with its table."""
    runs = frontier_runs(plot, spec)
    table = frontier_table(plot, spec, runs)
    if table.empty:
        return []
    written = save_figures(plot, draw_frontier(plot, spec, table, runs))
    return written + write_table(plot, table, f"frontier_{spec.name}", shown=_shown_frontier(table, spec.frontier),
                                 caption=f"{FRONTIER_CAPTION} {spec.frontier.note}",
                                 inputs=inputs_text(_as_groups(runs), f"frontier_{spec.name}: one row per point"))


def _as_groups(runs: pd.DataFrame) -> pd.DataFrame:
    """Frontier runs with their point as the replicate group (for inputs_text)."""
    return runs.assign(group=runs["point"]) if len(runs) else runs


def draw_frontier(plot: Plot, spec: ReportSpec, table: pd.DataFrame | None = None,
                  runs: pd.DataFrame | None = None) -> Drawn:
    """The frontier figure of an experiment: a panel per preset and measurement (its evaluation slices, or the
    whole held-out sets where runs have them), a line of points per method (and setting), two panels a row
    and one legend (in the free panel, else under them)."""
    runs = frontier_runs(plot, spec) if runs is None else runs
    table = frontier_table(plot, spec, runs) if table is None else table
    if table.empty:
        return
    panels = list(dict.fromkeys(zip(table["preset"], table["measure"], strict=True)))
    ncols = min(2, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    spare = nrows * ncols > len(panels)
    width = FIG_WIDTH_IN if ncols == 2 else 8.0
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, 4.4 * nrows + (0.0 if spare else 0.8)), squeeze=False)
    notes = []
    for ax, (preset, measure) in zip(axes.flat, panels, strict=False):
        part = table[(table["preset"] == preset) & (table["measure"] == measure)]
        notes.append(_frontier_panel(ax, part, spec.frontier))
        unit = part["unit"].iloc[0] if part["unit"].nunique() == 1 and part["n"].min() >= 2 else ""
        ax.set_title(f"preset '{preset}'" + (f": {measure}" if measure else "") + (f"\n(intervals over {unit})"
                     if unit else ""), fontsize=9)
    used = list(axes.flat)[:len(panels)]
    r0 = runs.iloc[0]["result"]
    fig.text(0.5, -0.01, f"{FRONTIER_CAPTION} {spec.frontier.better}\n{spec.caption(r0)}", ha="center", va="top",
             fontsize=8, wrap=True)
    if spare:  # the legend in the free panel
        legend_ax = list(axes.flat)[len(panels)]
        legend_ax.axis("off")
        entries = {lab: h for ax in used for h, lab in zip(*ax.get_legend_handles_labels(), strict=True)}
        legend_ax.legend(list(entries.values()), list(entries), loc="center", fontsize=8, frameon=False)
        fig.tight_layout()
    else:
        legend_below(fig, used, ncol=2 if ncols == 1 else 3)
    for ax, panel_notes in zip(used, notes, strict=True):  # where the points lie once the layout is final
        _place_labels(ax, panel_notes)
    stem = f"frontier_{spec.name}"
    yield stem, with_inputs(fig, _as_groups(runs), f"{stem}: a point per rate")


def _frontier_panel(ax, table: pd.DataFrame, frontier: FrontierSpec) -> list[tuple[float, float, str, str]]:
    """One panel's frontier: per line its points in lr order (joined when >= 2) with t-interval error bars, a
    method's lines in shades of its colour and other line styles; returns each point's label (x, y, text,
    colour), placed once the figure's layout is final (_place_labels). A label names its point's unit where the
    panel's points do not share one."""
    (x, _, xlabel), (y, _, ylabel) = frontier.x, frontier.y
    scale, log = frontier.scale, frontier.log
    counts = table["line"].value_counts()  # a method's line with the most rates keeps the method's colour
    lines = sorted(dict.fromkeys(table["line"]), key=lambda line: -counts[line])
    method_of = {line: table.loc[table["line"] == line, "method"].iloc[0] for line in lines}
    per_method = {m: [line for line in lines if method_of[line] == m] for m in dict.fromkeys(method_of.values())}
    shared_unit = table["unit"].nunique() == 1 and table["n"].min() >= 2
    notes = []
    for line, pts in table.groupby("line", sort=False):
        pts = pts.sort_values("lr")
        method = method_of[line]
        k = per_method[method].index(line)
        color = shades(COLORS.get(method, "black"), len(per_method[method]))[k]
        ls = LINESTYLES[k % len(LINESTYLES)] if len(pts) >= 2 else "none"
        ax.errorbar(scale * pts[x], scale * pts[y], xerr=_error_bars(pts, x, scale, log),
                    yerr=_error_bars(pts, y, scale, log), marker="os^D"[k % 4], ms=5, ls=ls, lw=1.3, capsize=3,
                    elinewidth=0.9, color=color, label=line)
        notes += [(scale * p[x], scale * p[y], f"{p['lr']:g}" + ("" if shared_unit or p["n"] < 2 else
                                                                 f" ({p['unit']})"), color) for _, p in pts.iterrows()]
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis, col in ((ax.xaxis, x), (ax.yaxis, y)):  # plain numbers; minor ticks labelled within a decade
            axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            narrow = table[col].max() < 10 * table[col].min()
            axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}") if narrow
                                     else matplotlib.ticker.NullFormatter())
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.tick_params(which="both", labelsize=8)
    ax.grid(alpha=0.3, which="both")
    return notes


def _place_labels(ax, notes: list[tuple[float, float, str, str]], fontsize: float = 7) -> None:
    """Each point's label (x, y, text, colour) at the place around it that overlaps no point and no label placed
    before, stays inside the axes and crosses the fewest lines and error bars, nearest first; one further out
    gets a thin leader line. Where no place is free, the one that overlaps least."""
    if not notes:
        return
    ax.get_xlim(), ax.get_ylim()  # the limits autoscaling gives, before reading where the points lie
    renderer, pt = ax.figure.canvas.get_renderer(), ax.figure.dpi / 72  # display pixels per point
    where = ax.transData.transform([(x, y) for x, y, _, _ in notes])
    taken = [Bbox.from_bounds(px - 3 * pt, py - 3 * pt, 6 * pt, 6 * pt) for px, py in where]
    drawn = _drawn_paths(ax)
    for (x, y, text, color), (px, py) in zip(notes, where, strict=True):
        probe = ax.annotate(text, (x, y), fontsize=fontsize)
        ext = probe.get_window_extent(renderer)
        probe.remove()
        w, h = ext.width / pt, ext.height / pt  # in points
        spots = [(dx, dy, ring) for ring, g in enumerate((4, 14, 26, 40, 60, 85)) for dx, dy in (
            (g, 1), (g, -h - 1), (-g - w, 1), (-g - w, -h - 1), (-w / 2, g), (-w / 2, -g - h),
            (g, g), (g, -g - h), (-g - w, g), (-g - w, -g - h))]
        boxes = [Bbox.from_bounds(px + dx * pt, py + dy * pt, w * pt, h * pt) for dx, dy, _ in spots]
        costs = [(_overlap(ax.bbox, box, taken), sum(p.intersects_bbox(box, filled=False) for p in drawn
                                                     if p.get_extents().overlaps(box)), i)
                 for i, box in enumerate(boxes)]
        best = min(costs)[2]
        dx, dy, ring = spots[best]
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), ha="left", va="bottom",
                    fontsize=fontsize, color=color,
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": color, "shrinkA": 0, "shrinkB": 3}
                    if ring else None)
        taken.append(boxes[best])


def _drawn_paths(ax) -> list[MplPath]:
    """The axes' lines and error bars as paths in display pixels (what a label should not cross)."""
    paths = [MplPath(ln.get_transform().transform(ln.get_xydata())) for ln in ax.get_lines()
             if ln.get_linestyle() != "None" and len(ln.get_xydata()) >= 2]
    for c in ax.collections:
        paths += [MplPath(c.get_transform().transform(seg)) for seg in c.get_segments() if len(seg) >= 2]
    return paths


def _overlap(inside: Bbox, box: Bbox, taken: list[Bbox]) -> float:
    """How much a label's box overlaps the boxes `taken` (their shared area), plus its own area when it leaves
    `inside` (the axes)."""
    out = 0.0 if inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1) else box.width * box.height
    return out + sum(b.width * b.height for b in (Bbox.intersection(box, t) for t in taken) if b is not None)


def _error_bars(pts: pd.DataFrame, col: str, scale: float, log: bool) -> list[list[float]]:
    """[below, above] the means of a column: its t interval (NaN for n = 1: no bar), cut where the quantity
    ends: perplexity (log axis) at 1, accuracy at 0 and 1."""
    lo, hi = pts[f"{col}_ci_lo"].clip(lower=1.0 if log else 0.0), pts[f"{col}_ci_hi"]
    hi = hi if log else hi.clip(upper=1.0)
    return [list(scale * (pts[col] - lo)), list(scale * (hi - pts[col]))]
