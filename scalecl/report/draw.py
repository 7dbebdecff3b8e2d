"""Drawing helpers shared by the figure families: colours, mean curves with their t-interval bands, legends,
replicates pooled into one line, and saving a figure (PNG and PDF unless the plot asks for others) with the runs it drew (`<stem>.inputs.txt`).

Every figure has a `draw_*` function that yields (file stem, Figure) pairs, open and unsaved, so its content
can be inspected; the registered function beside it saves each one."""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from scalecl.methods.base import METHOD_ORDER
from scalecl.report.context import Plot
from scalecl.report.runs import _metrics_with, inputs_text
from scalecl.report.stats import LEVEL, t_quantile
from scalecl.report.tables import replicate_unit

Drawn = Iterator[tuple[str, Figure]]

COLORS = {m: c for m, c in zip(METHOD_ORDER, ("tab:red", "tab:purple", "tab:brown", "tab:orange", "tab:green",
                                               "tab:cyan", "tab:blue"), strict=True)}
LINESTYLES = ("-", "--", "-.", ":")
INPUTS_ATTR = "scalecl_inputs"  # a drawn figure's inputs (inputs_text), saved beside it by _save
BAND_ALPHA = 0.2
# how figures are saved unless the plot says otherwise (`scalecl plot --formats/--dpi`, Plot.formats/dpi)
FIGURE_FORMATS = ("png", "pdf")
FIGURE_DPI = 150
SAVE_FORMATS = ("png", "pdf", "svg")  # what --formats accepts
RATE_NOTE = ("Colour: the method; line style: its learning rate (result.json lr) among the method's rates drawn, "
             "lowest first: solid, dashed, dash-dot, dotted; the legend names both.")
UNIT_NOTE = ("Shaded: the 95% Student-t interval per step over a line's units, named with it: its base seeds when "
             "it has several (each base's run seeds averaged first; the two seed axes are never pooled), else its "
             "run seeds on one base; one run: its line alone.")
BAND_NOTE = ("Lines: mean over a group's replicates; shaded: the 95% Student-t interval per step over the runs "
             "evaluated at that step (mean +- t_0.975,n-1 s/sqrt(n)); a group of one run: its line alone.")


def _with_inputs(fig: Figure, runs: pd.DataFrame, what: str) -> Figure:
    """Attach the figure's inputs (run folders and replicates per group) for _save to write beside it."""
    setattr(fig, INPUTS_ATTR, inputs_text(runs, what))
    return fig


def _save(plot: Plot, fig: Figure, stem: str) -> list[Path]:
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


def _save_all(plot: Plot, figures: Iterable[tuple[str, Figure]]) -> list[Path]:
    """Save (and close) each drawn figure as it is built: one figure open at a time."""
    return [p for stem, fig in figures for p in _save(plot, fig, stem)]


def mean_curve(frames: Sequence[pd.DataFrame], column: str) -> pd.DataFrame | None:
    """A column over steps across replicate runs: per step, over the runs evaluated at that step, n, mean,
    sd and the 95% Student-t interval (lo, hi; NaN where n < 2). None when no run has the column."""
    parts = [f[["step", column]].dropna() for f in frames if f is not None and column in f]
    parts = [x for x in parts if len(x)]
    if not parts:
        return None
    long = pd.concat(parts, ignore_index=True)
    values = long[column].astype(float).groupby(long["step"])
    out = pd.DataFrame({"n": values.count(), "mean": values.mean(), "sd": values.std(ddof=1)})
    out = out.rename_axis("step").reset_index()
    tq = out["n"].map(lambda n: t_quantile(0.5 + LEVEL / 2, int(n) - 1) if n >= 2 else math.nan)
    half = tq * out["sd"] / out["n"].astype(float) ** 0.5
    out["lo"], out["hi"] = out["mean"] - half, out["mean"] + half
    return out


def _draw_mean(ax, curve: pd.DataFrame, scale: float = 1.0, **style):
    """The mean line of a mean_curve, and its interval shaded where >= 2 runs were evaluated."""
    (ln,) = ax.plot(curve["step"], scale * curve["mean"], **style)
    if (curve["n"] >= 2).any():
        ax.fill_between(curve["step"], scale * curve["lo"], scale * curve["hi"], color=ln.get_color(),
                        alpha=BAND_ALPHA, lw=0)
    return ln


def rate_styles(groups: Sequence[pd.DataFrame]) -> dict[str, str]:
    """Per replicate group (its `group`), the line style of its learning rate (result.json `lr`) among its
    method's rates in `groups`: LINESTYLES in rate order, lowest first (RATE_NOTE)."""
    def rate(g: pd.DataFrame) -> float:
        lr = g.iloc[0]["result"].get("lr")
        return float(f"{lr:.6g}") if isinstance(lr, int | float) and not isinstance(lr, bool) else math.inf

    rates: dict[str, set[float]] = {}
    for g in groups:
        rates.setdefault(g.iloc[0]["method"], set()).add(rate(g))
    return {g.iloc[0]["group"]: LINESTYLES[sorted(rates[g.iloc[0]["method"]]).index(rate(g)) % len(LINESTYLES)]
            for g in groups}


def unit_frames(g: pd.DataFrame, frames: Sequence[pd.DataFrame]) -> tuple[list[pd.DataFrame], str]:
    """A replicate group's metrics (`frames`: one per run of `g`, in its order) as the units its interval is
    over (tables.replicate_unit: its base seeds, each base's run seeds averaged first, else its run seeds on
    one base), and what they are ('t over 3 base seeds')."""
    of = dict(zip(g.index, frames, strict=True))
    units, note = replicate_unit(g)
    return [_mean_frame([of[i] for i in u.index]) for u in units], note


def _group_metrics(plot: Plot, g: pd.DataFrame, *columns: str) -> list[pd.DataFrame]:
    """The metrics of a replicate group's runs that have them (the others recorded as skipped)."""
    return [m for m in (_metrics_with(plot, d, *columns) for d in g["dir"]) if m is not None]


def _band(ax, m: pd.DataFrame, x: str, col: str, color, scale: float = 1.0) -> None:
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


def _colors(n: int) -> list:
    """Ordered settings get ordered colours; one run gets the default blue."""
    if n <= 1:
        return ["tab:blue"]
    return [plt.cm.viridis(0.85 * i / (n - 1)) for i in range(n)]


def _missing_note(names: list[str], what: str) -> str:
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
            m = _pooled_metrics(units)
        out.append((row, m))
    return out


def _pooled_metrics(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Per step, each numeric metric's mean over the frames (mean_curve) and its interval as `:lo` / `:hi`."""
    out = _mean_frame(frames)
    for c in [c for c in out.columns if c != "step"]:
        curve = mean_curve(frames, c)
        if curve is not None:
            out = out.merge(curve[["step", "lo", "hi"]].rename(columns={"lo": f"{c}:lo", "hi": f"{c}:hi"}),
                            on="step", how="left")
    return out


def _mean_frame(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Replicates' metrics averaged per step (numeric columns; over the runs that have a value there)."""
    if len(frames) == 1:
        return frames[0]
    long = pd.concat(frames, ignore_index=True)
    return long.select_dtypes("number").groupby("step").mean().reset_index()


def _has(m: pd.DataFrame, key: str) -> bool:
    return key in m and m[key].notna().any()
