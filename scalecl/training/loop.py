"""The one training loop. It knows nothing about methods: it trains whatever has requires_grad set.

Beyond a plain loop it does gradient accumulation, data parallelism (a DistributedDataParallel-wrapped
model: gradients are synchronised on the last micro-batch of a step only, the logged loss is the mean over
processes), exact resumption (`on_save` receives the full training state: optimizer, schedule, RNG and the
data position; `state=` continues from it with the same numbers as an uninterrupted run), a per-step log
(loss, learning rate, gradient norm, tokens, seconds) and a guard against divergence: a non-finite loss or
gradient norm raises TrainingDiverged before any evaluation or checkpoint can record the broken model.

The host reads the device only at sync points (every `sync_every` steps, evaluation and checkpoint steps,
the last step): on a GPU the loss and gradient norm of the steps in between stay on the device, so the
loop never waits for the GPU to finish a step before queueing the next one.

The model may also be FSDP2-sharded (scalecl.compute.parallel): gradients are then reduce-scattered after every
micro-batch, the gradient norm is the global one, and the optimizer state handed to `on_save` is the full
state gathered to rank 0. With `flops` (scalecl.compute.perf.ModelFlops) every logged step also carries the model
TFLOP/s it achieved and, when the device's peak is known, its model FLOPs utilisation (MFU).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from rich.progress import Progress
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from transformers.optimization import (
    get_constant_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from scalecl.common.errors import TrainingDiverged
from scalecl.compute.loss import ModelLoss
from scalecl.compute.parallel import is_fsdp, load_optimizer_state, local, optimizer_state
from scalecl.compute.perf import ModelFlops, compiled, graph_replayed, is_compile_error, uncompile
from scalecl.compute.processes import say
from scalecl.training.optim import OptimConfig
from scalecl.training.progress import LineProgress


@dataclass
class TrainPlan:
    """How one run trains: everything besides the model, its data and its evaluation.

    steps: optimizer steps; optim: AdamW and its schedule; accum: micro-batches per optimizer step;
    autocast: a dtype to autocast forwards to (None: full precision); eval_steps: steps after which the
    run is evaluated (step 0 always; None: every step); save_every: steps between checkpoints (0: none);
    save_seconds: also a checkpoint once this much wall time (training and evaluation) has passed since the
    last one or the start, or ten times the last checkpoint's own time when that is longer, decided at the
    host's sync points, the same on every process (0: none); stop_at: stop after this step with a checkpoint; sync_every: steps between host reads of the loss
    (None: compute.sync_every resolved for the device, else 1). The rest is the run layer's (scalecl.training.fit):
    resume ("auto": when a checkpoint exists) and force, compute (a ComputeConfig: activation
    checkpointing, compile, DDP or FSDP2), trackers and their config, and the progress bar's label. `loss`
    computes a micro-batch's loss (scalecl.compute.loss.step_loss: the model's own or the chunked one).
    """

    steps: int
    optim: OptimConfig
    accum: int = 1
    autocast: torch.dtype | None = None
    eval_steps: Collection[int] | None = ()
    save_every: int = 0
    save_seconds: float = 0.0
    stop_at: int | None = None
    sync_every: int | None = None
    resume: bool | str = False
    force: bool = False
    compute: Any = None
    report_to: tuple[str, ...] = ()
    tracker_config: dict[str, Any] = field(default_factory=dict)
    desc: str = "train"
    loss: Any = None  # the step's loss (scalecl.compute.loss: ModelLoss, HeadLoss); None: the model's own


@dataclass
class Hooks:
    """What the loop calls: on_step(step, loss) after evaluation steps (and at step 0 of a fresh run),
    on_save(step, state) at checkpoint steps, on_log(rows) with the per-step rows at every sync point."""

    on_step: Callable[[int, float], None] | None = None
    on_save: Callable[[int, dict[str, Any]], None] | None = None
    on_log: Callable[[list[dict[str, Any]]], None] | None = None


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
    """Batch -> device: a host tensor to CUDA through pinned memory, so the copy overlaps the running step; a
    tensor already on a device (a caller's batch made there) as `.to` moves it (only host memory can be pinned)."""
    if device.type == "cuda":
        return {k: v.pin_memory().to(device, non_blocking=True) if v.device.type == "cpu" else v.to(device)
                for k, v in batch.items()}
    return {k: v.to(device) for k, v in batch.items()}



class _StepLog:
    """The steps trained since the last sync point, read from the device at once, checked and logged."""

    def __init__(self, world: int, flops: ModelFlops | None, peak_tflops: float | None, on_log) -> None:
        self.world, self.flops, self.peak, self.on_log = world, flops, peak_tflops, on_log
        self.pending: list[tuple[int, torch.Tensor, torch.Tensor, float, int, float]] = []
        self.losses: list[float] = []
        self.window = time.perf_counter()

    def add(self, step: int, loss: torch.Tensor, gnorm: torch.Tensor, lr: float, tokens: int, fl: float) -> None:
        self.pending.append((step, loss, gnorm, lr, tokens, fl))

    def restart_clock(self) -> None:
        """Time spent outside training (evaluation, checkpoints) is not a step's time."""
        self.window = time.perf_counter()

    def sync(self) -> list[dict[str, Any]]:
        """Read the pending steps' numbers from the device once, check them, log them; returns the rows."""
        if not self.pending:
            return []
        vals = torch.stack([torch.stack([lo.float(), gn.float()]) for _, lo, gn, _, _, _ in self.pending]).tolist()
        now = time.perf_counter()
        per_step = (now - self.window) / len(self.pending)
        self.window = now
        rows = [self._row(p, loss, gnorm, per_step) for p, (loss, gnorm) in zip(self.pending, vals, strict=True)]
        self.pending.clear()
        if self.on_log is not None:
            self.on_log(rows)
        return rows

    def _row(self, pending: tuple, loss: float, gnorm: float, per_step: float) -> dict[str, Any]:
        step, _, _, lr, tokens, fl = pending
        if not (math.isfinite(loss) and math.isfinite(gnorm)):
            self.pending.clear()
            raise TrainingDiverged(f"training diverged at step {step}: loss {loss}, gradient norm {gnorm} (lr "
                                   f"{lr:g}); nothing was recorded as finished")
        self.losses.append(loss)
        world = self.world
        row = {"step": step, "loss": round(loss, 6), "lr": lr, "grad_norm": round(gnorm, 6),
               "tokens": tokens * world, "seconds": round(per_step, 6),
               "tokens_per_s": round(tokens * world / per_step, 1) if per_step > 0 else None}
        if self.flops is not None:
            tflops = fl * world / per_step / 1e12 if per_step > 0 else None
            row["model_tflops"] = None if tflops is None else _sig(tflops)
            row["mfu"] = _sig(tflops / (self.peak * world)) if tflops is not None and self.peak else None
        return row


def _forward_backward(model: nn.Module, batches, accum: int, autocast_dtype, flops: ModelFlops | None, loss_fn):
    """One optimizer step's forwards and backwards: (mean loss, tokens, model FLOPs, last micro-batch). With
    DDP gradients are all-reduced on the last micro-batch only; FSDP reduce-scatters after every one."""
    device = next(model.parameters()).device
    ddp = isinstance(model, DistributedDataParallel)
    replayed = graph_replayed(model)  # CUDA graphs: each forward marked, its loss copied before the next replay
    tokens, step_flops = 0, 0.0
    loss = torch.zeros((), device=device) if accum > 1 else None
    for i in range(accum):
        host = loss_fn.host(next(batches))
        n = _tokens(host)
        tokens += n
        if flops is not None:
            step_flops += n * flops.per_token(host["input_ids"].shape[-1])
        batch = _to_device(host, device)
        sync_grads = i == accum - 1 or not ddp
        with contextlib.nullcontext() if sync_grads else model.no_sync():
            if replayed:
                torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                micro = loss_fn(model, batch)
            if accum == 1:
                micro.backward()
                return micro.detach().clone() if replayed else micro.detach(), tokens, step_flops, host
            (micro / accum).backward()
        loss += micro.detach().float() / accum
    return loss, tokens, step_flops, host


def _step(model: nn.Module, batches, plan: TrainPlan, flops: ModelFlops | None, loss_fn, first: bool):
    """_forward_backward; on the first step of this process, where a compiled model fails to compile (at its
    first forward or backward), one line, then the same step again eagerly: the same micro-batches and random
    state, no gradient kept from the failed attempt."""
    if not first or not compiled(model):
        return _forward_backward(model, batches, plan.accum, plan.autocast, flops, loss_fn)
    drawn: list[dict[str, torch.Tensor]] = []

    def draw() -> Iterator[dict[str, torch.Tensor]]:
        while True:
            drawn.append(next(batches))
            yield drawn[-1]

    rng = rng_state()
    try:
        return _forward_backward(model, draw(), plan.accum, plan.autocast, flops, loss_fn)
    except Exception as e:  # noqa: BLE001 - only compile errors are handled; the rest is raised again
        if not is_compile_error(e):
            raise
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        why = f"{type(e).__name__}: {' '.join(lines[:2])[:200]}"  # e.g. "backend='inductor' raised: <the error>"
        say(f"compute.compile: the model did not compile ({why}); it trains eagerly")
        uncompile(model, why)
        for p in model.parameters():
            p.grad = None
        set_rng_state(rng)
        return _forward_backward(model, itertools.chain(drawn, batches), plan.accum, plan.autocast, flops, loss_fn)


MAX_WEIGHT = 1.8e19  # ~ sqrt(float32's largest value): a weight beyond it cannot be squared in a norm


def _check_update(model: nn.Module, host: dict[str, torch.Tensor], autocast_dtype, step: int, parallel: bool,
                  loss_fn) -> None:
    """The loss of the step's last micro-batch after the update. A model it is not finite for (weights blown
    up by the update itself, which the loss before the update cannot show) stops the run before a
    checkpoint or the final model records it. Evaluation mode and no gradient: no random draw, no change."""
    device = next(model.parameters()).device
    training = model.training
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        loss = loss_fn(model, _to_device(host, device))
    model.train(training)
    value = _process_mean(loss.float(), parallel).item()
    with torch.no_grad():  # largest trainable weight (this process's shards; the largest over processes)
        shards = [local(p.detach()) for p in model.parameters() if p.requires_grad]
        big = max((t.abs().max().float() for t in shards if t.numel()), default=torch.zeros((), device=device))
        if parallel:
            big = big.clone()
            dist.all_reduce(big, op=dist.ReduceOp.MAX)
    if not math.isfinite(value) or not big.item() < MAX_WEIGHT:
        what = f"the loss after the update is {value}" if not math.isfinite(value) else (
            f"a weight reached {big.item():.3g}, beyond {MAX_WEIGHT:.2g} (its square overflows float32: the "
            f"model's norms no longer compute)")
        raise TrainingDiverged(f"training diverged at step {step}: {what}; nothing was recorded as finished")


class _Cadence:
    """The wall-clock part of the checkpoint cadence (TrainPlan.save_seconds): due once `seconds` have passed since
    the last checkpoint (or the start), or ten times the last checkpoint's own time when that is longer, so that
    writing checkpoints takes at most about a tenth of the run."""

    COST = 10  # a checkpoint at most every COST x its own writing time
    clock = staticmethod(time.monotonic)

    def __init__(self, seconds: float) -> None:
        self.seconds, self.since, self.cost = seconds, self.clock(), 0.0

    def due(self, parallel: bool, model: nn.Module) -> bool:
        """Whether a timed checkpoint is due; under several processes, when it is due on any (they all save)."""
        if not self.seconds:
            return False
        due = self.clock() - self.since >= max(self.seconds, self.COST * self.cost)
        if parallel:
            flag = torch.tensor([float(due)], device=next(model.parameters()).device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            due = bool(flag.item())
        return due

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """Around a checkpoint's writing: its time, and the clock restarted after it."""
        t = self.clock()
        yield
        self.since = self.clock()
        self.cost = self.since - t


def _update(opt, sched, trainable: list[torch.Tensor], clip: float, step: int) -> torch.Tensor:
    """Clip (clip > 0), step the optimizer and the schedule, clear the gradients; the gradient norm."""
    if clip:
        gnorm = torch.nn.utils.clip_grad_norm_(trainable, clip)
    else:
        gnorm = torch.nn.utils.get_total_norm([p.grad for p in trainable if p.grad is not None])
    try:
        opt.step()
    except RuntimeError as e:  # e.g. lr 1e38: the update itself overflows float32
        if "overflow" not in str(e):
            raise
        raise TrainingDiverged(f"training diverged at step {step}: the update overflows ({e}; lr "
                               f"{sched.get_last_lr()[0]:g}); nothing was recorded as finished") from None
    sched.step()
    opt.zero_grad(set_to_none=True)
    return gnorm


def _resume(model: nn.Module, batches, plan: TrainPlan, opt, sched, state: dict[str, Any]) -> tuple[int, list]:
    """Optimizer, schedule, data position and RNG of a saved state; returns (step, losses so far)."""
    load_optimizer_state(model, opt, state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    start = int(state["step"])
    if state.get("data") is not None and hasattr(batches, "load_state_dict"):
        batches.load_state_dict(state["data"])
    else:
        for _ in range(start * plan.accum):
            next(batches)
    set_rng_state(state["rng"])
    return start, list(state["losses"])


def train(
    model: nn.Module,
    batches: Iterator[dict[str, torch.Tensor]],
    plan: TrainPlan,
    *,
    hooks: Hooks | None = None,
    state: dict[str, Any] | None = None,
    flops: ModelFlops | None = None,
    peak_tflops: float | None = None,
    progress: Progress | LineProgress | None = None,
) -> list[float]:
    """Run plan.steps optimizer steps on `batches` (dicts of model inputs incl. labels); returns the losses.

    hooks.on_step(step, loss) is called at step 0 before training (not again on resume: the first run
    evaluated it) and after every step in plan.eval_steps (every step when None): evaluations hook in here.
    Each of plan.accum micro-batches is weighted 1/accum, so with equal-sized micro-batches the update equals
    one step on their union; with a DDP- or FSDP-wrapped model the logged loss is the mean over processes.
    hooks.on_save(step, state) is called every plan.save_every steps and at plan.stop_at, after on_step;
    `state` (optimizer, scheduler, RNG, data position, losses so far) passed back as `state=` continues
    exactly. The data position is `batches.state_dict()` when the iterator has one (load_state_dict restores
    it); otherwise the consumed micro-batches are skipped by drawing them again.
    hooks.on_log(rows) receives one row per step (step, loss, lr, grad_norm, tokens, seconds, tokens_per_s,
    and with `flops` model_tflops and mfu) at every sync point (every plan.sync_every steps, evaluation and
    checkpoint steps, the last step); `seconds` is the sync window's wall time divided evenly over its steps
    (all processes' tokens count). mfu = model_tflops / (peak_tflops x processes), null without a peak.
    A non-finite loss or gradient norm raises TrainingDiverged at the next sync point, before on_step or
    on_save can see the model it produced; so does a model the last update broke (checked before every
    checkpoint and at the end: the loss of the step's last micro-batch after the update must be finite and no
    trainable weight beyond MAX_WEIGHT). At plan.stop_at the loop stops; the losses so far are returned.
    """
    if plan.accum < 1:
        raise ValueError(f"accum must be >= 1, got {plan.accum}")
    hooks = hooks or Hooks()
    parallel = isinstance(model, DistributedDataParallel) or is_fsdp(model)  # a plain model trains alone
    loss_fn = plan.loss or ModelLoss()
    opt, sched = make_optimizer(model, plan.optim, plan.steps)
    trainable = [p for p in model.parameters() if p.requires_grad]
    start, losses = _resume(model, batches, plan, opt, sched, state) if state is not None else (0, [])
    log = _StepLog(dist.get_world_size() if parallel else 1, flops, peak_tflops, hooks.on_log)
    log.losses = losses
    task = progress.add_task(plan.desc, total=plan.steps, completed=start, loss="-") if progress is not None else None
    if hooks.on_step is not None and state is None:
        hooks.on_step(0, float("nan"))
    log.restart_clock()
    sync_every, cadence = plan.sync_every or 1, _Cadence(plan.save_seconds)
    model.train()
    for step in range(start + 1, plan.steps + 1):
        lr = sched.get_last_lr()[0]  # the rate this step uses
        loss, tokens, step_flops, host = _step(model, batches, plan, flops, loss_fn, first=step == start + 1)
        gnorm = _update(opt, sched, trainable, plan.optim.clip, step)
        log.add(step, _process_mean(loss, parallel), local(gnorm).detach(), lr, tokens, step_flops)
        evaluating = hooks.on_step is not None and (plan.eval_steps is None or step in plan.eval_steps)
        stopping = plan.stop_at is not None and step >= plan.stop_at
        syncing = evaluating or stopping or step == plan.steps or len(log.pending) >= sync_every
        saving = hooks.on_save is not None and ((plan.save_every and step % plan.save_every == 0) or stopping
                                                or (syncing and step < plan.steps and cadence.due(parallel, model)))
        if syncing or saving:
            rows = log.sync()
            if task is not None and rows:
                progress.update(task, completed=rows[-1]["step"], loss=f"{losses[-1]:.3f}")
        if saving or stopping or step == plan.steps:
            _check_update(model, host, plan.autocast, step, parallel, loss_fn)
            log.restart_clock()
        if evaluating:
            hooks.on_step(step, losses[-1])
            model.train()
            log.restart_clock()
        if saving:
            with cadence.saving():
                hooks.on_save(step, {"step": step, "losses": list(losses), "optimizer": optimizer_state(model, opt),
                                     "scheduler": sched.state_dict(), "rng": rng_state(),
                                     "data": batches.state_dict() if hasattr(batches, "state_dict") else None})
            log.restart_clock()
        if stopping:
            break
    model.eval()
    return losses
