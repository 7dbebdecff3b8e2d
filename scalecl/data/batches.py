"""Training batches, and each process's share of them.

`packed_batches` is the biography's pre-training stream (biographies + EOS, reshuffled every epoch, cut into
chunks). A data-parallel process then takes its micro-batches from the global batches every process reads, in
one of two forms that cut the same rows: `RankBatches` from a stream of packed chunks (continual pre-training,
resumable by its chunk position) and `RowShards` from a stream of whole global batches (the biography stages).
Either way, with `world` processes and `micro` rows per forward, process r at accumulation step k of an optimizer
step takes rows [(k world + r) micro, (k world + r + 1) micro) of that step's global batch, so N processes train
on what one process trains on with the same micro-batches (the same gradient up to float summation order).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from scalecl.common.errors import ScaleclError
from scalecl.data.corpus import PackedChunks


def packed_batches(docs: Sequence[Sequence[int]], eos: int, context: int, batch: int, seed: int) -> Iterator[dict]:
    """Biographies + EOS, reshuffled every epoch, concatenated and cut into `context`-token chunks.

    The token right after an EOS begins another person's biography, which nothing before it predicts: its
    label is -100, as in the reference code (its labels mask every position that follows an EOS/pad).
    """
    rng = np.random.default_rng(seed)
    arrays = [np.append(np.asarray(d, dtype=np.int64), eos) for d in docs]  # lists or arrays (cached encodings)
    if sum(len(a) for a in arrays) // context < batch:  # no batch would ever be cut: refuse, never spin
        raise ScaleclError(f"a batch of {batch} x {context} tokens is larger than the whole corpus")
    while True:
        stream = np.concatenate([arrays[i] for i in rng.permutation(len(arrays))])
        n = len(stream) // context
        chunks = torch.from_numpy(stream[: n * context].reshape(n, context))
        for i in range(0, n - batch + 1, batch):
            ids = chunks[i : i + batch]
            labels = ids.clone()
            labels[:, 1:][ids[:, :-1] == eos] = -100  # (B, T): position t follows an EOS at t - 1
            yield {"input_ids": ids, "labels": labels}


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


class RowShards:
    """The micro-batches of one process, cut by rows from a stream of global batches.

    Every global batch of B rows is split into B / micro parts of `micro` rows; process r takes parts
    r, r + world, r + 2 world, ... one per accumulation step. One process with accumulation A therefore sees
    parts 0..A-1 in turn, and `world` processes with accumulation A / world see the same parts between them:
    the same gradient up to float summation order. Each process draws every global batch (the data position
    is the same on every process; train() skips micro-batches on resume by drawing them again).
    """

    def __init__(self, batches: Iterator[dict[str, torch.Tensor]], micro: int, world: int = 1, rank: int = 0) -> None:
        self.batches, self.micro, self.world, self.rank = batches, micro, world, rank
        self.queue: list[dict[str, torch.Tensor]] = []

    def __iter__(self) -> RowShards:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if not self.queue:
            b = next(self.batches)
            n = b["input_ids"].shape[0]
            if n == self.micro and self.world == 1:
                return b
            for j in range(self.rank, n // self.micro, self.world):
                self.queue.append({k: v[j * self.micro : (j + 1) * self.micro] for k, v in b.items()})
        return self.queue.pop(0)
