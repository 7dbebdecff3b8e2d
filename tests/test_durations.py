"""The durations report (tests/durations.py) and, where one is committed, its baseline (tests/durations.json,
written by `pytest --durations-write`): the baseline names only tests that exist, and when it was measured on
quiet cores its slowest test is under the limit (docs/testing.md). Without a baseline those checks are skipped."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tests.durations import BASELINE, LIMIT_S, load_baseline, plain_id

REPO = Path(__file__).resolve().parents[1]

needs_baseline = pytest.mark.skipif(
    not BASELINE.is_file(),
    reason="no committed durations baseline (tests/durations.json): measure the suite on quiet cores with "
           "`python3 -m pytest -q --durations-write tests/durations.json` (docs/testing.md)")


def _functions(path: Path) -> set[str]:
    return {f.name for f in ast.walk(ast.parse(path.read_text()))
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}


@needs_baseline
def test_the_baseline_names_existing_tests():
    base = load_baseline()
    assert base["tests"], "tests/durations.json lists no tests"
    assert set(base) >= {"measured", "wall_s", "test_s", "tests"} and base["measured"]["note"], base["measured"]
    assert list(base["tests"]) == sorted(base["tests"])
    functions: dict[str, set[str]] = {}
    for nodeid, seconds in base["tests"].items():
        path, _, name = nodeid.partition("::")
        if path not in functions:
            assert (REPO / path).is_file(), f"{nodeid}: no such file (refresh tests/durations.json)"
            functions[path] = _functions(REPO / path)
        function = name.split("[")[0].rsplit("::", 1)[-1]  # test_x[param], Class::test_x
        assert function in functions[path], f"{nodeid}: no such test (refresh tests/durations.json)"
        assert 0 < seconds < base["wall_s"] * base["measured"]["workers"], nodeid


@needs_baseline
def test_the_slowest_test_is_under_the_limit_on_quiet_cores():
    base = load_baseline()
    slowest, seconds = max(base["tests"].items(), key=lambda kv: kv[1])
    if base["measured"].get("quiet"):  # only then is a second of it a second of the test
        assert seconds < LIMIT_S, f"{slowest} took {seconds} s on quiet cores: the limit is {LIMIT_S:.0f} s"
    assert seconds < 3 * LIMIT_S, f"{slowest} took {seconds} s even with the cores shared"


def test_a_missing_baseline_reads_as_empty(tmp_path):
    assert load_baseline(tmp_path / "durations.json") == {"tests": {}}
    (tmp_path / "durations.json").write_text(json.dumps({"tests": {"tests/a.py::test_b": 1.5}}))
    assert load_baseline(tmp_path / "durations.json")["tests"] == {"tests/a.py::test_b": 1.5}


def test_group_suffixes_are_not_part_of_a_test_id():
    assert plain_id("tests/a.py::test_b[x]@heavy") == "tests/a.py::test_b[x]"
    assert plain_id("tests/a.py::test_b@torchrun") == "tests/a.py::test_b"
    assert plain_id("tests/a.py::test_b[a@b]") == "tests/a.py::test_b[a@b]"
    assert plain_id("tests/a.py::test_b") == "tests/a.py::test_b"
