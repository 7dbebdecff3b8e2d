"""A process's share of every global batch: the two forms (RankBatches from packed chunks, RowShards from whole
global batches) cut the same rows, so the biography stages and continual pre-training split work alike."""

from __future__ import annotations

import pytest
import torch

from scalecl.data.batches import RankBatches, RowShards


@pytest.mark.parametrize("world, micro, accum", [(1, 4, 3), (2, 2, 3), (3, 1, 2)])
def test_rank_batches_and_row_shards_give_each_process_the_same_rows(world, micro, accum):
    chunks = [torch.full((5,), i) for i in range(4 * world * micro * accum)]  # (T,) each, row i holds i
    batch = world * micro * accum  # one optimizer step's global batch

    def global_batches():
        for i in range(0, len(chunks), batch):
            ids = torch.stack(chunks[i : i + batch])  # (B, T)
            yield {"input_ids": ids, "labels": ids}

    for rank in range(world):
        by_chunks = RankBatches(iter(chunks), micro, world, rank)
        by_rows = RowShards(global_batches(), micro, world, rank)
        for _ in range(4 * accum):
            a, b = next(by_chunks), next(by_rows)
            torch.testing.assert_close(a["input_ids"], b["input_ids"], rtol=0, atol=0)
