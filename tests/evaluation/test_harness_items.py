"""The seeded subset, the per-item rows and the paired differences of scalecl.evaluation.harness_items, as pure
functions; the command's end of it (items.jsonl pairing two checkpoints) is in test_harness.py."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalecl.common.errors import ScaleclError
from scalecl.evaluation import harness_items as hi

MMLU_LIKE = {f"mmlu_{i}": n for i, n in enumerate([100, 135, 152, 100, 265, 144, 100, 100, 1534, 311, 895])}


def test_allocation_is_proportional_with_at_least_one_each():
    got = hi.allocate(MMLU_LIKE, 300)
    total = sum(MMLU_LIKE.values())
    assert sum(got.values()) == 300 and min(got.values()) >= 1
    for t, n in MMLU_LIKE.items():
        assert abs(got[t] - 300 * n / total) < 1 + 1e-9, t  # largest remainders: within one of the quota
    small = hi.allocate({"a": 1000, "b": 1, "c": 1}, 10)
    assert small == {"a": 8, "b": 1, "c": 1}  # the minimum of one is taken from the largest


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 400), min_size=1, max_size=12), data=st.data())
def test_allocation_always_sums_to_n_within_sizes(sizes, data):
    named = {f"t{i}": n for i, n in enumerate(sizes)}
    n = data.draw(st.integers(len(named), max(len(named), sum(sizes) - 1)))
    if n >= sum(sizes):
        return
    got = hi.allocate(named, n)
    assert sum(got.values()) == n and all(1 <= got[t] <= named[t] for t in named)


def test_the_subset_depends_on_seed_task_and_size_only():
    units = {"mmlu": MMLU_LIKE, "arc_easy": {"arc_easy": 2376}, "winogrande": {"winogrande": 1267}}
    a = hi.subset_indices(units, 200, seed=0)
    assert a == hi.subset_indices(dict(reversed(units.items())), 200, seed=0)  # not the order of the units
    assert sum(len(a[t]) for t in MMLU_LIKE) == 200 and len(a["arc_easy"]) == 200
    assert all(v == sorted(set(v)) and 0 <= v[0] and v[-1] < (MMLU_LIKE | {"arc_easy": 2376, "winogrande": 1267})[t]
               for t, v in a.items())
    assert a["arc_easy"] == sorted(random.Random("0:arc_easy").sample(range(2376), 200))  # the documented draw
    b = hi.subset_indices(units, 200, seed=1)
    assert set(a["arc_easy"]) != set(b["arc_easy"])
    assert "winogrande" not in hi.subset_indices({"winogrande": {"winogrande": 150}}, 200, seed=0)  # all of it
    with pytest.raises(ScaleclError, match="--limit-per-task 5 is fewer items than mmlu has tasks .11.; give at "
                                           "least 11"):
        hi.subset_indices(units, 5, seed=0)


def test_item_rows_keep_the_per_item_metrics():
    import numpy as np

    samples = {"b": [{"doc_id": 7, "doc_hash": "f" * 64, "filter": "none", "metrics": ["acc", "acc_norm"],
                      "acc": np.float64(1.0), "acc_norm": 0.0}],
               "a": [{"doc_id": 3, "doc_hash": "e" * 64, "filter": "strict", "metrics": ["f1", "acc"],
                      "f1": (1, 0), "acc": True}]}
    rows = hi.item_rows(samples)
    assert rows == [{"task": "a", "doc_id": 3, "doc_hash": "e" * 16, "filter": "strict", "acc": 1.0},
                    {"task": "b", "doc_id": 7, "doc_hash": "f" * 16, "acc": 1.0, "acc_norm": 0.0}]
    assert hi.parse_items(hi.items_text(rows)) == rows
    with pytest.raises(ScaleclError, match="x.jsonl: line 3 is not an item"):
        hi.parse_items(hi.items_text(rows) + '{"task": 1}\n', "x.jsonl")


def _items(task: str, values: list[int], hash_of=lambda i: f"h{i}") -> list[dict]:
    return [{"task": task, "doc_id": i, "doc_hash": hash_of(i), "acc": float(v)} for i, v in enumerate(values)]


def test_paired_difference_by_hand():
    """A = 1 on items 0-5 of 10, B flips items 0 and 6-8: d = (-1, 0, 0, 0, 0, 0, +1, +1, +1, 0) x 100."""
    a = _items("t", [1, 1, 1, 1, 1, 1, 0, 0, 0, 0])
    b = _items("t", [0, 1, 1, 1, 1, 1, 1, 1, 1, 0])
    p = hi.paired_difference(a, b, ["t"], "acc")
    d = [-100, 0, 0, 0, 0, 0, 100, 100, 100, 0]
    mean = sum(d) / 10
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 9)
    assert (p.n, p.a, p.b, p.diff, p.disagree) == (10, 60.0, 80.0, 20.0, 0.4)
    assert p.se == pytest.approx(sd / math.sqrt(10))
    assert p.hi - p.diff == pytest.approx(2.2621571627409915 * sd / math.sqrt(10))  # t_0.975,9
    same = hi.paired_difference(a, a, ["t"], "acc")
    assert (same.diff, same.lo, same.hi, same.disagree) == (0.0, 0.0, 0.0, 0.0)
    assert hi.paired_difference(a, b[:4], ["t"], "acc").n == 4  # only the items both scored
    assert math.isnan(hi.paired_difference(a, b, ["other"], "acc").diff)
    with pytest.raises(ScaleclError, match=r"item t #0 is not the same document in the two runs"):
        hi.paired_difference(a, _items("t", [1] * 10, hash_of=lambda i: "x"), ["t"], "acc")


def test_average_and_seeds():
    a = _items("t", [1, 0] * 50) + _items("u", [1, 1, 0, 0] * 25)
    b = _items("t", [1, 1] * 50) + _items("u", [1, 1, 0, 0] * 25)
    pt, pu = (hi.paired_difference(a, b, [t], "acc") for t in ("t", "u"))
    avg = hi.average_difference([pt, pu])
    assert avg.diff == pytest.approx((pt.diff + pu.diff) / 2) and avg.se == pytest.approx(pt.se / 2)
    assert avg.hi - avg.diff == pytest.approx(1.959963984540054 * avg.se)
    seeds = hi.over_seeds([hi.Paired(100, 50, 52, 2.0, 0, 4, 1), hi.Paired(100, 50, 54, 4.0, 2, 6, 1),
                           hi.Paired(100, 50, 51, 1.0, -1, 3, 1)])
    s = math.sqrt(((2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2 + (1 - 7 / 3) ** 2) / 2)
    assert seeds.n == 3 and seeds.diff == pytest.approx(7 / 3) and seeds.unit == "seeds"
    assert seeds.hi - seeds.diff == pytest.approx(4.302652729911275 * s / math.sqrt(3))  # t_0.975,2
    assert math.isnan(hi.over_seeds([hi.Paired(100, 50, 52, 2.0, 0, 4, 1)]).lo)


def test_items_needed_is_the_documented_formula():
    """(1.96 / h)^2 * p_disagree: 15% disagreement and +-2 points need 1,441 items; +-1 point four times that."""
    assert hi.items_needed(2.0, 0.15) == 1441
    assert hi.items_needed(1.0, 0.15) == 5763
    assert hi.items_needed(2.0, 0.05) == 481
