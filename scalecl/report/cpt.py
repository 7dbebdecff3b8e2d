"""The continual pre-training experiment's own figures (paper Fig. 9: forgetting and learning perplexity;
Fig. 4: width vs depth) and what its ReportSpec refers to: the caption of a CPT run, its evaluation sets, the
embedding variant that tells a study's bases apart."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker
import pandas as pd

from scalecl.report.context import Plot
from scalecl.report.draw import (
    FIG_WIDTH_IN,
    RATE_NOTE,
    SHADE_NOTE,
    UNIT_NOTE,
    Drawn,
    draw_mean,
    group_units,
    legend_below,
    mean_curve,
    method_colors,
    rate_styles,
    save_figures,
    unit_label,
    with_inputs,
)
from scalecl.report.registry import figure
from scalecl.report.runs import (
    METHOD_KEYS,
    group_label,
    group_settings,
    load_runs,
    rated_setting,
    replicate_groups,
    shown_path,
    value_at,
)
from scalecl.report.settings import l_fp_text
from scalecl.report.spec import ReportSpec

# FFT in fig9 is drawn on top of the others, thick with round markers: methods that learn like it would hide it
FFT_STYLE = {"lw": 2.6, "zorder": 5, "marker": "o", "ms": 3.5}
FFT_NOTE = ("FFT: thick line with round markers drawn over the others (methods close to it would hide it). "
            "Perplexity axes are log scale.")
# the evaluation sets: (metrics prefix, label, colour)
CPT_SETS = (("old", "old domain", "tab:blue"), ("new", "new domain", "tab:orange"))


def cpt_caption(r: dict) -> str:
    """What a CPT run trained: its base (a cached base by its name, wherever the cache was), the new-domain
    data, steps x batch x sequence length."""
    c = r["config"]
    base = c.get("base", r.get("base", {}).get("source", "?"))
    train = c.get("data", {}).get("path", r.get("data", {}).get("train", "?"))
    base = "a small Llama pre-trained on the stand-in's English (builtin)" if str(base) == "builtin" else shown_path(base)
    return (f"preset '{r['preset']}': base {base}; new-domain data {shown_path(str(train))}; {c['train']['steps']} steps x "
            f"{c['train']['batch']} x {c['train']['seq_len']} tokens. Old = forgetting PPL, new = learning PPL.")


def cpt_evaluation(r: dict) -> str:
    """How a CPT run was evaluated, in words (what tells apart runs of one preset evaluated differently): how
    often its evaluation slices were scored (the curves of fig9 and fig4), and whether the whole held-out sets
    were scored at the end (result.json heldout; their numbers are in heldout_cpt and frontier_cpt)."""
    every = value_at(r, "config.eval.every")
    steps = value_at(r, "config.train.steps")
    when = (f"slices every {every} steps" if isinstance(every, int) and every > 0
            else f"slices at steps 0 and {steps}")
    return when + ("; whole held-out sets at the end (heldout_cpt)" if isinstance(r.get("heldout"), dict) else "")


def embedding_variant(r: dict) -> str:
    """How a run's new embedding columns started and whether its base ties embedding and head: the init study's
    pairs with W21 = 0 learn only when the new columns are non-zero, which needs an untied base."""
    base = r.get("config", {}).get("base", "builtin")
    tied = r.get("config", {}).get("model", {}).get("tie_embeddings") if base == "builtin" else None
    ties = {True: "tied base", False: "untied base", None: str(base)}[tied]
    return f"{ties}, new embedding columns {r.get('method_options', {}).get('embed_init', 'zero')}"


def evaluation_rows(spec: ReportSpec, group: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """A preset's runs split by how they were evaluated (spec.evaluation), a row of panels each (one row, titled
    '', when they were all evaluated alike); each row's settings named among its own runs (runs.group_settings), so
    that what is the same in a row is not repeated in every label."""
    if spec.evaluation is None:
        return [("", group)]
    how = group["result"].map(spec.evaluation)
    if how.nunique() <= 1:
        return [("", group)]
    rows = []
    for text in sorted(dict.fromkeys(how)):  # in the order of their titles, not of their runs' labels
        sub = group[how == text].copy()
        sub["setting"] = group_settings(sub, spec)
        rows.append((text, sub))
    return rows


def preset_rates(reps: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """The replicate groups trained at the preset's own rates and options: those whose per-method tables (rates
    and options of every method, as the run's config records them) are the ones most groups share, as
    `--method all` trains them (a run at another rate or option changed its own method's entry); a method with
    no group there keeps all of its groups."""
    def tables(r: dict) -> str:
        cfg = r.get("config") or {}
        return json.dumps({k: cfg.get(k) for k in METHOD_KEYS}, sort_keys=True, default=str)

    key = {g.iloc[0]["group"]: tables(g.iloc[0]["result"]) for g in reps}
    common = Counter(key.values()).most_common(1)[0][0] if key else None
    methods_there = {g.iloc[0]["method"] for g in reps if key[g.iloc[0]["group"]] == common}
    return [g for g in reps if key[g.iloc[0]["group"]] == common or g.iloc[0]["method"] not in methods_there]


@figure("fig9")
def fig9(plot: Plot, spec: ReportSpec) -> list[Path]:
    """Forgetting (old-domain) and learning (new-domain) perplexity vs steps, all methods (paper Fig. 9)."""
    return save_figures(plot, draw_fig9(plot, spec))


FIG9_NOTE = ("A line per method at the rate and options its preset gives it (the per-method rate and option tables "
             "most runs share); the other rates are points of frontier_{name}, other settings (Adapt's l_fp) lines "
             "of fig4.")


def draw_fig9(plot: Plot, spec: ReportSpec) -> Drawn:
    """Paper Fig. 9 per preset: old- and new-domain perplexity, a line per method at its preset's rate (mean over
    its units and their band), a row of panels per way the runs were evaluated."""
    for preset, group in load_runs(plot, spec).groupby("preset", sort=False):
        rows = evaluation_rows(spec, group)
        fig, axes = plt.subplots(len(rows), 2, figsize=(FIG_WIDTH_IN, 3.6 * len(rows) + 1.0), squeeze=False)
        left_out = 0
        for ax_row, (title, sub) in zip(axes, rows, strict=True):
            reps = replicate_groups(sub)
            drawn = preset_rates(reps)
            left_out += len(reps) - len(drawn)
            _fig9_row(plot, ax_row, drawn, title)
        for ax in axes[-1]:
            ax.set_xlabel(spec.step_label)
        fft = "\n" + FFT_NOTE if (group["method"] == "fft").any() else ""
        note = "\n" + FIG9_NOTE.format(name=spec.name) if left_out else ""
        fig.text(0.5, -0.01, spec.caption(group.iloc[0]["result"]) + fft + note + "\n" + RATE_NOTE + " "
                 + SHADE_NOTE + "\n" + UNIT_NOTE,
                 ha="center", va="top", fontsize=8, wrap=True)
        legend_below(fig, axes.flat, ncol=3)
        stem = f"fig9_{spec.name}_{preset}"
        yield stem, with_inputs(fig, group, f"{stem}: old/new-domain perplexity")


def _fig9_row(plot: Plot, ax_row, reps: list[pd.DataFrame], title: str) -> None:
    """One row of Fig. 9: forgetting and learning perplexity, a line per replicate group (log axes)."""
    colours, rate_ls = method_colors(reps), rate_styles(reps)
    for g in reps:
        g, units = group_units(plot, g, "old/ppl", "new/ppl")
        if not units:  # recorded as skipped
            continue
        first = g.iloc[0]
        style = FFT_STYLE if first["method"] == "fft" else {"marker": ".", "ms": 3}
        label = unit_label(group_label({**first, "setting": rated_setting(first)}), g)
        for ax, key in zip(ax_row, ("old/ppl", "new/ppl"), strict=True):
            draw_mean(ax, mean_curve(units, key), color=colours[first["group"]], ls=rate_ls[first["group"]],
                       label=label, **style)
    for ax, what in zip(ax_row, ("(a) forgetting: old-domain perplexity", "(b) learning: new-domain perplexity"),
                        strict=True):
        ax.set_title(what + (f"\n{title}" if title else ""), fontsize=9)
        ax.set_ylabel("perplexity (log scale)")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
        ax.tick_params(which="both", labelsize=8)
        ax.grid(alpha=0.3, which="both")


@figure("fig4")
def fig4(plot: Plot, spec: ReportSpec) -> list[Path]:
    """Representation cosine (original channels, step 0 vs now) and forgetting PPL: width vs depth (Fig. 4)."""
    return save_figures(plot, draw_fig4(plot, spec))


FIG4_NAMES = {"scale-preserve": "Width (Preserve)", "scale-adapt": "Width (Adapt)", "llama-pro": "Depth (LLaMA Pro)"}


def draw_fig4(plot: Plot, spec: ReportSpec) -> Drawn:
    """Paper Fig. 4 per preset with a width or depth run: representation cosine and old-domain perplexity, a line
    per replicate group (Adapt at each l_fp its own, in a shade of Adapt's colour), a row of panels per way the
    runs were evaluated, one legend under them."""
    for preset, group in load_runs(plot, spec).groupby("preset", sort=False):
        group = group[group["method"].isin(FIG4_NAMES)]
        if group.empty:
            continue
        rows = evaluation_rows(spec, group)
        fig, axes = plt.subplots(len(rows), 2, figsize=(FIG_WIDTH_IN, 3.6 * len(rows) + 1.0), squeeze=False)
        for ax_row, (title, sub) in zip(axes, rows, strict=True):
            _fig4_row(plot, ax_row, replicate_groups(sub), title)
        for ax in axes[-1]:
            ax.set_xlabel(spec.step_label)
        fig.text(0.5, -0.01, spec.caption(group.iloc[0]["result"]) + "\n" + RATE_NOTE + " " + SHADE_NOTE + "\n"
                 + UNIT_NOTE, ha="center", va="top", fontsize=8, wrap=True)
        legend_below(fig, axes.flat, ncol=2)
        yield f"fig4_width_vs_depth_{preset}", with_inputs(fig, group, f"fig4_width_vs_depth_{preset}")


def _fig4_row(plot: Plot, ax_row, reps: list[pd.DataFrame], title: str) -> None:
    """One row of Fig. 4: representation cosine and forgetting perplexity, a line per replicate group."""
    colours, rate_ls = method_colors(reps, first=preset_rates(reps)), rate_styles(reps)
    for g in reps:
        g, units = group_units(plot, g, "rep_cos", "old/ppl")
        if not units:  # recorded as skipped
            continue
        row = g.iloc[0]
        label = FIG4_NAMES[row["method"]]
        if row["method"] == "scale-adapt":
            label += ", " + l_fp_text(row["result"]["method_options"].get("l_fp"), row["result"])
        setting = ", ".join(p for p in rated_setting(row).split(", ") if p and not p.startswith("l_fp="))
        label = unit_label(label + (f" [{setting}]" if setting else ""), g)
        for ax, key in zip(ax_row, ("rep_cos", "old/ppl"), strict=True):
            draw_mean(ax, mean_curve(units, key), marker=".", ms=3, color=colours[row["group"]],
                       ls=rate_ls[row["group"]], label=label)
    suffix = f"\n{title}" if title else ""
    ax_row[0].set_title("(a) representation forgetting" + suffix, fontsize=9)
    ax_row[0].set_ylabel("cosine of final hidden states\n(step 0 vs now)")
    ax_row[1].set_title("(b) forgetting perplexity (old domain)" + suffix, fontsize=9)
    ax_row[1].set_ylabel("perplexity")
    for ax in ax_row:
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
