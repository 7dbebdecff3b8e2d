"""Drawing helpers shared by the figure families: colours, mean curves with their t-interval bands, legends,
replicates pooled into one line, and saving a figure (PNG and PDF unless the plot asks for others) with the runs it drew (`<stem>.inputs.txt`).

Every figure has a `draw_*` function that yields (file stem, Figure) pairs, open and unsaved, so its content
can be inspected; the registered function beside it saves each one."""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import matplotlib.colors
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from scalecl.methods.base import METHOD_ORDER
from scalecl.report.context import Plot
from scalecl.report.runs import inputs_text, metrics_with
from scalecl.report.stats import LEVEL, t_quantile
from scalecl.report.tables import replicate_unit

Drawn = Iterator[tuple[str, Figure]]

# a colour per method, far apart in hue and lightness (SCALE-Adapt and SCALE-Route, drawn side by side, most of all)
COLORS = {m: c for m, c in zip(METHOD_ORDER, ("tab:red", "tab:purple", "tab:brown", "tab:orange", "tab:green",
                                               "tab:olive", "tab:blue"), strict=True)}
LINESTYLES = ("-", "--", "-.", ":")
INPUTS_ATTR = "scalecl_inputs"  # a drawn figure's inputs (inputs_text), saved beside it by save_figure
BAND_ALPHA = 0.2
# how figures are saved unless the plot says otherwise (`scalecl plot --formats/--dpi`, Plot.formats/dpi)
FIGURE_FORMATS = ("png", "pdf")
FIGURE_DPI = 150
SAVE_FORMATS = ("png", "pdf", "svg")  # what --formats accepts
RATE_NOTE = ("Colour: the method; line style: its learning rate (result.json lr) among the rates drawn of the "
             "method with that setting, lowest first: solid, dashed, dash-dot, dotted; the legend names both.")
UNIT_NOTE = ("Shaded: the 95% Student-t interval per step over a line's units, named with it: its base seeds when "
             "it has several (each base's run seeds averaged first; the two seed axes are never pooled), else its "
             "run seeds on one base; one run: its line alone.")

# Figures are read where the READMEs show them, about 900 px wide on GitHub. A figure the documentation shows is
# at most READ_WIDTH_IN wide (1,800 px at the 150 dpi plot saves at) and at most READ_ASPECT times as tall as wide,
# and none of its text is under READ_FONT_PT: scaled to that width its smallest text is still about 7 px high and
# the whole figure fits in 1.6 screen widths. tests/report/test_figure_rules.py checks every such figure.
READ_WIDTH_IN = 12.0
READ_ASPECT = 1.6
READ_FONT_PT = 7.0
FIG_WIDTH_IN = 11.5  # a figure drawn as wide as that allows: the saved image adds its margin (0.1 in a side)


def with_inputs(fig: Figure, runs: pd.DataFrame, what: str) -> Figure:
    """Attach the figure's inputs (run folders and replicates per group) for save_figure to write beside it."""
    setattr(fig, INPUTS_ATTR, inputs_text(runs, what))
    return fig


def save_figure(plot: Plot, fig: Figure, stem: str) -> list[Path]:
    """Save a figure in the plot's formats (default PNG and PDF), and its inputs (the runs it draws) as
    `<stem>.inputs.txt` when it has them."""
    owned = plot.writer()
    paths = []
    inputs = getattr(fig, INPUTS_ATTR, None)
    formats = plot.formats or FIGURE_FORMATS
    try:
        for name in [f"{stem}.{ext}" for ext in formats] + ([f"{stem}.inputs.txt"] if inputs else []):
            owned.check(name)  # before drawing: a user's file of that name is refused
        for ext in formats:
            buf = io.BytesIO()
            # no creation date in the PDF (nor the SVG): a figure drawn again from the same runs is the same bytes
            fig.savefig(buf, format=ext, dpi=plot.dpi or FIGURE_DPI, bbox_inches="tight",
                        metadata={"CreationDate": None} if ext == "pdf" else {"Date": None} if ext == "svg" else None)
            paths.append(owned.write(f"{stem}.{ext}", buf.getvalue()))  # never through a link
        if inputs:
            paths.append(owned.write(f"{stem}.inputs.txt", inputs))
    finally:
        plt.close(fig)
    return paths


def save_figures(plot: Plot, figures: Iterable[tuple[str, Figure]]) -> list[Path]:
    """Save (and close) each drawn figure as it is built: one figure open at a time."""
    return [p for stem, fig in figures for p in save_figure(plot, fig, stem)]


def mean_curve(frames: Sequence[pd.DataFrame], column: str) -> pd.DataFrame | None:
    """A column over steps across replicate runs: per step, over the runs evaluated at that step, n, mean,
    sd and the 95% Student-t interval (lo, hi; NaN where n < 2). None when no run has the column."""
    parts = [f[["step", column]].dropna() for f in frames if f is not None and column in f]
    parts = [x for x in parts if len(x)]
    if not parts:
        return None
    if len(parts) == 1 and parts[0]["step"].is_unique and parts[0]["step"].is_monotonic_increasing:
        one = parts[0]  # one run (most curves): each step its own value, n = 1, no interval
        values = one[column].astype(float).to_numpy()
        return pd.DataFrame({"step": one["step"].to_numpy(), "n": np.ones(len(one), dtype=np.int64), "mean": values,
                             "sd": np.nan, "lo": np.nan, "hi": np.nan})
    long = pd.concat(parts, ignore_index=True)
    values = long[column].astype(float).groupby(long["step"])
    out = pd.DataFrame({"n": values.count(), "mean": values.mean(), "sd": values.std(ddof=1)})
    out = out.rename_axis("step").reset_index()
    tq = out["n"].map(lambda n: t_quantile(0.5 + LEVEL / 2, int(n) - 1) if n >= 2 else math.nan)
    half = tq * out["sd"] / out["n"].astype(float) ** 0.5
    out["lo"], out["hi"] = out["mean"] - half, out["mean"] + half
    return out


def draw_mean(ax, curve: pd.DataFrame, scale: float = 1.0, alpha: float = BAND_ALPHA, **style):
    """The mean line of a mean_curve, and its interval shaded (`alpha`) where >= 2 units were evaluated."""
    (ln,) = ax.plot(curve["step"], scale * curve["mean"], **style)
    if (curve["n"] >= 2).any():
        ax.fill_between(curve["step"], scale * curve["lo"], scale * curve["hi"], color=ln.get_color(),
                        alpha=alpha, lw=0)
    return ln


def rate_styles(groups: Sequence[pd.DataFrame]) -> dict[str, str]:
    """Per replicate group (its `group`), the line style of its learning rate (result.json `lr`) among the rates
    of its method's groups in `groups` with its setting (a setting other than the rate is a shade, method_colors):
    LINESTYLES in rate order, lowest first (RATE_NOTE)."""
    def rate(g: pd.DataFrame) -> float:
        lr = g.iloc[0]["result"].get("lr")
        return float(f"{lr:.6g}") if isinstance(lr, int | float) and not isinstance(lr, bool) else math.inf

    def kind(g: pd.DataFrame) -> tuple[str, str]:
        return g.iloc[0]["method"], _without_rate(g.iloc[0].get("setting") or "")

    rates: dict[tuple[str, str], set[float]] = {}
    for g in groups:
        rates.setdefault(kind(g), set()).add(rate(g))
    return {g.iloc[0]["group"]: LINESTYLES[sorted(rates[kind(g)]).index(rate(g)) % len(LINESTYLES)] for g in groups}


def unit_name(g: pd.DataFrame) -> str:
    """What a replicate group's line is the mean of, for its label (tables.replicate_unit): '3 base seeds' (each
    base's run seeds averaged first), '3 run seeds of base 0', or '1 run'."""
    units, _ = replicate_unit(g)
    if len(units) < 2:
        return f"{len(g)} run" if len(g) == 1 else f"{len(g)} runs"
    if g["base_seed"].nunique() > 1:
        return f"{len(units)} base seeds"
    return f"{len(units)} run seeds of base {g['base_seed'].iloc[0]}"


def unit_label(label: str, g: pd.DataFrame) -> str:
    """A line's label naming the units of its mean and band ('FFT (3 base seeds)'); one run: the label alone."""
    return f"{label} ({unit_name(g)})" if len(replicate_unit(g)[0]) >= 2 else label


def group_units(plot: Plot, g: pd.DataFrame, *columns: str) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
    """A replicate group's runs whose metrics have `columns` (the others recorded as skipped), and those metrics
    as the units its band is over (unit_frames: its base seeds, each base's run seeds averaged, else its run
    seeds); ([], []) when no run has them."""
    ms = [metrics_with(plot, d, *columns) for d in g["dir"]]
    kept = g[[m is not None for m in ms]]
    if kept.empty:
        return kept, []
    return kept, unit_frames(kept, [m for m in ms if m is not None])[0]


def shades(color, n: int) -> list:
    """n shades of one colour for the settings of one method (a method keeps its hue whatever it is drawn
    with): the colour itself, then alternately darker and lighter, each step further from it."""
    rgb = matplotlib.colors.to_rgb(color)
    out = [rgb]
    for i in range(1, n):
        f = 0.45 * ((i + 1) // 2) / max(1, (n) // 2)  # darker (mixed with black) or lighter (with white)
        target = 0.0 if i % 2 else 1.0
        out.append(tuple(c + (target - c) * min(f, 0.7) for c in rgb))
    return out


SHADE_NOTE = ("Settings of one method other than its rate (its options, such as SCALE-Adapt's l_fp) are shades of "
              "its colour: the preset's own setting the method's colour, the others darker or lighter.")


def _without_rate(setting: str) -> str:
    return ", ".join(p for p in (setting or "").split(", ") if p and not p.startswith("lr="))


def method_colors(groups: Sequence[pd.DataFrame], first: Sequence[pd.DataFrame] = ()) -> dict[str, tuple]:
    """Per replicate group (its `group`), its colour: its method's (COLORS), one shade (draw.shades) per setting
    of that method apart from its rate (the rate is a line style, rate_styles); the setting of a group in
    `first` (the preset's own) keeps the method's colour itself, the others follow in the groups' order."""
    order: dict[str, list[str]] = {}
    for g in [*first, *groups]:
        row = g.iloc[0]
        keys = order.setdefault(row["method"], [])
        if _without_rate(row["setting"]) not in keys:
            keys.append(_without_rate(row["setting"]))
    out = {}
    for g in groups:
        row = g.iloc[0]
        keys = order[row["method"]]
        out[row["group"]] = shades(COLORS.get(row["method"], "black"), len(keys))[
            keys.index(_without_rate(row["setting"]))]
    return out


def unit_frames(g: pd.DataFrame, frames: Sequence[pd.DataFrame]) -> tuple[list[pd.DataFrame], str]:
    """A replicate group's metrics (`frames`: one per run of `g`, in its order) as the units its interval is
    over (tables.replicate_unit: its base seeds, each base's run seeds averaged first, else its run seeds on
    one base), and what they are ('t over 3 base seeds')."""
    of = dict(zip(g.index, frames, strict=True))
    units, note = replicate_unit(g)
    return [mean_frame([of[i] for i in u.index]) for u in units], note


def draw_band(ax, m: pd.DataFrame, x: str, col: str, color, scale: float = 1.0) -> None:
    """The interval a pooled metrics frame carries for `col` (pool_replicates), shaded; nothing for one run."""
    if f"{col}:lo" in m and m[f"{col}:lo"].notna().any():
        ax.fill_between(m[x], scale * m[f"{col}:lo"], scale * m[f"{col}:hi"], color=color, alpha=BAND_ALPHA, lw=0)


def _figure_legend(fig, axes) -> None:
    """One legend right of the figure with every label of `axes` once (in order of first appearance)."""
    entries: dict = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(lab, h)
    fig.legend(list(entries.values()), list(entries), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8,
               frameon=False)


def legend_below(fig, axes, ncol: int = 3, fontsize: float = 8, **kw) -> None:
    """One legend under the panels with every label of `axes` once (in order of first appearance), inside the
    figure's width (a legend beside the panels would widen it past READ_WIDTH_IN); lays the figure out."""
    entries: dict = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(lab, h)
    rows = math.ceil(len(entries) / ncol) if entries else 0
    below = (0.2 * rows + 0.15) / fig.get_figheight() if rows else 0.0  # the legend's height, as a fraction
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=ncol,
                   fontsize=fontsize, frameon=False, **kw)
    fig.tight_layout(rect=(0, below, 1, 1))


def ordered_colors(n: int) -> list:
    """Ordered settings get ordered colours; one run gets the default blue."""
    if n <= 1:
        return ["tab:blue"]
    return [plt.cm.viridis(0.85 * i / (n - 1)) for i in range(n)]


def missing_note(names: list[str], what: str) -> str:
    return f"\nNot drawn (no {what}; older runs): {', '.join(names)}." if names else ""


def pool_replicates(rows: list[tuple[pd.Series, pd.DataFrame]], setting_of) -> list[tuple[pd.Series, pd.DataFrame]]:
    """A study's (table row, metrics) pairs with the replicates of one setting (`setting_of(row)`) drawn as one
    line: the first row, its setting marked with n and its unit, and per step the mean of every metric over the
    units evaluated there, with `<metric>:lo` / `<metric>:hi` its 95% t interval (NaN where fewer than 2 units).
    The units never pool the two seed axes (tables.replicate_unit): a setting's base seeds when it has several
    (each base's run seeds averaged first), else its run seeds on the one base."""
    groups: dict[str, list[tuple[pd.Series, pd.DataFrame]]] = {}
    for row, m in rows:
        groups.setdefault(setting_of(row), []).append((row, m))
    out = []
    for members in groups.values():
        row, m = members[0]
        if len(members) > 1:
            g = pd.DataFrame([r for r, _ in members]).reset_index(drop=True)
            units, _ = unit_frames(g, [x for _, x in members])
            bases = g["base_seed"].nunique()
            unit = f"{len(units)} base seeds" if bases > 1 else f"{len(units)} run seeds of base {row['base_seed']}"
            row = row.copy()
            row["setting"] = f"{row['setting']} (mean of {unit})"
            m = pooled_metrics(units)
        out.append((row, m))
    return out


def pooled_metrics(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Per step, each numeric metric's mean over the frames (mean_curve) and its interval as `:lo` / `:hi`."""
    out = mean_frame(frames)
    for c in [c for c in out.columns if c != "step"]:
        curve = mean_curve(frames, c)
        if curve is not None:
            out = out.merge(curve[["step", "lo", "hi"]].rename(columns={"lo": f"{c}:lo", "hi": f"{c}:hi"}),
                            on="step", how="left")
    return out


def mean_frame(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Replicates' metrics averaged per step (numeric columns; over the runs that have a value there)."""
    if len(frames) == 1:
        return frames[0]
    long = pd.concat(frames, ignore_index=True)
    return long.select_dtypes("number").groupby("step").mean().reset_index()


def has_values(m: pd.DataFrame, key: str) -> bool:
    return key in m and m[key].notna().any()
