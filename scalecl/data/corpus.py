"""Text corpora for continual pre-training: stream with `datasets`, tokenise on the fly, pack into chunks.

One code path for every source: `datasets.load_dataset(..., streaming=True)` on a hub id
(``HuggingFaceFW/fineweb-2`` / ``kor_Hang``, ``HuggingFaceFW/fineweb-edu`` / ``sample-10BT``), on a local
folder (split files such as ``train.jsonl`` / ``test.jsonl``, or a folder with a dataset README) or on a
local file (.jsonl/.json, .txt (one document per line), .parquet, .csv, .arrow), or on real text shipped
inside an installed PyPI wheel (``pkg:konlpy-ko``, ``pkg:gensim-lee-en``, ``pkg:gensim-wiki-en``: rows built
from the package's files by scalecl.data.packaged, which states their documents and train/test split).

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
from scalecl.data.packaged import is_packaged, load_packaged

LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".txt": "text", ".text": "text", ".parquet": "parquet",
                  ".csv": "csv", ".arrow": "arrow"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class CorpusSpec:
    """Where the documents come from (mirrors config.CorpusConfig; `path` resolved for builtin corpora)."""

    path: str
    name: str = ""
    split: str = "train"
    text_column: str = "text"
    skip: int = 0
    take: int = 0  # 0 = all

    def describe(self) -> str:
        where = "/".join(x for x in (self.name, self.split) if x)
        sl = f", docs [{self.skip}, {self.skip + self.take})" if self.take else (
            f", docs from {self.skip}" if self.skip else "")
        return f"{self.path} [{where}]{sl}"


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
            if not p.exists():
                raise ScaleclError(f"dataset path {spec.path} does not exist")
            if p.is_file():
                builder = LOCAL_BUILDERS.get(p.suffix.lower())
                if builder is None:
                    raise ScaleclError(f"dataset file {spec.path}: unknown format {p.suffix!r}; use one of "
                                       f"{', '.join(sorted(LOCAL_BUILDERS))}")
                if p.stat().st_size == 0:
                    raise ScaleclError(f"dataset {spec.path} is empty: no documents to read")
                if spec.split != "train":  # a single file is one split, which `datasets` calls train
                    raise ScaleclError(f"dataset file {spec.path} has only the split 'train' (got {spec.split!r})")
                return datasets.load_dataset(builder, data_files=str(p), split="train", streaming=True)
            return datasets.load_dataset(str(p), name=name, split=spec.split, streaming=True)
        from scalecl.common.hub import before_hub_load

        before_hub_load(path)  # no network: one line at once instead of a minute of retries
        return datasets.load_dataset(path, name=name, split=spec.split, streaming=True)
    except ScaleclError:
        raise
    except datasets.data_files.EmptyDatasetError:
        raise ScaleclError(f"dataset {spec.describe()} is empty: no data files") from None
    except StopIteration:  # `datasets` peeks at the first rows of json files to infer the schema
        raise ScaleclError(f"dataset {spec.describe()} is empty: no documents to read") from None
    except (ValueError, KeyError) as e:  # bad split or config name
        raise ScaleclError(f"dataset {spec.describe()}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    except (OSError, ConnectionError, datasets.exceptions.DatasetNotFoundError) as e:
        from scalecl.common.hub import miss_reason

        first = miss_reason(spec.path) or (str(e).splitlines()[0] if str(e) else type(e).__name__)
        raise ScaleclError(f"cannot open dataset {spec.path}: {first}") from None


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
    for row in itertools.islice(itertools.chain([first], rows), spec.skip, stop):
        text = row[col]
        yield text if isinstance(text, str) else ("" if text is None else str(text))


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


class RankBatches:
    """Training micro-batches of one data-parallel process, cut from one packed stream all processes read.

    Every micro-step takes world * micro_batch consecutive chunks and keeps rows
    [rank * micro_batch, (rank + 1) * micro_batch): the union over processes and accumulation steps of one
    optimizer step is the same set of chunks whatever the number of processes, so a 2-process run equals
    a 1-process run with the same global batch. Each process tokenises the whole stream (the price of that
    equivalence); the data position is identical on every process.
    """

    def __init__(self, chunks: PackedChunks, micro_batch: int, world: int = 1, rank: int = 0) -> None:
        self.chunks, self.micro_batch, self.world, self.rank = chunks, micro_batch, world, rank

    def __iter__(self) -> RankBatches:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        rows = [next(self.chunks) for _ in range(self.micro_batch * self.world)]
        ids = torch.stack(rows[self.rank * self.micro_batch : (self.rank + 1) * self.micro_batch])  # (m, T)
        return {"input_ids": ids, "labels": ids}

    def state_dict(self) -> dict[str, Any]:
        return self.chunks.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.chunks.load_state_dict(state)


def eval_chunks(spec: CorpusSpec, tokenizer, seq_len: int, name: str = "evaluation set") -> list[torch.Tensor]:
    """Every token of a held-out slice as seq_len chunks (the last one possibly shorter); checked non-empty."""
    texts = [0]  # documents with text: blank or null ones alone would be scored as end-of-text tokens

    def counted() -> Iterator[str]:
        for text in iter_texts(spec):
            texts[0] += bool(text.strip())
            yield text

    chunks = list(PackedChunks(counted, tokenizer, seq_len, drop_last=False, name=name))
    if not chunks or sum(len(c) - 1 for c in chunks) == 0 or not texts[0]:
        why = " (every document is blank or null)" if chunks and not texts[0] else ""
        raise ScaleclError(f"{name} {spec.describe()} is empty: no tokens to score{why}")
    return chunks
