"""lm-evaluation-harness results -> one score row per task and per language average (paper Table 2), as CSV
and Markdown, with the paper's averages beside ours. Pure functions of lm-eval's result dict.

Metric per task (our choice; the paper names the benchmarks, not the metric field): ``acc_norm`` for
ARC and HellaSwag (English and KoBEST), the group ``acc`` for MMLU (lm-eval weights its 57 subjects by
size), ``acc`` (the MC2 score) for TruthfulQA-MC2, ``acc`` for Winogrande, KoBEST BoolQ and KoBEST COPA.
Language averages are the unweighted mean of these per-task percentages over the paper's tasks.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# the paper's Table 2 tasks per language
ENGLISH_TASKS = ("arc_challenge", "hellaswag", "mmlu", "truthfulqa_mc2", "winogrande")
KOREAN_TASKS = ("kobest_boolq", "kobest_copa", "kobest_hellaswag")  # the paper's three, not lm-eval's 5-task group
LANGUAGE_TASKS = {"english": ENGLISH_TASKS, "korean": KOREAN_TASKS}

# task -> (language, metric). arc_easy is known (language, metric) but not part of the English average.
TASK_METRICS: dict[str, tuple[str, str]] = {
    "arc_challenge": ("english", "acc_norm"),
    "arc_easy": ("english", "acc_norm"),
    "hellaswag": ("english", "acc_norm"),
    "mmlu": ("english", "acc"),
    "truthfulqa_mc2": ("english", "acc"),
    "winogrande": ("english", "acc"),
    "kobest_boolq": ("korean", "acc"),
    "kobest_copa": ("korean", "acc"),
    "kobest_hellaswag": ("korean", "acc_norm"),
}


# metric preference for any other task
FALLBACK_METRICS = ("acc", "acc_norm", "exact_match", "f1", "mcc")


# The paper's Table 2 (zero-shot lm-evaluation-harness, Llama-3.2-1B continually pre-trained on Korean
# FineWeb-2): only the two language averages are used here; per-task numbers are deliberately not copied.
PAPER_SOURCE = "SCALE (arXiv 2511.03270) Table 2: Llama-3.2-1B, Korean continual pre-training, zero-shot averages"


PAPER_ROWS: dict[str | None, tuple[str, dict[str, float]]] = {
    # scalecl.json "method" (None = the base model) -> (row label, {language: average})
    None: ("Llama-3.2-1B", {"english": 47.14, "korean": 51.15}),
    "fft": ("FFT", {"english": 42.79, "korean": 57.21}),
    "lora": ("LoRA", {"english": 42.59, "korean": 57.25}),
    "llama-pro": ("LLaMA Pro", {"english": 44.55, "korean": 55.81}),
    "freeze": ("Freeze", {"english": 42.44, "korean": 54.67}),
    "scale-preserve": ("SCALE-Preserve", {"english": 46.09, "korean": 53.14}),
    "scale-adapt": ("SCALE-Adapt", {"english": 46.15, "korean": 55.09}),
    "scale-route": ("SCALE-Route", {"english": 46.49, "korean": 55.50}),
}


CSV_COLUMNS = ("kind", "task", "language", "metric", "score", "stderr", "n", "paper")


_NOT_METRICS = {"alias", "name", "sample_len", "samples", " "}


@dataclass
class ScoreRow:
    kind: str  # "task" or "average"
    task: str
    language: str  # english, korean or "" for other tasks
    metric: str
    score: float | None  # percent for bounded metrics
    stderr: float | None
    n: int | None  # examples evaluated (task) or tasks averaged (average)
    paper: float | None = None  # the paper's number, only known for averages


def _number(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _metric_keys(entry: Mapping[str, Any]) -> dict[str, str]:
    """metric name -> its result key (first filter) among an lm-eval results entry."""
    found: dict[str, str] = {}
    for key, value in entry.items():
        name, _, _ = key.partition(",")
        if name in _NOT_METRICS or name.endswith("_stderr") or _number(value) is None or "," not in key:
            continue
        found.setdefault(name, key)
    return found


def pick_metric(task: str, available: Iterable[str], overrides: Mapping[str, str] | None = None) -> str | None:
    """The Table 2 metric for a paper task, an override, or acc > acc_norm > exact_match > f1 > first."""
    available = list(available)
    wanted = (overrides or {}).get(task) or TASK_METRICS.get(task, ("", ""))[1]
    if wanted:
        return wanted if wanted in available else None
    for m in FALLBACK_METRICS:
        if m in available:
            return m
    return available[0] if available else None


def _percent(metric: str, value: float) -> float:
    return value if "perplexity" in metric or "bits_per" in metric else 100.0 * value


def _top_level(results: Mapping[str, Any]) -> list[str]:
    """Result names that are not inside a group (a group like mmlu is reported once, not per subject)."""
    children = {c for subs in (results.get("group_subtasks") or {}).values() for c in subs}
    names = list(results.get("results", {}))
    names += [g for g in (results.get("groups") or {}) if g not in names]
    return [n for n in names if n not in children]


def _samples(results: Mapping[str, Any], name: str) -> int | None:
    n = (results.get("n-samples") or {}).get(name)
    if n is not None:
        return int(n.get("effective", n.get("original", 0)))
    subs = (results.get("group_subtasks") or {}).get(name)
    if subs:
        counts = [_samples(results, s) for s in subs]
        return sum(c for c in counts if c is not None)
    return None


def score_rows(
    results: Mapping[str, Any], method: str | None = None, *, paper: bool = True,
    metric_overrides: Mapping[str, str] | None = None, order: Sequence[str] = (),
) -> list[ScoreRow]:
    """One row per top-level task (its Table 2 metric), then one average per language with the paper's.

    Tasks come in `order` (e.g. the order asked for), then the rest as lm-eval lists them.
    """
    rows: list[ScoreRow] = []
    names = _top_level(results)
    rank = {n: i for i, n in enumerate(order)}
    names.sort(key=lambda n: rank.get(n, len(rank)))  # stable: unlisted names keep lm-eval's order
    for name in names:
        entry = (results.get("results") or {}).get(name) or (results.get("groups") or {}).get(name) or {}
        keys = _metric_keys(entry)
        metric = pick_metric(name, keys, metric_overrides)
        language = TASK_METRICS.get(name, ("", ""))[0]
        if metric is None:
            wanted = (metric_overrides or {}).get(name) or TASK_METRICS.get(name, ("", ""))[1] or "any"
            rows.append(ScoreRow("task", name, language, f"{wanted} (missing)", None, None, _samples(results, name)))
            continue
        key = keys[metric]
        value = _number(entry[key])
        stderr = _number(entry.get(key.replace(",", "_stderr,", 1)))
        rows.append(ScoreRow(
            "task", name, language, metric,
            None if value is None else _percent(metric, value),
            None if stderr is None else _percent(metric, stderr),
            _samples(results, name),
        ))
    paper_avgs = PAPER_ROWS.get(method, (None, {}))[1] if paper else {}
    for language, paper_tasks in LANGUAGE_TASKS.items():
        scores = [r.score for r in rows if r.task in paper_tasks and r.score is not None]
        if not scores:
            continue
        rows.append(ScoreRow(
            "average", f"{language}_avg", language, f"mean({len(scores)}/{len(paper_tasks)})",
            sum(scores) / len(scores), None, len(scores), paper_avgs.get(language),
        ))
    return rows


def paper_label(method: str | None) -> str | None:
    row = PAPER_ROWS.get(method)
    return f"paper: {row[0]} ({PAPER_SOURCE})" if row else None


def _fmt(v: float | None, digits: int = 2) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def rows_to_csv(rows: Sequence[ScoreRow]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        writer.writerow([r.kind, r.task, r.language, r.metric, _fmt(r.score, 4), _fmt(r.stderr, 4),
                         "" if r.n is None else r.n, _fmt(r.paper)])
    return buf.getvalue()


def rows_to_markdown(rows: Sequence[ScoreRow], title: str, caption: str | None = None) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(CSV_COLUMNS) + " |", "|" + "---|" * len(CSV_COLUMNS)]
    for r in rows:
        cells = [r.kind, r.task, r.language, r.metric, _fmt(r.score), _fmt(r.stderr), "" if r.n is None else str(r.n),
                 _fmt(r.paper)]
        lines.append("| " + " | ".join(cells) + " |")
    if caption:
        lines += ["", caption]
    return "\n".join(lines) + "\n"


def json_safe(obj: Any) -> Any:
    """lm-eval's results as strict JSON: numpy scalars unwrapped, NaN/inf -> null, anything else -> str."""
    import numpy as np

    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        return json_safe(obj.item())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def format_rows(rows: Sequence[ScoreRow]) -> list[tuple[list[str], bool]]:
    """Cells for a terminal table (task, language, metric, score, stderr, n, paper) and whether a row is an average."""
    return [([r.task, r.language, r.metric, _fmt(r.score), _fmt(r.stderr), "" if r.n is None else str(r.n),
              _fmt(r.paper)], r.kind == "average") for r in rows]
