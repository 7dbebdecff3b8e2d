"""Tables: per replicate group the mean of each metric with its 95% t interval, paired differences of methods
trained on the same base, a study's settings with their replicates pooled, and writing a table as CSV (full
precision), Markdown and LaTeX with its caption and inputs."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from scalecl.report.context import Plot
from scalecl.report.registry import table
from scalecl.report.runs import (
    config_id,
    group_label,
    inputs_text,
    load_runs,
    replicate_groups,
    seeds_text,
    study_names,
    value_at,
)
from scalecl.report.settings import study_setting, study_sort_key
from scalecl.report.spec import Metric, ReportSpec
from scalecl.report.stats import MAX_UNITS, binomial_se, interval_note, t_interval, units_needed


def replicate_unit(g: pd.DataFrame) -> tuple[list[pd.DataFrame], str]:
    """The units a replicate group's interval is over, never pooling the two seed axes: its base seeds when it
    has several (each base's run seeds averaged into one value), else its run seeds on the one base."""
    bases = sorted(g["base_seed"].unique())
    if len(bases) > 1:
        units = [sub for _, sub in g.groupby("base_seed")]
        averaged = " (run seeds averaged within a base)" if any(len(u) > 1 for u in units) else ""
        return units, f"t over {len(units)} base seeds{averaged}"
    units = [g.iloc[[i]] for i in range(len(g))]
    return units, (f"t over {len(units)} run seeds of base {bases[0]}" if len(units) > 1 else interval_note(1))


def aggregate_table(runs: pd.DataFrame, metrics: tuple[Metric, ...], head) -> pd.DataFrame:
    """One row per replicate group: preset, method, setting, group, n (units), seeds (base/run), `head(result)`,
    then per metric its mean over the group's units (replicate_unit: base seeds, else run seeds), the 95% t
    interval over them (`_ci_lo`, `_ci_hi`; NaN for n = 1) and, where the questions behind it are known,
    `_binom_se` (sqrt(p(1-p)/q) at the mean)."""
    rows = []
    for g in replicate_groups(runs):
        first = g.iloc[0]
        units, note = replicate_unit(g)
        rec = {"preset": first["preset"], "method": first["method"], "setting": first["setting"],
               "group": first["group"], "n": len(units), "interval": note,
               "seeds": seeds_text(g), **head(first["result"])}
        for col, path, questions in metrics:
            iv = t_interval(t_interval(value_at(r, path) for r in u["result"]).mean for u in units)
            rec |= {col: iv.mean, f"{col}_ci_lo": iv.lo, f"{col}_ci_hi": iv.hi}
            if questions is not None:
                rec[f"{col}_binom_se"] = binomial_se(iv.mean, questions(first["result"]))
        rows.append(rec)
    return pd.DataFrame(rows)


def table_cell(row: pd.Series, col: str, fmt: str) -> str:
    """A table cell: mean +- half-width of the t interval (n >= 2) or the value, and the binomial SE if known."""
    mean = row[col]
    if pd.isna(mean):
        return ""
    text = fmt.format(mean)
    if not pd.isna(row.get(f"{col}_ci_hi", math.nan)):
        text += " ± " + fmt.format(row[f"{col}_ci_hi"] - mean)
    se = row.get(f"{col}_binom_se", math.nan)
    return text + (f" (SE {fmt.format(se)})" if not pd.isna(se) else "")


def shown_aggregate(df: pd.DataFrame, metrics: tuple[Metric, ...], fmt: str = "{:.3f}") -> pd.DataFrame:
    """The Markdown/LaTeX view of an aggregate_table: a cell 'mean ± half-width (SE se)' per metric."""
    cols = ["preset", "method"] + (["setting"] if df["setting"].astype(bool).any() else [])
    shown = df[cols + ["interval", "seeds", *[c for c in df.columns if c in ("trainable", "lr")]]].copy()
    for col, _, _ in metrics:
        shown[col] = [table_cell(row, col, fmt) for _, row in df.iterrows()]
    return shown


AGG_CAPTION = ("Mean over replicates (runs of one setting with other base/run seeds) ± the half-width of the 95% "
               "Student-t interval, mean ± t_0.975,n-1 · s/√n over the row's units ('interval'): its base seeds "
               "when it has several (run seeds of one base averaged first; the two axes are never pooled), else "
               "its run seeds on one base; n=1 (no interval): the value alone. CSV: `<col>` mean, "
               "`<col>_ci_lo`/`_ci_hi` the interval.")


def write_table(plot: Plot, df: pd.DataFrame, stem: str, float_fmt: str = "{:.3f}", shown: pd.DataFrame | None = None,
                caption: str | None = None, inputs: str | None = None) -> list[Path]:
    """CSV (full precision), Markdown and LaTeX (rounded, or `shown` as given) versions of one table; the
    caption under the Markdown table (`Table: ...`) and atop the LaTeX one (comments); the inputs (run folders)
    as `<stem>.inputs.txt`, into the plot's outputs folder."""
    owned = plot.writer()
    owned.folder.mkdir(parents=True, exist_ok=True)
    if shown is None:
        shown = df.copy()
        for c in shown.columns:
            if shown[c].dtype.kind == "f" and c != "lr":
                shown[c] = shown[c].map(lambda v: "" if pd.isna(v) else float_fmt.format(v))  # not recorded: blank
            elif shown[c].isna().any():
                shown[c] = shown[c].astype(object).where(shown[c].notna(), "")
    names = [f"{stem}.{ext}" for ext in ("csv", "md", "tex")] + ([f"{stem}.inputs.txt"] if inputs else [])
    for name in names:  # all checked before the first is written
        owned.check(name)
    md = shown.to_markdown(index=False) + "\n" + (f"\nTable: {caption}\n" if caption else "")
    tex = shown.map(lambda v: v.replace("±", "$\\pm$") if isinstance(v, str) else v).to_latex(index=False)
    tex = "".join(f"% {line}\n" for line in (caption or "").splitlines()) + tex
    paths = [owned.write(f"{stem}.csv", df.to_csv(index=False)), owned.write(f"{stem}.md", md),
             owned.write(f"{stem}.tex", tex)]
    return paths + ([owned.write(f"{stem}.inputs.txt", inputs)] if inputs else [])


PAIR_REFERENCE = "scale-route"  # each other method is compared with it: reference - other, per base
NO_INTERVAL = "fewer than 2 bases: interval cannot be computed"


def _per_base(g: pd.DataFrame, path: str) -> dict[tuple[int, str], float]:
    """A replicate group's value per base seed (the mean over its run seeds on that base)."""
    return {(int(b), build): t_interval(value_at(r, path) for r in sub["result"]).mean
            for (b, build), sub in g.groupby(["base_seed", "base_build"])}


def paired_table(plot: Plot, spec: ReportSpec, study: str | None = None) -> pd.DataFrame:
    """Per pair of replicate groups on the same bases (SCALE-Route and each other method) and metric: the
    differences a - b per unit (_paired_units) and their mean with a 95% t interval over the units shared. With
    `study`: among that study's runs, grouped as main runs are (method, options, config outside the seeds)."""
    runs = load_runs(plot, spec, study=study)
    if study is not None and len(runs):
        runs["group"] = [config_id(r, spec) for r in runs["result"]]
        runs["setting"] = [study_setting(spec, study, r) for r in runs["result"]]  # names each group's value
    return pd.DataFrame(reference_pairs(runs, spec.paired))


def reference_pairs(runs: pd.DataFrame, metrics: tuple[tuple[str, str], ...]) -> list[dict]:
    """The _paired_rows of PAIR_REFERENCE's replicate groups minus every other method's, among runs that share a
    base (`pair`), on each (column, result.json path) of `metrics`."""
    rows = []
    for _, share in runs.groupby("pair", sort=False):
        reps = replicate_groups(share)
        for a in (g for g in reps if g.iloc[0]["method"] == PAIR_REFERENCE):
            for b in (g for g in reps if g.iloc[0]["method"] != PAIR_REFERENCE):
                rows += [row for col, path in metrics for row in _paired_rows(a, b, col, path)]
    return rows


def _paired_views(a: pd.DataFrame, b: pd.DataFrame, path: str, va: dict, vb: dict, bases: list
                  ) -> list[tuple[list[str], list[float], str]]:
    """(unit labels, differences a - b, unit) for each way the two groups can be paired, never pooling the two
    seed axes: per base over the `bases` they share (same base seed and the same build of it; `va`, `vb` each
    base's value, its run seeds averaged), and per run seed on each shared base where they share several."""
    views = [([str(x[0]) for x in bases], [va[x] - vb[x] for x in bases], "base seeds")]
    for seed, build in bases:
        ra, rb = ({int(s): value_at(r, path) for s, r in zip(on["run_seed"], on["result"], strict=True)}
                  for on in (g[(g["base_seed"] == seed) & (g["base_build"] == build)] for g in (a, b)))
        runs = sorted(set(ra) & set(rb))
        if len(runs) >= 2:
            views.append(([f"{seed}/{s}" for s in runs], [ra[s] - rb[s] for s in runs], f"run seeds of base {seed}"))
    return views


def _on(g: pd.DataFrame, bases: list[tuple[int, str]]) -> int:
    """How many of a group's runs are on one of `bases` ((base seed, build) pairs)."""
    return int(sum((int(s), bld) in bases for s, bld in zip(g["base_seed"], g["base_build"], strict=True)))


def _paired_rows(a: pd.DataFrame, b: pd.DataFrame, col: str, path: str) -> list[dict]:
    """One row per way the two groups pair on metric `col` (_paired_views)."""
    va, vb = _per_base(a, path), _per_base(b, path)
    bases = sorted(set(va) & set(vb))
    shared = {"preset": a.iloc[0]["preset"], "a": group_label(a.iloc[0]), "b": group_label(b.iloc[0]),
              "metric": col, "n_bases": len(bases), "bases": ", ".join(str(x[0]) for x in bases),
              "a_runs": _on(a, bases), "b_runs": _on(b, bases),
              "a_mean": t_interval(va[x] for x in bases).mean, "b_mean": t_interval(vb[x] for x in bases).mean}
    rows = []
    for units, diffs, unit in _paired_views(a, b, path, va, vb, bases):
        iv = t_interval(diffs)
        needed = units_needed(iv.mean, iv.sd) if len(units) >= 2 else None
        rows.append(shared | {
            "diff_mean": iv.mean, "diff_ci_lo": iv.lo, "diff_ci_hi": iv.hi, "diff_sd": iv.sd,
            "units_needed": f">{MAX_UNITS}" if needed is None and len(units) >= 2 else needed,
            "interval": f"t over {len(units)} {unit}" if len(units) >= 2 else (
                NO_INTERVAL if bases else "no base seed shared"),
            "per_base": "; ".join(f"{x}: {d:+.6g}" for x, d in zip(units, diffs, strict=True))})
    return rows


PAIRED_CAPTION = ("Paired differences a - b of runs on the same base: same preset, config outside the seeds and "
                  "per-method options, and the same build of the base (the stages or base model result.json "
                  "records). One row over the base seeds the two share (per base, the difference of their values, "
                  "each the mean over its run seeds there) and, for each shared base where both have several run "
                  "seeds, one row over those run seeds: the two seed axes are never pooled. Each row: the mean "
                  "difference with its 95% Student-t interval (diff_ci_lo, diff_ci_hi: mean ± t_0.975,n-1 · s/√n; "
                  "'interval' names the unit and n); diff_sd: the standard deviation of the differences; "
                  "units_needed: the fewest units of that kind whose interval would exclude 0 if more of them gave the "
                  "same mean and sd (a planning number: at or below n when the interval already excludes 0); "
                  "per_base: each unit's difference (base, or base/run); a_mean, b_mean: each method's mean over the "
                  "shared bases. {what}")


def summary_table(plot: Plot, spec: ReportSpec) -> pd.DataFrame:
    """Per replicate group of the main runs: the experiment's metrics, means with 95% t intervals."""
    return aggregate_table(load_runs(plot, spec), spec.metrics, lambda r: {
        "trainable": r["trainable_params"], "lr": r["lr"]})


@table("summary")
def summary_tables(plot: Plot, spec: ReportSpec) -> list[Path]:
    """table_<name> (means over replicates with t intervals) and paired_<name> (differences per base)."""
    written = []
    df, runs = summary_table(plot, spec), load_runs(plot, spec)
    if len(df):
        written += write_table(plot, df, f"table_{spec.name}", shown=shown_aggregate(df, spec.metrics),
                               caption=f"{AGG_CAPTION} {spec.table_note}".strip(),
                               inputs=inputs_text(runs, f"table_{spec.name}: one row per replicate group"))
    for study in (None, *study_names(plot, spec)):  # the main runs, then each study's methods on shared bases
        paired = paired_table(plot, spec, study)
        stem = f"paired_{spec.name}" + (f"_{study}" if study else "")
        if len(paired):
            written += write_table(plot, paired, stem, float_fmt="{:.4f}",
                                   caption=PAIRED_CAPTION.format(what=spec.paired_note),
                                   inputs=inputs_text(load_runs(plot, spec, study=study) if study else runs,
                                                      f"{stem}: runs compared per base seed or run seed"))
    return written


def study_means(runs: pd.DataFrame, spec: ReportSpec, study: str) -> pd.DataFrame:
    """One row per setting of a study (`runs`: its load_runs; replicates pooled): n, seeds, then the end points'
    mean and 95% t interval over the replicates (aggregate_table's columns)."""
    if runs.empty:
        return pd.DataFrame()
    settings = [study_setting(spec, study, r) for r in runs["result"]]
    keys = [study_sort_key(study, r) for r in runs["result"]]
    runs = runs.assign(setting=settings, group=[f"{m} {x}" for m, x in zip(runs["method"], settings, strict=True)])
    runs = runs.iloc[sorted(range(len(runs)), key=lambda i: keys[i])]
    return aggregate_table(runs, spec.metrics, lambda r: {"lr": r["lr"]})


def write_study_means(plot: Plot, spec: ReportSpec, study: str, stem: str) -> list[Path]:
    """<stem>_means (md/csv/tex): the study's settings with their replicates pooled; nothing when no setting has
    more than one run (the per-run table says it all)."""
    runs = load_runs(plot, spec, study=study)
    df = study_means(runs, spec, study)
    if df.empty or not (df["n"] > 1).any():
        return []
    return write_table(plot, df, f"{stem}_means", shown=shown_aggregate(df, spec.metrics), caption=AGG_CAPTION,
                       inputs=inputs_text(runs, f"{stem}_means: one row per setting, its replicates pooled"))
