"""The continual pre-training experiment's own figures (paper Fig. 9: forgetting and learning perplexity;
Fig. 4: width vs depth) and what its ReportSpec refers to: the caption of a CPT run, its evaluation sets, the
embedding variant that tells a study's bases apart."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker
import pandas as pd

from scalecl.report.context import Plot
from scalecl.report.draw import (
    BAND_NOTE,
    COLORS,
    RATE_NOTE,
    Drawn,
    _draw_mean,
    _group_metrics,
    _save_all,
    _with_inputs,
    mean_curve,
    rate_styles,
)
from scalecl.report.registry import figure
from scalecl.report.runs import (
    _n_label,
    _replicates_note,
    group_label,
    load_runs,
    rated_setting,
    replicate_groups,
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
    """What a CPT run trained: its base, the new-domain data, steps x batch x sequence length."""
    c = r["config"]
    base = c.get("base", r.get("base", {}).get("source", "?"))
    train = c.get("data", {}).get("path", r.get("data", {}).get("train", "?"))
    if str(base) == "builtin":
        base = "a small Llama pre-trained on the stand-in's English (builtin)"
    return (f"preset '{r['preset']}': base {base}; new-domain data {train}; {c['train']['steps']} steps x "
            f"{c['train']['batch']} x {c['train']['seq_len']} tokens. Old = forgetting PPL, new = learning PPL.")


def embedding_variant(r: dict) -> str:
    """How a run's new embedding columns started and whether its base ties embedding and head: the init study's
    pairs with W21 = 0 learn only when the new columns are non-zero, which needs an untied base."""
    base = r.get("config", {}).get("base", "builtin")
    tied = r.get("config", {}).get("model", {}).get("tie_embeddings") if base == "builtin" else None
    ties = {True: "tied base", False: "untied base", None: str(base)}[tied]
    return f"{ties}, new embedding columns {r.get('method_options', {}).get('embed_init', 'zero')}"


@figure("fig9")
def fig9(plot: Plot, spec: ReportSpec) -> list[Path]:
    """Forgetting (old-domain) and learning (new-domain) perplexity vs steps, all methods (paper Fig. 9)."""
    return _save_all(plot, draw_fig9(plot, spec))


def draw_fig9(plot: Plot, spec: ReportSpec) -> Drawn:
    """Paper Fig. 9 per preset: old- and new-domain perplexity, a line per replicate group (mean and band)."""
    for preset, group in load_runs(plot, spec).groupby("preset", sort=False):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        reps = replicate_groups(group)
        rate_ls = rate_styles(reps)
        for g in reps:
            ms = _group_metrics(plot, g, "old/ppl", "new/ppl")
            if not ms:  # recorded as skipped
                continue
            first = g.iloc[0]
            style = FFT_STYLE if first["method"] == "fft" else {"marker": ".", "ms": 3}
            label = _n_label(group_label({**first, "setting": rated_setting(first)}), len(ms))
            for ax, key in zip(axes, ("old/ppl", "new/ppl"), strict=True):
                _draw_mean(ax, mean_curve(ms, key), color=COLORS.get(first["method"]), ls=rate_ls[first["group"]],
                           label=label, **style)
        axes[0].set_title("(a) forgetting: old-domain perplexity")
        axes[1].set_title("(b) learning: new-domain perplexity")
        for ax in axes:
            ax.set_xlabel(spec.step_label)
            ax.set_ylabel("perplexity (log scale)")
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
            ax.grid(alpha=0.3, which="both")
        axes[1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
        band = "\n" + BAND_NOTE if any(len(g) >= 2 for g in reps) else ""
        fft = "\n" + FFT_NOTE if (group["method"] == "fft").any() else ""
        fig.text(0.5, -0.02, spec.caption(group.iloc[0]["result"]) + fft + "\n" + RATE_NOTE + band + "\n"
                 + _replicates_note(group),
                 ha="center", va="top", fontsize=8, wrap=True)
        fig.tight_layout()
        stem = f"fig9_{spec.name}_{preset}"
        yield stem, _with_inputs(fig, group, f"{stem}: old/new-domain perplexity")


# colours for SCALE-Adapt at a second, third ... l_fp in Fig. 4 (the first keeps the method's colour)
EXTRA_COLOURS = ("tab:olive", "tab:pink", "tab:gray")


def _fig4_line(row: pd.Series) -> str:
    """Fig. 4's line of a run: its method, and for SCALE-Adapt its l_fp ("scale-adapt l_fp=0")."""
    if row["method"] != "scale-adapt":
        return row["method"]
    return f"scale-adapt l_fp={row['result']['method_options'].get('l_fp')}"


def _fig4_colours(lines: Iterable[str]) -> dict[str, str]:
    """A colour per Fig. 4 line: the method's (COLORS). SCALE-Adapt's l_fp values in order, l_fp = 0 (W12 in every
    layer) last: the first keeps the method's colour, each further one takes an EXTRA_COLOURS entry."""
    adapt = sorted({x for x in lines if x.startswith("scale-adapt")}, key=lambda x: (x.endswith("l_fp=0"), x))
    extra = {x: EXTRA_COLOURS[(i - 1) % len(EXTRA_COLOURS)] for i, x in enumerate(adapt) if i}
    return {**COLORS, **{x: COLORS["scale-adapt"] for x in adapt[:1]}, **extra}


@figure("fig4")
def fig4(plot: Plot, spec: ReportSpec) -> list[Path]:
    """Representation cosine (original channels, step 0 vs now) and forgetting PPL: width vs depth (Fig. 4)."""
    return _save_all(plot, draw_fig4(plot, spec))


def draw_fig4(plot: Plot, spec: ReportSpec) -> Drawn:
    """Paper Fig. 4 per preset with a width or depth run: representation cosine and old-domain perplexity."""
    wanted = ("scale-preserve", "scale-adapt", "llama-pro")
    names = {"scale-preserve": "Width (Preserve)", "scale-adapt": "Width (Adapt)", "llama-pro": "Depth (LLaMA Pro)"}
    for preset, group in load_runs(plot, spec).groupby("preset", sort=False):
        group = group[group["method"].isin(wanted)]
        if group.empty:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        # a line per width or depth: Adapt at each l_fp is its own (the paper's Width (Adapt) trains W12 in every
        # layer, l_fp = 0), with its own colour; line styles tell the rates within one
        groups = [g.assign(method=_fig4_line(g.iloc[0])) for g in replicate_groups(group)]
        rate_ls = rate_styles(groups)
        colours = _fig4_colours(g.iloc[0]["method"] for g in groups)
        for g in groups:
            ms = _group_metrics(plot, g, "rep_cos", "old/ppl")
            if not ms:  # recorded as skipped
                continue
            row = g.iloc[0]
            label = names[row["method"].split(" ")[0]]
            if row["method"].startswith("scale-adapt"):
                label += ", " + l_fp_text(row["result"]["method_options"].get("l_fp"), row["result"])
            label = _n_label(label + f" [{rated_setting(row)}]" if rated_setting(row) else label, len(ms))
            for ax, key in zip(axes, ("rep_cos", "old/ppl"), strict=True):
                _draw_mean(ax, mean_curve(ms, key), marker=".", ms=3, color=colours[row["method"]],
                           ls=rate_ls[row["group"]], label=label)
        axes[0].set_title("(a) representation forgetting")
        axes[0].set_ylabel("cosine of final hidden states (step 0 vs now)")
        axes[1].set_title("(b) forgetting perplexity (old domain)")
        axes[1].set_ylabel("perplexity")
        for ax in axes:
            ax.set_xlabel(spec.step_label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        band = "\n" + BAND_NOTE if any(len(g) >= 2 for g in replicate_groups(group)) else ""
        fig.text(0.5, -0.02, spec.caption(group.iloc[0]["result"]) + "\n" + RATE_NOTE + band + "\n"
                 + _replicates_note(group),
                 ha="center", va="top", fontsize=8, wrap=True)
        fig.tight_layout()
        yield f"fig4_width_vs_depth_{preset}", _with_inputs(fig, group, f"fig4_width_vs_depth_{preset}")
