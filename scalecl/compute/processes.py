"""This process's place in a torchrun / accelerate launch job, and printing on the main process only."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from scalecl.common.consoles import make_console

console = make_console()  # off a terminal: lines are not wrapped at 80 columns


@dataclass(frozen=True)
class Dist:
    """This process's place in a torchrun / accelerate launch job (rank 0 of 1 when run alone)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def share(self, obj):
        """Rank 0's `obj` on every process (a picklable value; itself when alone)."""
        if self.world <= 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


@contextlib.contextmanager
def distributed() -> Iterator[Dist]:
    """Join the process group torchrun / accelerate launch set up (WORLD_SIZE > 1) for the duration of a
    command, and leave it afterwards; one process without either."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        yield Dist()
        return
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=timedelta(hours=3))  # rank 0 may pre-train a cached base
    try:
        yield Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def say(text: str) -> None:
    """Print on the main process only (under torchrun every process runs the same code)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_rank() != 0):
        console.print(text, highlight=False)
