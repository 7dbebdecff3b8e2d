"""The one training loop. It knows nothing about methods: it trains whatever has requires_grad set."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from torch import nn
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


def train(
    model: nn.Module,
    batches: Iterator[dict[str, torch.Tensor]],
    steps: int,
    oc: OptimConfig,
    on_step: Callable[[int, float], None] | None = None,
    progress: Progress | None = None,
    desc: str = "train",
    autocast_dtype: torch.dtype | None = None,
) -> list[float]:
    """Run `steps` optimizer steps on `batches` (dicts of model inputs incl. labels); returns the losses.

    on_step(step, loss) is called after every step (step 1..steps) and once with step 0 before training,
    which is where evaluations hook in.
    """
    device = next(model.parameters()).device
    opt, sched = make_optimizer(model, oc, steps)
    trainable = [p for p in model.parameters() if p.requires_grad]
    task = progress.add_task(desc, total=steps, loss="-") if progress is not None else None
    losses: list[float] = []
    if on_step is not None:
        on_step(0, float("nan"))
    model.train()
    for step in range(1, steps + 1):
        batch = {k: v.to(device) for k, v in next(batches).items()}
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss = model(**batch).loss
        loss.backward()
        if oc.clip:
            torch.nn.utils.clip_grad_norm_(trainable, oc.clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if task is not None:
            progress.update(task, advance=1, loss=f"{losses[-1]:.3f}")
        if on_step is not None:
            on_step(step, losses[-1])
            model.train()
    model.eval()
    return losses
