"""The one training loop. It knows nothing about methods: it trains whatever has requires_grad set.

Beyond a plain loop it does gradient accumulation, data parallelism (a DistributedDataParallel-wrapped
model: gradients are synchronised on the last micro-batch of a step only, the logged loss is the mean over
processes) and exact resumption: `on_save` receives the full training state (optimizer, schedule, RNG and
the data position) and `resume=` continues from it with the same numbers as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from transformers.optimization import (
    get_constant_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)


@dataclass
class OptimConfig:
    """AdamW + schedule for one stage; a new optimizer and schedule start at every stage."""

    lr: float
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 0
    schedule: str = "constant"  # constant | cosine (to min_lr_ratio * lr) | linear (to 0)
    min_lr_ratio: float = 0.1
    clip: float | None = 1.0


def make_optimizer(model: nn.Module, oc: OptimConfig, steps: int):
    """AdamW over the trainable parameters only (no state for frozen ones); decay on matrices only."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": oc.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=oc.lr, betas=(oc.beta1, oc.beta2), eps=oc.eps)
    if oc.schedule == "cosine":
        sched = get_cosine_with_min_lr_schedule_with_warmup(opt, oc.warmup_steps, steps, min_lr_rate=oc.min_lr_ratio)
    elif oc.schedule == "linear":
        sched = get_linear_schedule_with_warmup(opt, oc.warmup_steps, steps)
    elif oc.schedule == "constant":
        sched = get_constant_schedule_with_warmup(opt, oc.warmup_steps)
    else:
        raise ValueError(f"unknown schedule {oc.schedule!r}")
    return opt, sched


def progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
    )


def rng_state() -> dict[str, Any]:
    """Every random generator a step can touch (torch, CUDA, numpy, Python)."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _process_mean(x: torch.Tensor, parallel: bool) -> float:
    """Mean of a scalar over data-parallel processes (the loss every process logs is the same number)."""
    if parallel:
        x = x.detach().clone()
        dist.all_reduce(x)
        x /= dist.get_world_size()
    return x.item()


def train(
    model: nn.Module,
    batches: Iterator[dict[str, torch.Tensor]],
    steps: int,
    oc: OptimConfig,
    on_step: Callable[[int, float], None] | None = None,
    progress: Progress | None = None,
    desc: str = "train",
    autocast_dtype: torch.dtype | None = None,
    *,
    accum: int = 1,
    save_every: int = 0,
    on_save: Callable[[int, dict[str, Any]], None] | None = None,
    resume: dict[str, Any] | None = None,
    stop_at: int | None = None,
) -> list[float]:
    """Run `steps` optimizer steps on `batches` (dicts of model inputs incl. labels); returns the losses.

    on_step(step, loss) is called after every step (step 1..steps) and once with step 0 before training,
    which is where evaluations hook in (not again on resume: step 0 was evaluated by the first run).
    accum: micro-batches per optimizer step; each is weighted 1/accum, so with equal-sized micro-batches
    the update equals one step on their union. With a DDP-wrapped model, gradients are all-reduced on the
    last micro-batch only (no_sync before), and the logged loss is averaged over processes.
    on_save(step, state) is called every `save_every` steps and at `stop_at`, after on_step; `state`
    (optimizer, scheduler, RNG, data position, losses so far) passed back as `resume=` continues exactly.
    The data position is `batches.state_dict()` when the iterator has one (load_state_dict restores it);
    otherwise the consumed micro-batches are skipped by drawing them again.
    stop_at: stop after this step (a checkpoint is offered to on_save first); the losses so far are returned.
    """
    if accum < 1:
        raise ValueError(f"accum must be >= 1, got {accum}")
    device = next(model.parameters()).device
    parallel = isinstance(model, DistributedDataParallel)  # a plain model trains alone even in a process group
    opt, sched = make_optimizer(model, oc, steps)
    trainable = [p for p in model.parameters() if p.requires_grad]
    start, losses = 0, []
    if resume is not None:
        opt.load_state_dict(resume["optimizer"])
        sched.load_state_dict(resume["scheduler"])
        start, losses = int(resume["step"]), list(resume["losses"])
        if resume.get("data") is not None and hasattr(batches, "load_state_dict"):
            batches.load_state_dict(resume["data"])
        else:
            for _ in range(start * accum):
                next(batches)
        set_rng_state(resume["rng"])
    task = progress.add_task(desc, total=steps, completed=start, loss="-") if progress is not None else None
    if on_step is not None and resume is None:
        on_step(0, float("nan"))
    model.train()
    for step in range(start + 1, steps + 1):
        if accum == 1:
            batch = {k: v.to(device) for k, v in next(batches).items()}
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = model(**batch).loss
            loss.backward()
        else:
            total = torch.zeros((), device=device)
            for i in range(accum):
                batch = {k: v.to(device) for k, v in next(batches).items()}
                sync = i == accum - 1 or not parallel
                with contextlib.nullcontext() if sync else model.no_sync():
                    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                        micro = model(**batch).loss
                    (micro / accum).backward()
                total += micro.detach().float()
            loss = total / accum
        if oc.clip:
            torch.nn.utils.clip_grad_norm_(trainable, oc.clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(_process_mean(loss, parallel))
        if task is not None:
            progress.update(task, advance=1, loss=f"{losses[-1]:.3f}")
        if on_step is not None:
            on_step(step, losses[-1])
            model.train()
        stopping = stop_at is not None and step >= stop_at
        if on_save is not None and ((save_every and step % save_every == 0) or stopping):
            on_save(step, {
                "step": step, "losses": list(losses), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "rng": rng_state(), "data": batches.state_dict() if hasattr(batches, "state_dict") else None,
            })
        if stopping:
            break
    model.eval()
    return losses
