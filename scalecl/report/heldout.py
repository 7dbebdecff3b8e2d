"""The final held-out evaluation of continual pre-training (result.json `heldout`, written when a run sets
eval.final_take): per replicate group the base's and the final model's perplexity on the whole held-out sets at
the training length and at the long context, with 95% t intervals, and SCALE-Route's paired differences from
every other method on those numbers."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from scalecl.report.context import Plot
from scalecl.report.registry import table
from scalecl.report.runs import inputs_text, load_runs
from scalecl.report.spec import Metric, ReportSpec
from scalecl.report.tables import (
    AGG_CAPTION,
    PAIRED_CAPTION,
    aggregate_table,
    reference_pairs,
    shown_aggregate,
    write_table,
)

ROLES = ("train", "context")  # the training length, then the long context (eval.final_context)


def heldout_values(r: dict) -> dict[str, float]:
    """A run's held-out perplexities by set, length role and point: {"old_train_end": ..., ...} (NaN where a run
    has no such length); the lengths themselves as "train_len", "context_len"."""
    h = r["heldout"]
    lengths = list(h["lengths"]) + [None] * (len(ROLES) - len(h["lengths"]))
    out: dict[str, float] = {}
    for role, n in zip(ROLES, lengths, strict=True):
        out[f"{role}_len"] = n if n is not None else math.nan
        for split in ("old", "new"):
            at = h[split]["at"].get(str(n), {}) if n is not None else {}
            for point in ("start", "end"):
                out[f"{split}_{role}_{point}"] = at.get(point, {}).get("ppl", math.nan)
    return out


def heldout_point(r: dict) -> dict[str, float] | None:
    """A run's end-of-training learning and forgetting perplexity on the whole held-out sets at the training
    length (new_ppl_end, old_ppl_end: the frontier's columns), or None when it has no final held-out evaluation."""
    if not isinstance(r.get("heldout"), dict):
        return None
    v = heldout_values(r)
    return {"new_ppl_end": v["new_train_end"], "old_ppl_end": v["old_train_end"]}


HELDOUT_METRICS: tuple[Metric, ...] = tuple(
    (f"{split}_{role}_{point}", f"heldout_values.{split}_{role}_{point}", None)
    for role in ROLES for split in ("old", "new") for point in ("start", "end"))
PAIRED = tuple((f"{split}_{role}_end", f"heldout_values.{split}_{role}_end") for role in ROLES for split in ("old", "new"))

HELDOUT_NOTE = ("Perplexity of the base (start: every method is exact at initialisation, so it is every method's "
                "step 0) and of each final model (end) on every document of both held-out splits "
                "(result.json heldout; eval.final_take): old = the old domain (forgetting), new = the new domain "
                "(learning); train = at the training length (train_len), context = at the long context "
                "(context_len, eval.final_context).")


def heldout_runs(plot: Plot, spec: ReportSpec) -> pd.DataFrame:
    """The main runs that recorded a final held-out evaluation, each result given its `heldout_values`."""
    runs = load_runs(plot, spec)
    if runs.empty:
        return runs
    runs = runs[[isinstance(r.get("heldout"), dict) for r in runs["result"]]].copy()
    runs["result"] = [r | {"heldout_values": heldout_values(r)} for r in runs["result"]]
    return runs


def heldout_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per replicate group: the lengths, then each held-out perplexity's mean and t interval."""
    return aggregate_table(runs, HELDOUT_METRICS, lambda r: {
        "lr": r["lr"], "train_len": r["heldout_values"]["train_len"],
        "context_len": r["heldout_values"]["context_len"]})


@table("heldout")
def heldout_tables(plot: Plot, spec: ReportSpec) -> list[Path]:
    """heldout_<name> (means over replicates with t intervals) and paired_heldout_<name> (Route minus each other
    method), for the runs with a final held-out evaluation; nothing when none has one."""
    runs = heldout_runs(plot, spec)
    if runs.empty:
        return []
    df = heldout_table(runs)
    shown = shown_aggregate(df, HELDOUT_METRICS, "{:.2f}")
    shown.insert(shown.columns.get_loc("lr") + 1, "lengths",
                 [f"{int(t)} / {'' if math.isnan(c) else int(c)}" for t, c in zip(df["train_len"], df["context_len"],
                                                                                  strict=True)])
    stem = f"heldout_{spec.name}"
    written = write_table(plot, df, stem, shown=shown, caption=f"{AGG_CAPTION} {HELDOUT_NOTE}",
                          inputs=inputs_text(runs, f"{stem}: one row per replicate group"))
    paired = pd.DataFrame(reference_pairs(runs, PAIRED))  # SCALE-Route minus each method, by base or run seed
    if len(paired):
        written += write_table(plot, paired, f"paired_{stem}", float_fmt="{:.3f}",
                               caption=PAIRED_CAPTION.format(what=f"Metrics: the final models' {HELDOUT_NOTE}"),
                               inputs=inputs_text(runs, f"paired_{stem}: runs compared per base seed or run seed"))
    return written
