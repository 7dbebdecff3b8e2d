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


_LAUNCH_VARS = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # what torchrun sets beside WORLD_SIZE


def world_size() -> int:
    """The processes of this job: WORLD_SIZE as torchrun / accelerate launch set it (1 when unset). A value that is
    not a positive integer, or several processes without the rest of a launcher's variables (a WORLD_SIZE set by
    hand), is one ScaleclError instead of a traceback or a wait for processes that never come."""
    from scalecl.common.errors import ScaleclError

    text = os.environ.get("WORLD_SIZE", "").strip() or "1"
    try:
        world = int(text)
    except ValueError:
        world = 0
    if world < 1:
        raise ScaleclError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number of processes: unset it, or start "
                           f"the command with torchrun --nproc_per_node N")
    values = {v: os.environ.get(v, "").strip() for v in _LAUNCH_VARS}
    missing = [v for v, x in values.items() if not x or (v.endswith("RANK") and not x.isdigit())]
    if world > 1 and not dist.is_initialized() and missing:
        raise ScaleclError(f"WORLD_SIZE={world} but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                           f"set (or not numbers): several processes start with torchrun --nproc_per_node {world} "
                           f"(or accelerate launch); unset WORLD_SIZE to run one")
    return world


@contextlib.contextmanager
def distributed() -> Iterator[Dist]:
    """Join the process group torchrun / accelerate launch set up (WORLD_SIZE > 1) for the duration of a
    command, and leave it afterwards; one process without either."""
    world = world_size()
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
