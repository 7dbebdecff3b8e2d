"""Per-item results of lm-eval, a fixed seeded subset of every task, and paired differences between two models.

**Units.** A unit is what a Table 2 column scores: a top-level task (arc_easy), or a group scored as one (mmlu,
its 57 subject tasks). Its score is the mean of a metric over all its items (for mmlu, lm-eval's group ``acc``
weighted by subject size is exactly that).

**Subset** (``--limit-per-task N --subset-seed S``): N items of each unit, the same for every model. A unit of
several tasks gets N split over its tasks in proportion to their sizes (largest remainders, at least one each),
so the subset's mean estimates the whole unit's; within a task, ``random.Random(f"{S}:{task}")`` draws its
items from its document indices 0..n-1 (sorted). The draw depends only on the seed, the task's name and its
number of documents, never on the model.

**Items** (``items.jsonl``): one line per scored document: ``task`` (the lm-eval task), ``doc_id`` (its index in
the split lm-eval scores), ``doc_hash`` (lm-eval's sha256 of the document, 16 hex digits: two runs pair an item
only when it is the same document), and each per-item metric lm-eval computed (``acc``, ``acc_norm``: 1.0 correct,
0.0 not).

**Paired difference** of model B against model A on one unit: d_i = B_i - A_i over the items both scored
(percentage points), its mean with the 95% Student-t interval mean +- t_{0.975, n-1} sd(d) / sqrt(n). For 0/1
items sd(d)^2 ~ p_disagree, the share of items the two models disagree on, which is small for models that share
most of their answers: the pairing is what makes a subset informative. The difference of an average of K units is
the average of their differences, with the standard error sqrt(sum se_k^2) / K (the units' items are
independent). Over run seeds (several trained models of one method against one base): the seeds' differences,
their mean with the t interval over the seeds.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scalecl.common.errors import ScaleclError

ITEMS_FILE = "items.jsonl"
HASH_DIGITS = 16
LEVEL = 0.95


# ---------------------------------------------------------------------------------------------------------
# Units and the subset


def units_of(loaded: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """unit -> {task: number of documents it scores} from lm-eval's loaded tasks (TaskManager.load): every
    top-level group is one unit of all the tasks under it; every task outside a group is its own unit."""
    groups = loaded.get("groups") or {}
    children = {c for g in groups.values() for c in getattr(g, "child_names", [])}
    units: dict[str, dict[str, int]] = {}
    placed: set[str] = set()
    for name, group in groups.items():
        if name in children:
            continue
        tasks = {t.task_name: len(t.eval_docs) for t in group.get_all_tasks()}
        units[name] = dict(sorted(tasks.items()))
        placed |= set(tasks)
    for name, task in (loaded.get("tasks") or {}).items():
        if name not in placed:
            units[name] = {name: len(task.eval_docs)}
    return units


def allocate(sizes: Mapping[str, int], n: int) -> dict[str, int]:
    """n items over tasks of these sizes, in proportion (largest remainders), at least one each, at most a task's
    size. Needs len(sizes) <= n < sum(sizes)."""
    total = sum(sizes.values())
    quota = {t: n * s / total for t, s in sizes.items()}
    got = {t: min(sizes[t], max(1, math.floor(q))) for t, q in quota.items()}
    while sum(got.values()) < n:  # the largest remainders first (ties: name order)
        t = max((t for t in got if got[t] < sizes[t]), key=lambda t: (quota[t] - got[t], t))
        got[t] += 1
    while sum(got.values()) > n:  # the minimum of one pushed the sum over: take from the most over its quota
        t = max((t for t in got if got[t] > 1), key=lambda t: (got[t] - quota[t], t))
        got[t] -= 1
    return got


def subset_indices(units: Mapping[str, Mapping[str, int]], per_task: int, seed: int) -> dict[str, list[int]]:
    """task -> the sorted document indices it scores (module docstring); a unit with at most `per_task` items is
    scored whole (its tasks are left out of the result). One error when a unit has more tasks than `per_task`."""
    out: dict[str, list[int]] = {}
    for unit, sizes in units.items():
        if per_task >= sum(sizes.values()):
            continue
        if per_task < len(sizes):
            raise ScaleclError(f"--limit-per-task {per_task} is fewer items than {unit} has tasks ({len(sizes)}); "
                               f"give at least {len(sizes)}")
        for task, k in allocate(sizes, per_task).items():
            out[task] = sorted(random.Random(f"{seed}:{task}").sample(range(sizes[task]), k))
    return out


# ---------------------------------------------------------------------------------------------------------
# Items


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float) and math.isfinite(float(v)):
        return float(v)
    try:  # numpy scalars
        f = float(v.item())
    except (AttributeError, TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def item_rows(samples: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict]:
    """One row per scored document of lm-eval's logged samples (simple_evaluate(log_samples=True)["samples"]):
    task, doc_id, doc_hash (shortened), the filter when it is not lm-eval's plain "none", and every numeric
    per-item metric. Sorted by task, then doc id."""
    rows = []
    for task, logged in samples.items():
        for s in logged:
            row: dict[str, Any] = {"task": task, "doc_id": int(s["doc_id"]),
                                   "doc_hash": str(s.get("doc_hash", ""))[:HASH_DIGITS]}
            if s.get("filter", "none") != "none":
                row["filter"] = s["filter"]
            for metric in s.get("metrics") or []:
                value = _number(s.get(metric))
                if value is not None:
                    row[metric] = value
            rows.append(row)
    return sorted(rows, key=lambda r: (r["task"], r.get("filter", ""), r["doc_id"]))


def items_text(rows: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(dict(r), sort_keys=False) + "\n" for r in rows)


def parse_items(text: str, where: str = "items") -> list[dict]:
    """The rows of an items.jsonl text; a line that is not a row (task, doc_id) is one error naming the line."""
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not (isinstance(row, dict) and isinstance(row.get("task"), str) and isinstance(row.get("doc_id"), int)):
            raise ScaleclError(f"{where}: line {i} is not an item (task, doc_id)")
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------------------
# Paired differences


@dataclass(frozen=True)
class Paired:
    """B - A on one unit (or an average of units, or over seeds), in percentage points: n items (or seeds), both
    means, the mean difference with its 95% interval, the standard error, and the share of items the two
    disagree on (NaN for averages and seeds)."""

    n: int
    a: float
    b: float
    diff: float
    lo: float
    hi: float
    se: float
    disagree: float = math.nan
    unit: str = "items"


def _t(n: int) -> float:
    from scipy.stats import t

    return float(t.ppf((1 + LEVEL) / 2, n - 1))


def _key(r: Mapping[str, Any]) -> tuple[str, str, int]:
    return r["task"], r.get("filter", ""), r["doc_id"]


def paired_difference(a_items: Sequence[Mapping[str, Any]], b_items: Sequence[Mapping[str, Any]],
                      tasks: Iterable[str], metric: str) -> Paired:
    """B - A on the items of `tasks` both scored (module docstring), metric values as 0..1 -> percentage points.
    An item both scored must be the same document (its doc_hash): else one error, since the runs read different
    data. No item in common: NaN."""
    wanted = set(tasks)
    a = {_key(r): r for r in a_items if r["task"] in wanted and metric in r}
    b = {_key(r): r for r in b_items if r["task"] in wanted and metric in r}
    shared = sorted(set(a) & set(b))
    for k in shared:
        if a[k].get("doc_hash") != b[k].get("doc_hash"):
            raise ScaleclError(f"item {k[0]} #{k[2]} is not the same document in the two runs (doc_hash "
                               f"{a[k].get('doc_hash')} and {b[k].get('doc_hash')}): they read different data")
    n = len(shared)
    if n == 0:
        return Paired(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    xa = [100 * float(a[k][metric]) for k in shared]
    xb = [100 * float(b[k][metric]) for k in shared]
    d = [y - x for x, y in zip(xa, xb, strict=True)]
    mean = math.fsum(d) / n
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else math.nan
    se = sd / math.sqrt(n) if n > 1 else math.nan
    half = _t(n) * se if n > 1 else math.nan
    disagree = sum(x != y for x, y in zip(xa, xb, strict=True)) / n
    return Paired(n, math.fsum(xa) / n, math.fsum(xb) / n, mean, mean - half, mean + half, se, disagree)


def average_difference(parts: Sequence[Paired]) -> Paired:
    """The difference of the unweighted average of K units: the mean of their differences, se sqrt(sum se^2)/K,
    the interval +-1.96 se (the items of different units are independent, and each n is large). NaN when a part
    is."""
    k = len(parts)
    if k == 0 or any(math.isnan(p.diff) or math.isnan(p.se) for p in parts):
        return Paired(k, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, unit="units")
    from scipy.stats import norm

    diff = math.fsum(p.diff for p in parts) / k
    se = math.sqrt(math.fsum(p.se**2 for p in parts)) / k
    z = float(norm.ppf((1 + LEVEL) / 2))
    return Paired(k, math.fsum(p.a for p in parts) / k, math.fsum(p.b for p in parts) / k, diff, diff - z * se,
                  diff + z * se, se, unit="units")


def over_seeds(diffs: Sequence[Paired]) -> Paired:
    """The mean of several seeds' differences (each B_seed - A) with the Student-t interval over the seeds (n-1
    degrees of freedom; no interval for one seed)."""
    xs = [p.diff for p in diffs if not math.isnan(p.diff)]
    n = len(xs)
    if n == 0:
        return Paired(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, unit="seeds")
    mean = math.fsum(xs) / n
    a = math.fsum(p.a for p in diffs if not math.isnan(p.diff)) / n
    b = math.fsum(p.b for p in diffs if not math.isnan(p.diff)) / n
    if n == 1:
        return Paired(1, a, b, mean, math.nan, math.nan, math.nan, unit="seeds")
    se = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1)) / math.sqrt(n)
    half = _t(n) * se
    return Paired(n, a, b, mean, mean - half, mean + half, se, unit="seeds")


def items_needed(half_width: float, disagree: float, level: float = LEVEL) -> int:
    """Items a paired comparison needs for a 95% interval of +-`half_width` percentage points when the two models
    disagree on a share `disagree` of the items: n = (z / h)^2 * p_disagree (sd(d)^2 ~ p_disagree for 0/1 items
    with a small mean difference)."""
    from scipy.stats import norm

    z = float(norm.ppf((1 + level) / 2))
    return math.ceil((z / (half_width / 100)) ** 2 * disagree)
