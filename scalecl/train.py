"""The one training loop. It knows nothing about methods: it trains whatever has requires_grad set.

Beyond a plain loop it does gradient accumulation, data parallelism (a DistributedDataParallel-wrapped
model: gradients are synchronised on the last micro-batch of a step only, the logged loss is the mean over
processes), exact resumption (`on_save` receives the full training state: optimizer, schedule, RNG and the
data position; `resume=` continues from it with the same numbers as an uninterrupted run), a per-step log
(loss, learning rate, gradient norm, tokens, seconds) and a guard against divergence: a non-finite loss or
gradient norm raises TrainingDiverged before any evaluation or checkpoint can record the broken model.

The host reads the device only at sync points (every `sync_every` steps, evaluation and checkpoint steps,
the last step): on a GPU the loss and gradient norm of the steps in between stay on the device, so the
loop never waits for the GPU to finish a step before queueing the next one.

The model may also be FSDP2-sharded (scalecl.parallel): gradients are then reduce-scattered after every
micro-batch, the gradient norm is the global one, and the optimizer state handed to `on_save` is the full
state gathered to rank 0. With `flops` (scalecl.perf.ModelFlops) every logged step also carries the model
TFLOP/s it achieved and, when the device's peak is known, its model FLOPs utilisation (MFU).
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Collection, Iterator
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

from .errors import TrainingDiverged
from .parallel import is_fsdp, load_optimizer_state, local, optimizer_state
from .perf import ModelFlops


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
    """AdamW over the trainable parameters only (no state for frozen ones); decay on matrices only.

    On CUDA the fused AdamW kernel is used (one launch for all parameters); elsewhere the default.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": oc.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)
    opt = torch.optim.AdamW(groups, lr=oc.lr, betas=(oc.beta1, oc.beta2), eps=oc.eps, fused=fused or None)
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


def _process_mean(x: torch.Tensor, parallel: bool) -> torch.Tensor:
    """Mean of a scalar over data-parallel processes (the loss every process logs is the same number)."""
    if parallel:
        x = x.detach().clone()
        dist.all_reduce(x)
        x /= dist.get_world_size()
    return x


def _tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens the model reads in a batch: the attention mask's ones, or every input id."""
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else batch["input_ids"].numel()


def _sig(x: float, digits: int = 4) -> float:
    """x to `digits` significant digits (a CPU's model TFLOP/s is tiny, a GPU's is not)."""
    return float(f"{x:.{digits}g}")


def _to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Host batch -> device; on CUDA through pinned memory, so the copy overlaps the running step."""
    if device.type == "cuda":
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    return {k: v.to(device) for k, v in batch.items()}


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
    eval_steps: Collection[int] | None = None,
    accum: int = 1,
    save_every: int = 0,
    on_save: Callable[[int, dict[str, Any]], None] | None = None,
    on_log: Callable[[list[dict[str, Any]]], None] | None = None,
    sync_every: int = 1,
    resume: dict[str, Any] | None = None,
    stop_at: int | None = None,
    flops: ModelFlops | None = None,
    peak_tflops: float | None = None,
) -> list[float]:
    """Run `steps` optimizer steps on `batches` (dicts of model inputs incl. labels); returns the losses.

    on_step(step, loss) is called at step 0 before training (not again on resume: the first run evaluated
    it) and after every step in `eval_steps` (every step when eval_steps is None): evaluations hook in here.
    accum: micro-batches per optimizer step; each is weighted 1/accum, so with equal-sized micro-batches
    the update equals one step on their union. With a DDP-wrapped model, gradients are all-reduced on the
    last micro-batch only (no_sync before), and the logged loss is averaged over processes.
    on_save(step, state) is called every `save_every` steps and at `stop_at`, after on_step; `state`
    (optimizer, scheduler, RNG, data position, losses so far) passed back as `resume=` continues exactly.
    The data position is `batches.state_dict()` when the iterator has one (load_state_dict restores it);
    otherwise the consumed micro-batches are skipped by drawing them again.
    on_log(rows) receives one row per step (step, loss, lr, grad_norm, tokens, seconds, tokens_per_s, and with
    `flops` model_tflops and mfu) at every sync point; `seconds` is the wall time of the sync window divided
    evenly over its steps (all processes' tokens count). mfu = model_tflops / (peak_tflops x processes), null
    without a peak.
    A non-finite loss or gradient norm raises TrainingDiverged at the next sync point, before on_step or
    on_save can see the model it produced.
    stop_at: stop after this step (a checkpoint is offered to on_save first); the losses so far are returned.
    """
    if accum < 1:
        raise ValueError(f"accum must be >= 1, got {accum}")
    device = next(model.parameters()).device
    ddp = isinstance(model, DistributedDataParallel)
    parallel = ddp or is_fsdp(model)  # a plain model trains alone even in a process group
    world = dist.get_world_size() if parallel else 1
    opt, sched = make_optimizer(model, oc, steps)
    trainable = [p for p in model.parameters() if p.requires_grad]
    start, losses = 0, []
    if resume is not None:
        load_optimizer_state(model, opt, resume["optimizer"])
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
    pending: list[tuple[int, torch.Tensor, torch.Tensor, float, int, float]] = []  # step, loss, gnorm, lr, tokens, flops
    window = [time.perf_counter()]

    def sync() -> None:
        """Read the pending steps' numbers from the device once, check them, log them."""
        if not pending:
            return
        vals = torch.stack([torch.stack([lo.float(), gn.float()]) for _, lo, gn, _, _, _ in pending]).tolist()
        now = time.perf_counter()
        per_step = (now - window[0]) / len(pending)
        window[0] = now
        rows = []
        for (step, _, _, lr, tokens, fl), (loss, gnorm) in zip(pending, vals, strict=True):
            if not (math.isfinite(loss) and math.isfinite(gnorm)):
                pending.clear()
                raise TrainingDiverged(
                    f"training diverged at step {step}: loss {loss}, gradient norm {gnorm} (lr {lr:g}); "
                    f"nothing was recorded as finished")
            losses.append(loss)
            row = {"step": step, "loss": round(loss, 6), "lr": lr, "grad_norm": round(gnorm, 6),
                   "tokens": tokens * world, "seconds": round(per_step, 6),
                   "tokens_per_s": round(tokens * world / per_step, 1) if per_step > 0 else None}
            if flops is not None:
                tflops = fl * world / per_step / 1e12 if per_step > 0 else None
                row["model_tflops"] = None if tflops is None else _sig(tflops)
                row["mfu"] = _sig(tflops / (peak_tflops * world)) if tflops is not None and peak_tflops else None
            rows.append(row)
        pending.clear()
        if task is not None:
            progress.update(task, completed=rows[-1]["step"], loss=f"{losses[-1]:.3f}")
        if on_log is not None:
            on_log(rows)

    model.train()
    for step in range(start + 1, steps + 1):
        lr = sched.get_last_lr()[0]  # the rate this step uses
        tokens, step_flops = 0, 0.0
        if accum == 1:
            host = next(batches)
            tokens = _tokens(host)
            step_flops = tokens * flops.per_token(host["input_ids"].shape[-1]) if flops is not None else 0.0
            batch = _to_device(host, device)
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = model(**batch).loss
            loss.backward()
            loss = loss.detach()
        else:
            loss = torch.zeros((), device=device)
            for i in range(accum):
                host = next(batches)
                tokens += _tokens(host)
                if flops is not None:
                    step_flops += _tokens(host) * flops.per_token(host["input_ids"].shape[-1])
                batch = _to_device(host, device)
                sync_grads = i == accum - 1 or not ddp  # FSDP reduce-scatters every micro-batch (memory)
                with contextlib.nullcontext() if sync_grads else model.no_sync():
                    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                        micro = model(**batch).loss
                    (micro / accum).backward()
                loss += micro.detach().float() / accum
        if oc.clip:
            gnorm = torch.nn.utils.clip_grad_norm_(trainable, oc.clip)
        else:
            gnorm = torch.nn.utils.get_total_norm([p.grad for p in trainable if p.grad is not None])
        gnorm = local(gnorm)  # FSDP: a replicated DTensor of the global norm
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        pending.append((step, _process_mean(loss, parallel), gnorm.detach(), lr, tokens, step_flops))
        evaluating = on_step is not None and (eval_steps is None or step in eval_steps)
        stopping = stop_at is not None and step >= stop_at
        saving = on_save is not None and ((save_every and step % save_every == 0) or stopping)
        if evaluating or saving or stopping or step == steps or len(pending) >= sync_every:
            sync()
        if evaluating:
            on_step(step, losses[-1])
            model.train()
            window[0] = time.perf_counter()  # evaluation time is not training time
        if saving:
            on_save(step, {
                "step": step, "losses": list(losses), "optimizer": optimizer_state(model, opt),
                "scheduler": sched.state_dict(),
                "rng": rng_state(), "data": batches.state_dict() if hasattr(batches, "state_dict") else None,
            })
            window[0] = time.perf_counter()
        if stopping:
            break
    model.eval()
    return losses
