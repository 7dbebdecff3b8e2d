"""Paper Fig. 8 for each biography Route study (tau, router, vocab, any other): Task 0 / Task 1 accuracy and
answer routing, a line per setting, with the FFT reference trained like the study's runs; and the study's
tables (one row per run, and the means of settings with replicates)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from scalecl.report.context import Plot
from scalecl.report.draw import (
    FIG_WIDTH_IN,
    Drawn,
    draw_band,
    draw_mean,
    has_values,
    legend_below,
    mean_curve,
    ordered_colors,
    pool_replicates,
    save_figures,
    unit_frames,
    unit_label,
    unit_name,
    with_inputs,
)
from scalecl.report.registry import figure
from scalecl.report.routing import answer_preserve, route_series
from scalecl.report.runs import (
    LABELS,
    config_id,
    inputs_text,
    load_runs,
    metrics_or_none,
    metrics_with,
    one_build,
    seeds_text,
    study_names,
    value_at,
)
from scalecl.report.settings import (
    ENSEMBLE_STUDY,
    ROUTE_STUDIES,
    l_fp_text,
    option_text,
    recorded_vocab_rows,
    route_tau,
    setting_label,
    study_sort_key,
    vocab_key,
    vocab_text,
)
from scalecl.report.spec import ReportSpec
from scalecl.report.tables import write_study_means, write_table

EARLY_FRACTION = 0.2  # table column: answer-position routing averaged over the first 20% of steps


def _early_mean(m: pd.DataFrame, y: pd.Series | None) -> float:
    """Mean of an evaluation series over steps 0 < step <= EARLY_FRACTION x the last evaluated step."""
    if y is None:
        return math.nan
    last = m["step"].max()
    sel = (m["step"] > 0) & (m["step"] <= EARLY_FRACTION * last)
    return float(y[sel].mean()) if sel.any() else math.nan


def _end(y: pd.Series | None) -> float:
    if y is None or y.dropna().empty:
        return math.nan
    return float(y.dropna().iloc[-1])


def route_study_table(plot: Plot, spec: ReportSpec, study: str) -> pd.DataFrame:
    """One row per run of a biography Route study: setting, accuracy end points, answer-position routing."""
    runs = load_runs(plot, spec, study=study)
    early = f"first{round(100 * EARLY_FRACTION)}"
    rows = []
    for _, row in runs.iterrows():
        r = row["result"]
        s, opts = r["summary"], r.get("method_options") or {}
        model_rows, tok = recorded_vocab_rows(r)
        m = metrics_or_none(plot, row["dir"])
        rec = {"study": study, "preset": row["preset"], "method": row["method"], "base_seed": row["base_seed"],
               "run_seed": row["run_seed"], "setting": setting_label(spec, study, r), "tau": route_tau(r), "router": opts.get("router", "logit"),
               "vocab_model": model_rows, "vocab_tokenizer": tok, "steps": r["config"]["stage3"]["steps"],
               "task0_start": s["task0_start"], "task0_min": s["task0_min"], "task0_end": s["task0_end"],
               "task1_end": s["task1_end"], "task0_full_end": r["final"]["task0_heldout"]["acc"],
               "task1_full_end": r["final"]["task1"]["acc"]}
        for task, _, _ in spec.eval_sets:
            y = answer_preserve(m, task) if m is not None else None
            rec[f"{task}_answer_preserve_end"] = _end(y)
            rec[f"{task}_answer_preserve_{early}"] = _early_mean(m, y) if m is not None else math.nan
        rec["_key"] = study_sort_key(study, r)
        rec["dir"] = str(row["dir"])
        rows.append(rec)
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows)
    df = df.iloc[sorted(range(len(df)), key=lambda i: df["_key"].iloc[i])].drop(columns="_key")
    for col in ("vocab_model", "vocab_tokenizer"):
        df[col] = df[col].astype("Int64")
    # the swept option's columns: tau always (Route's threshold), the router and rows where recorded or swept
    unused = [c for c in ("vocab_model", "vocab_tokenizer") if df[c].isna().all() and study != "vocab"]
    return df.drop(columns=unused + ([] if study == "router" else ["router"])).reset_index(drop=True)


def _trained_like(r: dict, r0: dict) -> bool:
    """Whether a run trained like r0 as far as a reference needs: preset, data (seed aside), stage-3 steps, and
    the same vocabulary rows."""
    def data(x: dict) -> dict:
        return {k: v for k, v in (x.get("data") or {}).items() if k != "seed"}

    return (r["preset"] == r0["preset"] and data(r) == data(r0) and vocab_key(r) == vocab_key(r0)
            and value_at(r, "config.stage3.steps") == value_at(r0, "config.stage3.steps"))


def _fft_reference(plot: Plot, spec: ReportSpec, r0: dict, bases: set[int] | None = None) -> tuple[dict | None, str]:
    """The FFT replicate group trained like a study's run r0 (_trained_like; the main runs first, else an FFT
    run in a biography study) on the study's base seeds (`bases`: a reference never pools bases the study's
    runs do not have): {'curves': {key: mean_curve}, 'dirs', 'n', 'label'} and a caption note."""
    pools = [("main", load_runs(plot, spec))]
    pools += [(f"study '{s}'", load_runs(plot, spec, study=s)) for s in study_names(plot, spec)]
    found, other = [], []
    for where, pool in pools:
        ffts = pool[(pool["method"] == "fft") & (pool["preset"] == r0["preset"])] if len(pool) else pool
        if bases is not None and len(ffts):
            ffts = ffts[ffts["base_seed"].isin(bases)]
        for _, row in ffts.iterrows():
            (found if _trained_like(row["result"], r0) else other).append({**row, "where": where,
                                                                           "group": config_id(row["result"], spec)})
    if not found:
        return None, (f" The FFT runs of preset '{r0['preset']}' ({', '.join(Path(x['dir']).name for x in other)}) "
                      f"trained on other data, steps or vocabulary rows; no reference drawn." if other else
                      f" No FFT run of preset '{r0['preset']}' on the study's base seeds to draw as a reference.")
    runs = pd.DataFrame(found)
    runs = runs[runs["group"] == runs["group"].iloc[0]].sort_values("date", kind="stable")
    runs = one_build(runs.drop_duplicates(["base_build", "base_seed", "run_seed"], keep="last"))
    frames = [metrics_with(plot, d, "task0/acc", "task1/acc") for d in runs["dir"]]
    runs, frames = runs[[m is not None for m in frames]], [m for m in frames if m is not None]
    if not frames:
        return None, " The matching FFT runs have no readable metrics; no reference drawn."
    units, _ = unit_frames(runs, frames)
    where = runs["where"].iloc[0]
    names = ", ".join(Path(d).name for d in runs["dir"])
    vocab = vocab_text(vocab_key(r0), *runs["result"])
    what = (f"the mean of {unit_name(runs)}, {where} runs ({names}; seeds {seeds_text(runs)})" if len(runs) >= 2
            else f"{where} run {names}")
    label = unit_label(("FFT, main runs" if len(runs) > 1 else "FFT, main run") if where == "main" else "FFT reference",
                       runs)
    return ({"curves": {k: mean_curve(units, k) for k in ("task0/acc", "task1/acc")}, "n": len(units),
             "label": label, "dirs": {str(d) for d in runs["dir"]}}, f" FFT reference with {vocab}: {what}.")


def fig_route_study(plot: Plot, spec: ReportSpec, study: str) -> list[Path]:
    """Paper Fig. 8 for one Route study: Task 0 / Task 1 accuracy and answer routing, a line per setting."""
    df = route_study_table(plot, spec, study)
    paths = save_figures(plot, draw_route_study(plot, spec, study, df))
    if not paths:
        return []
    stem = ROUTE_STUDIES.get(study, f"fig8_route_{study}")
    inputs = inputs_text(load_runs(plot, spec, study=study), f"table_{stem}: one row per run")
    return paths + write_table(plot, df.drop(columns="dir"), f"table_{stem}", inputs=inputs) + \
        write_study_means(plot, spec, study, f"table_{stem}")


def draw_route_study(plot: Plot, spec: ReportSpec, study: str, table: pd.DataFrame | None = None) -> Drawn:
    """Paper Fig. 8 for one Route study (`table`: its route_study_table, when already built). Route runs on
    different vocabulary rows (outside the vocab study) get a row of panels each, with the FFT reference
    trained on the same rows; the vocab study keeps one row and draws a reference per vocabulary."""
    df = route_study_table(plot, spec, study) if table is None else table
    if df.empty:
        return
    runs = [(row, metrics_or_none(plot, Path(row["dir"]))) for _, row in df.iterrows()]
    runs = pool_replicates([(row, m) for row, m in runs if m is not None],
                           lambda row: f"{row['method']} {row['setting']}")
    if not runs:
        return
    # panel (c): routing at the answer position; runs older than those records show routing over all tokens
    answers = any(answer_preserve(m, t) is not None for _, m in runs for t, _, _ in spec.eval_sets)
    route = answer_preserve if answers else (lambda m, task: route_series(m, task, "preserve"))
    routed = any(route(m, t) is not None for _, m in runs for t, _, _ in spec.eval_sets)
    study_runs = load_runs(plot, spec, study=study)
    result_of = {str(d): r for d, r in zip(study_runs["dir"], study_runs["result"], strict=True)}
    key_of = {str(row["dir"]): vocab_key(result_of[str(row["dir"])]) for row, _ in runs}
    keys = list(dict.fromkeys(key_of[str(row["dir"])] for row, _ in runs if row["method"] == "scale-route"))
    panel_keys = keys if study != "vocab" and len(keys) > 1 else [None]
    ncols = 3 if routed else 2
    fig, axes = plt.subplots(len(panel_keys), ncols, figsize=(FIG_WIDTH_IN, 3.5 * len(panel_keys) + 1.2),
                             squeeze=False)
    vocab_of = {k: vocab_text(k, *(r for r in study_runs["result"] if vocab_key(r) == k)) for k in keys}
    colors = dict(zip((str(row["dir"]) for row, _ in runs), ordered_colors(len(runs)), strict=True))
    notes = []
    for ax_row, key in zip(axes, panel_keys, strict=True):
        mine = [(row, m) for row, m in runs if key is None or key_of[str(row["dir"])] == key]
        for row, m in mine:
            _route_study_run(ax_row, spec, row, m, colors[str(row["dir"])], route if routed else None)
        refs = [k for k in keys if key in (None, k)]
        for i, k in enumerate(refs):
            r0 = next(result_of[str(row["dir"])] for row, _ in mine if key_of[str(row["dir"])] == k
                      and row["method"] == "scale-route")
            bases = {int(b) for r, b in zip(study_runs["result"], study_runs["base_seed"], strict=True)
                     if r["method"] == "scale-route" and vocab_key(r) == k}
            notes.append(_route_study_reference(ax_row, plot, spec, r0, {str(row["dir"]) for row, _ in mine},
                                                ("--", ":", "-.")[i % 3], vocab_of[k] if len(refs) > 1 else "",
                                                bases))
        _route_study_axes(ax_row, spec, result_of[str(mine[0][0]["dir"])], answers, routed,
                          f"\n{vocab_of[key]}" if key is not None else "")
    fig.text(0.5, -0.01, _route_study_caption(spec, study, study_runs, "".join(notes), len(panel_keys) > 1),
             ha="center", va="top", fontsize=7.5, wrap=True)
    legend_below(fig, axes.flat, ncol=3)
    stem = ROUTE_STUDIES.get(study, f"fig8_route_{study}")
    yield stem, with_inputs(fig, study_runs, f"{stem}: one line per run of study '{study}'")


def _route_study_run(ax_row, spec: ReportSpec, row: pd.Series, m: pd.DataFrame, color, route) -> None:
    """One run of a Route study: its Task 0 / Task 1 accuracy (another method's reference run: dashed) and,
    with `route`, its share routed to preserve (Task 0 solid, Task 1 dashed)."""
    for ax, (task, _, _) in zip(ax_row, spec.eval_sets, strict=False):
        if has_values(m, f"{task}/acc"):
            ax.plot(m["step"], 100 * m[f"{task}/acc"], color=color, marker=".", ms=2, lw=1.3,
                    ls="-" if row["method"] == "scale-route" else "--", label=row["setting"])
            draw_band(ax, m, "step", f"{task}/acc", color, 100)
    if route is not None:
        for task, ls in (("task0", "-"), ("task1", "--")):
            y = route(m, task)
            if y is not None:
                ax_row[2].plot(m["step"], 100 * y, color=color, ls=ls, marker=".", ms=2, lw=1.2)


def _route_study_reference(ax_row, plot: Plot, spec: ReportSpec, r0: dict, drawn: set[str], ls,
                           vocab: str = "", bases: set[int] | None = None) -> str:
    """The FFT reference trained like r0 (its vocabulary rows included) on the study's base seeds, black, on the
    accuracy panels: the mean over its units (base seeds, each base's run seeds averaged first, else run seeds;
    never pooled) with their 95% t band; `vocab`: one of several in the panel, named by its vocabulary. Nothing
    when the study draws FFT runs of its own (never twice)."""
    ref, note = _fft_reference(plot, spec, r0, bases)
    if ref is None:
        return note
    if ref["dirs"] & drawn:
        return note.rstrip(".") + " (the study's own FFT line)."
    label = ref["label"] + (f", {vocab}" if vocab else "")
    for ax, (task, _, _) in zip(ax_row, spec.eval_sets, strict=False):
        curve = ref["curves"][f"{task}/acc"]
        if curve is not None:  # the mean, and its t band where >= 2 replicates were evaluated
            draw_mean(ax, curve, 100, color="black", ls=ls, lw=1, label=label)
    return note


def _route_study_axes(ax_row, spec: ReportSpec, r0: dict, answers: bool, routed: bool, suffix: str) -> None:
    """Titles, labels, limits and the chance floor of one row of a Route study's panels."""
    prior = r0.get("priors", {}).get("task0_heldout", {}).get("pooled")
    if prior is not None:
        ax_row[0].axhline(100 * prior, color="grey", ls=":", lw=1, label="Task 0 chance floor")
    ax_row[0].set_title("(a) Task 0 (held-out) accuracy" + suffix, fontsize=10)
    ax_row[1].set_title("(b) Task 1 accuracy" + suffix, fontsize=10)
    ax_row[0].set_ylabel("first-token acc. (%)")
    if routed:
        where = "at the answer position" if answers else "(all tokens)"
        ax_row[2].set_title(f"(c) routed to preserve {where}" + suffix, fontsize=10)
        ax_row[2].set_ylabel("answer positions (%)" if answers else "tokens (%)")
        ax_row[2].plot([], [], color="grey", ls="-", label="Task 0 slice")
        ax_row[2].plot([], [], color="grey", ls="--", label="Task 1 slice")
    for ax in ax_row:
        ax.set_ylim(-3, 103)
        ax.set_xlabel(spec.step_label)
        ax.grid(alpha=0.3)


def _route_study_caption(spec: ReportSpec, study: str, study_runs: pd.DataFrame, fft_note: str, split: bool) -> str:
    """The caption of a Route study's figure: what varies, the fixed options, the reference lines."""
    routes = study_runs[study_runs["method"] == "scale-route"]
    r0 = (routes if len(routes) else study_runs).iloc[0]["result"]
    swept = {"tau": "the router threshold tau", "router": "what the router compares",
             "vocab": "the embedding/head rows"}.get(study, study)
    fixed = {k: v for k, v in (r0.get("method_options") or {}).items() if k != study}
    if study != "tau" and len({route_tau(r) for r in routes["result"]}) > 1:
        fixed.pop("tau", None)  # not one value across the runs: the table has each
    options = "; options " + ", ".join(l_fp_text(v, r0) if k == "l_fp" else f"{k}={option_text(v)}"
                                        for k, v in fixed.items()) if fixed else ""
    others = sorted({LABELS.get(m, m) for m in study_runs["method"] if m != "scale-route"})
    refs = f" Dashed coloured lines: {', '.join(others)} runs trained like the study's runs." if others else ""
    rows = (" A row of panels per vocabulary size (its titles), each with the FFT reference trained on those "
            "rows." if split else "")
    band = (" Black: FFT reference. A line with replicates is their mean, shaded its 95% Student-t interval per "
            "step over the units its label names: base seeds (each base's run seeds averaged first) or the run "
            "seeds of one base, never the two pooled.")
    return (f"SCALE-Route, study '{study}': {swept} varies, one line per run{options}." + refs + rows + band
            + fft_note + "\n" + spec.caption(r0))


@figure("route_studies")
def fig_route_studies(plot: Plot, spec: ReportSpec) -> list[Path]:
    """Fig. 8 per Route study present (tau, router, vocab, any other study of the experiment), with its table."""
    return [p for study in study_names(plot, spec) if study != ENSEMBLE_STUDY  # drawn by scalecl.report.ensemble
            for p in fig_route_study(plot, spec, study)]
