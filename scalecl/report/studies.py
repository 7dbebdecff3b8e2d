"""The CPT studies of the paper: Fig. 5 (the W21, W22 initialisation pairs), Fig. 6 (the number of
function-preserving layers l_fp) and Fig. 7 (the collaborative module), each with its per-run table and,
where a setting has replicates, a table of their means."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from scalecl.modeling.scale_spec import ScaleSpec
from scalecl.report.context import Plot
from scalecl.report.cpt import embedding_variant
from scalecl.report.draw import (
    FIG_WIDTH_IN,
    Drawn,
    draw_band,
    draw_mean,
    legend_below,
    mean_curve,
    mean_frame,
    pool_replicates,
    pooled_metrics,
    save_figures,
    unit_frames,
    with_inputs,
)
from scalecl.report.registry import figure
from scalecl.report.runs import inputs_text, load_runs, marked, metrics_with
from scalecl.report.settings import l_fp_text
from scalecl.report.spec import ReportSpec
from scalecl.report.stats import t_interval
from scalecl.report.tables import replicate_unit, write_study_means, write_table


def study_label(study: str, opts: dict) -> str:
    """A CPT study run's swept value: its init pair ('0,Z'), l_fp, or collaborative modules ('attn+mlp')."""
    if study == "init":
        return ",".join(str(i).upper() if i != "zero" else "0" for i in opts.get("init", ()))
    if study == "l_fp":
        return l_fp_text(opts.get("l_fp"))
    return "+".join(map(str, opts.get("collab", ())))


def study_table(plot: Plot, spec: ReportSpec, study: str) -> pd.DataFrame:
    """One row per study run: its swept option and the end points of forgetting / learning perplexity."""
    rows = []
    for _, row in load_runs(plot, spec, study=study).iterrows():
        r = row["result"]
        opts = r.get("method_options", {})
        s = r["summary"]
        rows.append({"study": study, "preset": row["preset"], "method": row["method"],
                     "base_seed": row["base_seed"], "run_seed": row["run_seed"], "variant": embedding_variant(r),
                     "setting": marked(study_label(study, opts), r), "l_fp": opts.get("l_fp"),
                     "old_ppl_start": s["old_ppl_start"], "old_ppl_end": s["old_ppl_end"],
                     "new_ppl_start": s["new_ppl_start"], "new_ppl_end": s["new_ppl_end"],
                     "up_norm_end": r["final"].get("up_norm"), "dir": str(row["dir"])})
    df = pd.DataFrame(rows)
    if study == "l_fp" and len(df):
        df = df.sort_values("l_fp")
    return df.reset_index(drop=True)


STUDY_TABLES = {"init": "table_fig5_init", "l_fp": "table_fig6_l_fp", "collab": "table_fig7_collab"}


def _study_caption(fig: Figure, plot: Plot, spec: ReportSpec, study: str, df: pd.DataFrame, note: str = "",
                   more: str = "") -> Figure:
    """Caption a study's figure (method + run settings, then `more`) and lay it out."""
    runs = load_runs(plot, spec, study=study)
    r0 = runs.iloc[0]["result"]
    fig.text(0.5, -0.01, f"{df['method'].iloc[0]}{note}; " + spec.caption(r0) + (f"\n{more}" if more else ""),
             ha="center", va="top", fontsize=8, wrap=True)
    fig.tight_layout()
    return with_inputs(fig, runs, f"study '{study}': one line or point per run")


def _save_study(plot: Plot, spec: ReportSpec, figures: Drawn, study: str) -> list[Path]:
    """Save a study's figure and write the study's table beside it (nothing when there is no figure)."""
    paths = save_figures(plot, figures)
    if not paths:
        return []
    stem = STUDY_TABLES[study]
    runs = load_runs(plot, spec, study=study)
    inputs = inputs_text(runs, f"{stem}: one row per run")
    df = study_table(plot, spec, study)
    paths += write_table(plot, df.drop(columns="dir"), stem, inputs=inputs) + write_study_means(plot, spec, study, stem)
    ref = study_reference(df, study)
    paired = study_paired(df, ref) if ref is not None else pd.DataFrame()
    if len(paired):
        paths += write_table(plot, paired, f"paired_{stem}", float_fmt="{:.4f}",
                             caption=STUDY_PAIRED.format(ref=ref),
                             inputs=inputs_text(runs, f"paired_{stem}: runs per base"))
    return paths


STUDY_REFERENCE = {"init": "SVD,0", "collab": "mlp"}  # the setting each study's paired table subtracts
STUDY_PAIRED = ("End-of-run forgetting (old_ppl_end) and learning (new_ppl_end) perplexity of each setting minus "
                "{ref}'s trained from the same base seed (within one embedding variant), a base's run seeds "
                "averaged first: the mean difference over the base seeds both have, with its 95% Student-t "
                "interval (mean ± t_0.975,n-1 · s/√n; none for one base); per_base: each base's difference.")


def study_reference(df: pd.DataFrame, study: str) -> str | None:
    """The setting a study's paired table subtracts: STUDY_REFERENCE's, or for `l_fp` the most function-preserving
    setting the study ran (its largest l_fp); None where the study has no such runs (no paired table)."""
    if study == "l_fp" and "l_fp" in df and df["l_fp"].notna().any():
        ref = df.loc[df["l_fp"] == df["l_fp"].max(), "setting"].iloc[0]
    else:
        ref = STUDY_REFERENCE.get(study)
    return ref if ref is not None and (df["setting"] == ref).any() else None


def study_paired(df: pd.DataFrame, ref: str) -> pd.DataFrame:
    """Per embedding variant, setting (other than `ref`) and end metric: the paired differences from `ref` by
    base seed (`df`: a study_table)."""
    rows = []
    for variant, v in df.groupby("variant", sort=False):
        base = v[v["setting"] == ref].groupby("base_seed")
        for setting in [x for x in dict.fromkeys(v["setting"]) if x != ref]:
            own = v[v["setting"] == setting].groupby("base_seed")
            for col in ("old_ppl_end", "new_ppl_end"):
                a, b = own[col].mean(), base[col].mean()
                bases = sorted(set(a.index) & set(b.index))
                diffs = [float(a[x] - b[x]) for x in bases]
                iv = t_interval(diffs)
                rows.append({"variant": variant, "a": setting, "b": ref, "metric": col, "n_bases": len(bases),
                             "diff_mean": iv.mean, "diff_ci_lo": iv.lo, "diff_ci_hi": iv.hi,
                             "interval": f"t over {len(bases)} base seeds" if len(bases) >= 2 else "1 base",
                             "per_base": "; ".join(f"{x}: {d:+.6g}" for x, d in zip(bases, diffs, strict=True))})
    return pd.DataFrame(rows)


@figure("fig5")
def fig5(plot: Plot, spec: ReportSpec) -> list[Path]:
    """Forgetting and learning PPL per (W21, W22) initialisation pair (paper Fig. 5); one row of panels per
    embedding variant (tied or untied base, new embedding columns zero or random) when the study has several."""
    return _save_study(plot, spec, draw_fig5(plot, spec), "init")


def draw_fig5(plot: Plot, spec: ReportSpec) -> Drawn:
    """Paper Fig. 5: a row per embedding variant: (forgetting, learning) panels with a line per init pair, and
    beside them each pair's paired difference from the default pair on the same base."""
    df = study_table(plot, spec, "init")
    if df.empty:
        return
    runs = _with_table(load_runs(plot, spec, study="init"), df, "setting", "variant")
    variants = list(dict.fromkeys(df["variant"]))
    settings = sorted(dict.fromkeys(df["setting"]))  # one colour per pair in every row of panels
    color_of = {setting: f"C{i % 10}" for i, setting in enumerate(settings)}  # categorical: matplotlib's cycle
    fig, axes = plt.subplots(len(variants), 4, figsize=(FIG_WIDTH_IN, 3.2 * len(variants) + 1.0), squeeze=False)
    for (ax_old, ax_new, *ax_diff), variant in zip(axes, variants, strict=True):
        rows = [(row, metrics_with(plot, row["dir"], "old/ppl", "new/ppl")) for _, row in
                df[df["variant"] == variant].iterrows()]
        rows = sorted([(r, m) for r, m in rows if m is not None], key=lambda rm: settings.index(rm[0]["setting"]))
        pooled = pool_replicates(rows, lambda r: r["setting"])  # in the order of `settings`
        for (row, m), setting in zip(pooled, dict.fromkeys(r["setting"] for r, _ in rows), strict=True):
            for ax, col in ((ax_old, "old/ppl"), (ax_new, "new/ppl")):
                color = color_of[setting]
                ax.plot(m["step"], m[col], marker=".", ms=3, label=row["setting"], color=color)
                draw_band(ax, m, "step", col, color)
        _paired_panels(ax_diff, runs[runs["variant"] == variant], {r["dir"]: m for r, m in rows}, color_of)
        suffix = f"\n{variant}" if len(variants) > 1 else ""
        ax_old.set_title("(a) forgetting PPL" + suffix, fontsize=8)
        ax_new.set_title("(b) learning PPL" + suffix, fontsize=8)
        ax_diff[0].set_title(f"(c) forgetting minus {INIT_REFERENCE}'s" + suffix, fontsize=8)
        ax_diff[1].set_title(f"(d) learning minus {INIT_REFERENCE}'s" + suffix, fontsize=8)
        for ax in (ax_old, ax_new, *ax_diff):
            ax.set_xlabel(spec.step_label, fontsize=8)
            ax.set_ylabel("perplexity" if ax in (ax_old, ax_new) else "difference, same base", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    _study_caption(fig, plot, spec, "init", df, more=FIG5_PAIRED.format(ref=INIT_REFERENCE))
    legend_below(fig, [ax for row in axes for ax in row], ncol=3, title="W21,W22 (a, b: mean of its runs' units; c, "
                  "d: paired, t over base seeds)")
    yield "fig5_init_pairs", fig


INIT_REFERENCE = study_label("init", {"init": ScaleSpec().init})  # the default pair, '(SVD,0)'
FIG5_PAIRED = (
    "(c, d): the paired differences the comparison rests on: per evaluated step, a pair's perplexity minus that "
    "of {ref} (the default) trained from the same base (same base seed and build of it; a base's run seeds "
    "averaged first). Thin lines: one base each; thick: the mean over the bases, shaded its 95% Student-t "
    "interval over the base seeds (mean +- t_0.975,n-1 s/sqrt(n), n in the legend; none for one base). Below 0: "
    "lower perplexity than {ref}. (a, b): each pair's mean over its runs, shaded its t interval over them, which "
    "holds the spread between bases that the paired differences remove.")


def _paired_panels(axes, runs: pd.DataFrame, metrics: dict, color_of: dict[str, str]) -> None:
    """fig5 (c, d) of one variant: per init pair, per base its perplexity minus INIT_REFERENCE's on that base
    (thin lines), and their mean over the bases with its t band (`metrics`: each run folder's metrics)."""
    runs = runs[runs["dir"].map(lambda d: str(d) in metrics)]

    def per_base(g: pd.DataFrame) -> dict:  # (base seed, build) -> its runs' metrics, run seeds averaged
        return {key: mean_frame([metrics[str(d)] for d in sub["dir"]])
                for key, sub in g.groupby(["base_seed", "base_build"])}

    ref = per_base(runs[runs["setting"] == INIT_REFERENCE])
    for setting in [x for x in color_of if x != INIT_REFERENCE and x in set(runs["setting"])]:
        own = per_base(runs[runs["setting"] == setting])
        bases = sorted(set(own) & set(ref))
        for ax, col in zip(axes, ("old/ppl", "new/ppl"), strict=True):
            diffs = [own[b][["step", col]].merge(ref[b][["step", col]], on="step", suffixes=("", ":ref"))
                     for b in bases]
            diffs = [d.assign(**{col: d[col] - d[f"{col}:ref"]}) for d in diffs]
            for d in diffs:
                ax.plot(d["step"], d[col], color=color_of[setting], lw=0.7, alpha=0.5)
            if diffs:
                unit = f"t over {len(bases)} base seeds" if len(bases) >= 2 else "1 base"
                draw_mean(ax, mean_curve(diffs, col), color=color_of[setting], lw=1.8, marker=".", ms=3,
                           label=f"{setting} ({unit})")
    for ax in axes:
        ax.axhline(0, color="black", lw=0.8)
        if not ref:
            ax.text(0.5, 0.5, f"no {INIT_REFERENCE} run on these bases", transform=ax.transAxes, ha="center")


@figure("fig6")
def fig6(plot: Plot, spec: ReportSpec) -> list[Path]:
    """Forgetting vs learning perplexity as the number of function-preserving layers l_fp varies (Fig. 6)."""
    return _save_study(plot, spec, draw_fig6(plot, spec), "l_fp")


def draw_fig6(plot: Plot, spec: ReportSpec) -> Drawn:
    """Paper Fig. 6: end-of-run forgetting and learning perplexity against l_fp (a, b: each base's value and
    their mean with its t interval), and each l_fp's paired difference from the most preserving one on the same
    base (c, d: the intervals the comparison rests on, paired_table_fig6_l_fp)."""
    df = study_table(plot, spec, "l_fp")
    if df.empty:
        return
    ref = study_reference(df, "l_fp")
    paired = study_paired(df, ref) if ref is not None else pd.DataFrame()
    fig, axes = plt.subplots(2 if len(paired) else 1, 2, figsize=(FIG_WIDTH_IN, 7.6 if len(paired) else 4.2),
                             squeeze=False)
    l_fp_of = dict(zip(df["setting"], df["l_fp"], strict=False))
    for ax, col, color, title in ((axes[0, 0], "old_ppl_end", "tab:red", "(a) forgetting PPL at the end"),
                                  (axes[0, 1], "new_ppl_end", "tab:blue", "(b) learning PPL at the end")):
        _fig6_levels(ax, df, col, color, title)
    if len(paired):
        for ax, col, color, what in ((axes[1, 0], "old_ppl_end", "tab:red", "(c) forgetting"),
                                     (axes[1, 1], "new_ppl_end", "tab:blue", "(d) learning")):
            _fig6_paired(ax, paired[paired["metric"] == col], l_fp_of, color, f"{what} PPL minus {ref}'s, same base")
    for ax in axes.flat:
        ax.set_xlabel("l_fp (function-preserving lower layers)", fontsize=9)
        ax.set_xticks(sorted(df["l_fp"].dropna().unique().tolist()))
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    more = FIG6_PAIRED.format(ref=ref) if len(paired) else ""
    yield "fig6_l_fp", _study_caption(fig, plot, spec, "l_fp", df, more=more)


FIG6_PAIRED = ("(a, b): thin lines one base seed each (its run seeds averaged), points their mean with the 95% "
               "Student-t interval over the base seeds, which holds the spread between bases. (c, d): per base "
               "seed, each l_fp's value minus that of {ref} (every layer preserved) on the same base (thin), and "
               "their mean with its 95% t interval over the base seeds (mean +- t_0.975,n-1 s/sqrt(n)): the "
               "paired intervals the comparison rests on (paired_table_fig6_l_fp). Above 0: higher perplexity "
               "than {ref}.")


def _fig6_levels(ax, df: pd.DataFrame, col: str, color, title: str) -> None:
    """Fig. 6 (a, b): per base seed its value at each l_fp (thin), and the mean over the units of each l_fp
    (tables.replicate_unit) with its t interval."""
    for _, on in df.groupby("base_seed"):
        per = on.groupby("l_fp")[col].mean()
        ax.plot(per.index, per.values, color=color, lw=0.7, alpha=0.45)
    ivs = {k: t_interval(u[col].mean() for u in replicate_unit(g)[0]) for k, g in df.groupby("l_fp", sort=True)}
    x, mean = list(ivs), [iv.mean for iv in ivs.values()]
    most = max(iv.n for iv in ivs.values())
    unit = "base seeds" if df["base_seed"].nunique() > 1 else "run seeds"
    ax.errorbar(x, mean, yerr=[[iv.mean - iv.lo if iv.n > 1 else 0 for iv in ivs.values()],
                               [iv.hi - iv.mean if iv.n > 1 else 0 for iv in ivs.values()]],
                marker="o", color=color, capsize=3, lw=1.6)
    ax.set_title(title + (f"\n(mean of up to {most} {unit}, 95% t interval)" if most > 1 else ""), fontsize=9)
    ax.set_ylabel("perplexity", fontsize=9)


def _fig6_paired(ax, paired: pd.DataFrame, l_fp_of: dict, color, title: str) -> None:
    """Fig. 6 (c, d): per l_fp its per-base differences from the reference (thin) and their mean with the paired
    t interval over the base seeds (study_paired's rows)."""
    rows = paired.assign(l_fp=paired["a"].map(l_fp_of)).sort_values("l_fp")
    per_base = [dict(float_pair(x) for x in str(s).split("; ") if x) for s in rows["per_base"]]
    for base in sorted({b for d in per_base for b in d}):
        ax.plot(rows["l_fp"], [d.get(base, math.nan) for d in per_base], color=color, lw=0.7, alpha=0.45)
    lo, hi = rows["diff_ci_lo"].fillna(rows["diff_mean"]), rows["diff_ci_hi"].fillna(rows["diff_mean"])
    ax.errorbar(rows["l_fp"], rows["diff_mean"], yerr=[rows["diff_mean"] - lo, hi - rows["diff_mean"]], marker="o",
                ls="none", color=color, capsize=3)
    ax.axhline(0, color="black", lw=0.8)
    n = int(rows["n_bases"].max()) if len(rows) else 0
    ax.set_title(title + (f"\n(paired: mean and 95% t interval over {n} base seeds)" if n > 1 else ""), fontsize=9)
    ax.set_ylabel("perplexity difference (paired)", fontsize=9)


def float_pair(text: str) -> tuple[str, float]:
    """'base: +0.5' (a study_paired per_base entry) as (base, 0.5)."""
    base, value = text.split(": ")
    return base, float(value)


@figure("fig7")
def fig7(plot: Plot, spec: ReportSpec) -> list[Path]:
    """Forgetting PPL against the average upscaled-weight norm, collaborative module attn vs mlp (Fig. 7)."""
    return _save_study(plot, spec, draw_fig7(plot, spec), "collab")


def draw_fig7(plot: Plot, spec: ReportSpec) -> Drawn:
    """Paper Fig. 7: old-domain perplexity against the upscaled weights' norm, a line per collab setting (the
    mean over its units, base seeds else run seeds, with the t band of the perplexity where it has >= 2)."""
    df = study_table(plot, spec, "collab")
    if df.empty:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    runs = _with_table(load_runs(plot, spec, study="collab"), df, "setting")
    banded = False
    for setting, g in runs.groupby("setting", sort=False):
        ms = [metrics_with(plot, d, "old/ppl") for d in g["dir"]]
        g, ms = g[[m is not None for m in ms]], [m for m in ms if m is not None]
        if not ms:
            continue
        units, note = unit_frames(g, ms)
        m = pooled_metrics(units) if len(units) > 1 else units[0]
        if "up_norm" in m:
            (ln,) = ax.plot(m["up_norm"], m["old/ppl"], marker=".", ms=4,
                            label=f"W12 trains in {setting}" + (f" ({note})" if len(units) > 1 else ""))
            draw_band(ax, m, "up_norm", "old/ppl", ln.get_color())
            banded |= len(units) > 1
    ax.set_xlabel("average norm of upscaled weights (W12, W21, W22)")
    ax.set_ylabel("forgetting PPL (old domain)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    yield "fig7_collab_modules", _study_caption(fig, plot, spec, "collab", df,
                                                ", " + l_fp_text(df["l_fp"].iloc[0]), FIG7_BAND if banded else "")


FIG7_BAND = ("A line with replicates: per evaluated step, the mean norm against the mean forgetting PPL over its "
             "units (named in the legend: its base seeds, each base's run seeds averaged first, else its run "
             "seeds on one base); shaded: the 95% Student-t interval of the forgetting PPL over those units at "
             "that step (mean +- t_0.975,n-1 s/sqrt(n)), drawn at the mean norm; the norm's own spread is not "
             "drawn.")


def _with_table(runs: pd.DataFrame, df: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """A study's load_runs with each run's `columns` as its study_table has them (matched by run folder)."""
    rows = df.set_index("dir")
    return runs.assign(**{c: [rows.at[str(d), c] for d in runs["dir"]] for c in columns})
