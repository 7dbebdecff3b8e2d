"""Training one run: `fit(run, plan, build=..., batches=..., evaluate=...)`.

`fit` joins the run's files (scalecl.training.run.Run: checkpoints, logs, resumption) to the training loop
(scalecl.training.loop.train) under a TrainPlan: it starts from step 0 or the run's latest checkpoint, moves and
prepares the model for the device and the processes (scalecl.compute.parallel), evaluates at the plan's steps,
checkpoints, sends logs to the trackers and summarises the speed of what it trained.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scalecl.common.errors import Interrupted, TrainingDiverged
from scalecl.compute.processes import Dist, say
from scalecl.training.loop import Hooks, TrainPlan, train
from scalecl.training.run import STEP_DIR, Run, check_stop
from scalecl.training.state import load_state
from scalecl.training.trackers import open_trackers

__all__ = ["Fit", "Runtime", "TrainPlan", "fit"]


@dataclass
class Runtime:
    """Where runs execute: this process's place in the job, the device, the progress display (None: none)
    and the printer (main process only)."""

    dist: Dist = field(default_factory=Dist)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    progress: Any = None
    say: Callable[[str], None] = say
    force: bool = False  # --force: a damaged cache entry is set aside and built again (else an error)


@dataclass
class Fit:
    """What `fit` hands back: the trained model, its losses and evaluation records, and whether it finished.

    `model` is what every process evaluates (sharded under FSDP); `export` is the full model to save: the
    model itself, or under FSDP rank 0's host copy holding the gathered weights (None on other ranks).
    `speed` summarises the steps this process trained (tokens/s, model TFLOP/s, MFU; scalecl.compute.perf) and how
    the run was spread over processes.
    """

    model: nn.Module
    losses: list[float]
    records: list[dict[str, Any]]
    timing: dict[str, float]
    complete: bool
    resumed_from: int = 0
    export: nn.Module | None = None
    speed: dict[str, Any] = field(default_factory=dict)


def _start(run: Run, plan: TrainPlan, runtime: Runtime) -> tuple[Path, dict] | None:
    """The checkpoint and state to resume from (None: step 0): rank 0 decides, every process follows."""
    start = run.begin(resume=plan.resume, force=plan.force, say=runtime.say) if runtime.dist.main else None
    if start is not None:  # resuming at or past the step to stop at would train past it (Run.check_stop)
        check_stop(run.name, int(start[1]["step"]), plan.stop_at)
    if runtime.dist.main:  # a folder named like a checkpoint the run will write, and not the run's own: refused now
        run.check_free(_save_steps(plan, int(start[1]["step"]) if start else 0, run))
    if runtime.dist.world > 1:
        box = [None if start is None else str(start[0])]
        dist.broadcast_object_list(box, src=0)
        start = None if box[0] is None else (Path(box[0]), load_state(box[0]))
    return start


def interrupted_line(run: Run, plan: TrainPlan) -> str:
    """What Ctrl-C during training says: the checkpoint the run continues from, and how (a cached stage resumes by
    itself; a run with --resume), or that it starts over."""
    ckpts = run.checkpoints()
    if not ckpts:
        return (f"{run.name}: interrupted before its first checkpoint (checkpoint.every / checkpoint.seconds); the "
                f"same command starts it again from step 0")
    step = int(STEP_DIR.match(ckpts[-1].name).group(1))
    how = "the same command continues it from there" if plan.resume == "auto" else \
        "the same command with --resume continues from there"
    return f"{run.name}: interrupted; its latest checkpoint is step {step:,} ({ckpts[-1]}): {how}"


def _save_steps(plan: TrainPlan, start: int, run: Run | None = None) -> list[int]:
    """The steps after `start` at which training will save a checkpoint (scalecl.training.loop.train); with a
    timed cadence (plan.save_seconds) any step may be one, so every step folder already in `run`'s place too."""
    last = plan.steps if plan.stop_at is None else min(plan.steps, max(plan.stop_at, start + 1))
    every = [s for s in range(start + 1, last + 1) if plan.save_every and s % plan.save_every == 0]
    timed = set()
    if plan.save_seconds and run is not None and run.ckpt_root.is_dir():
        timed = {n for p in run.ckpt_root.iterdir() if (m := STEP_DIR.match(p.name)) and (n := int(m.group(1))) > start}
    return sorted(set(every) | timed | ({last} if plan.stop_at is not None and last >= plan.stop_at else set()))


class _Clock:
    """Training and evaluation seconds of a run (carried across resumptions) and per-step totals."""

    def __init__(self, state: dict[str, Any] | None) -> None:
        self.now = time.perf_counter
        self.timing = dict(state["timing"]) if state else {"train_s": 0.0, "eval_s": 0.0}
        self.mark = self.now()
        self.totals = {"tokens": 0, "seconds": 0.0, "flops": 0.0, "steps": 0}

    def lap(self, key: str) -> None:
        t = self.now()
        self.timing[key] += t - self.mark
        self.mark = t

    def count(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            self.totals["steps"] += 1
            self.totals["tokens"] += r["tokens"]
            self.totals["seconds"] += r["seconds"]
            self.totals["flops"] += (r.get("model_tflops") or 0.0) * 1e12 * r["seconds"]


def _hooks(run: Run, model: nn.Module, host: nn.Module | None, clock: _Clock, evaluate, job: Dist) -> Hooks:
    """Evaluation, checkpoint and log callbacks of one run."""
    from scalecl.compute.parallel import gather, reshard

    def on_step(step: int, loss: float) -> None:
        clock.lap("train_s")
        if evaluate is not None:
            rec = evaluate(model, step, loss)
            reshard(model)  # FSDP: evaluation's forwards leave the root group gathered
            bad = {k: v for k, v in rec.items() if isinstance(v, float) and not math.isfinite(v)}
            if bad:  # a model whose evaluation is not finite is not recorded, nor trained further
                raise TrainingDiverged(f"training diverged: the evaluation at step {step} is not finite "
                                       f"({', '.join(f'{k}={v}' for k, v in list(bad.items())[:3])}); nothing "
                                       f"was recorded as finished")
            run.record(rec)
        clock.lap("eval_s")

    def on_save(step: int, tstate: dict[str, Any]) -> None:
        clock.lap("train_s")
        full = gather(model, host)  # every process takes part under FSDP
        if job.main:
            run.save_checkpoint(step, full, tstate | {"records": run.records, "timing": clock.timing})
        job.barrier()

    def on_log(rows: list[dict[str, Any]]) -> None:
        clock.count(rows)
        run.log_steps(rows)

    return Hooks(on_step=on_step if evaluate is not None else None, on_save=on_save, on_log=on_log)


def _speed(clock: _Clock, flops, peak: dict, plan: TrainPlan, model: nn.Module, runtime: Runtime) -> dict[str, Any]:
    """tokens/s, model TFLOP/s and MFU of the steps this process trained, and how the run was spread."""
    from scalecl.compute.parallel import describe
    from scalecl.compute.perf import speed_provenance

    t, job = clock.totals, runtime.dist
    sec = t["seconds"]
    tflops = t["flops"] / sec / 1e12 if sec > 0 else None
    speed = {
        "steps_timed": t["steps"], "tokens": t["tokens"], "seconds": round(sec, 3),
        "tokens_per_s": round(t["tokens"] / sec, 1) if sec > 0 else None,
        "model_flops_per_token": {"definition": "6N + 12 L H Q T (scalecl.compute.perf)", **flops.to_dict()},
        "model_tflops": None if tflops is None else float(f"{tflops:.4g}"),
        "mfu": float(f"{tflops / (peak['tflops'] * job.world):.4g}") if tflops is not None and peak["tflops"] else None,
        "sync_every": plan.sync_every,
        "loss": plan.loss.describe() if plan.loss is not None else {"name": "model"},
    }
    if plan.compute is None:
        return speed | {"parallel": {"mode": "single", "processes": job.world}, "peak": peak}
    return speed | {"parallel": describe(plan.compute, job.world, model)} | speed_provenance(plan.compute, runtime.device,
                                                                                         plan.autocast)


def fit(
    run: Run,
    plan: TrainPlan,
    *,
    build: Callable[[], nn.Module],
    batches: Iterator[dict[str, torch.Tensor]],
    evaluate: Callable[[nn.Module, int, float], dict[str, Any]] | None = None,
    runtime: Runtime | None = None,
    attach: Callable[[nn.Module], nn.Module] | None = None,
) -> Fit:
    """Train one run from step 0 or its latest checkpoint, evaluating at plan.eval_steps and checkpointing.

    build() makes the model of step 0 (e.g. method.apply(base)); when resuming, the checkpoint's model is
    loaded instead (checked to be of the run's method and options) and given to attach(), which adds what
    build() adds besides weights (the experiment's measurement state). evaluate(model, step, loss) returns one
    record; it runs on every process (under FSDP every process must run the same forwards). The model is
    moved to runtime.device and prepared by plan.compute (activation checkpointing, compile, DDP or FSDP2 across
    runtime.dist.world processes; scalecl.compute.parallel.prepare).
    """
    from scalecl.compute.loss import step_loss
    from scalecl.compute.parallel import gather, host_copy, prepare
    from scalecl.compute.perf import model_flops, peak_tflops
    from scalecl.compute.perf import sync_every as auto_sync

    runtime = runtime or Runtime()
    job = runtime.dist
    start = _start(run, plan, runtime)
    state = start[1] if start else None
    model = run.load_checkpoint_model(start[0]) if start else build()
    if start and attach is not None:
        model = attach(model)
    sharding = plan.compute is not None and plan.compute.parallel == "fsdp" and job.world > 1
    host = host_copy(model) if sharding and job.main else None  # rank 0 saves full models from it
    flops = model_flops(model)
    model = model.to(runtime.device)
    wrapped = prepare(model, plan.compute, runtime.device, job.world, plan.steps) if plan.compute is not None else model
    if plan.compute is not None and plan.loss is None:  # the chunked loss where it applies (scalecl.compute.loss)
        plan = replace(plan, loss=step_loss(wrapped, plan.compute.loss, runtime.device))
    if plan.sync_every is None:
        plan = replace(plan, sync_every=auto_sync(plan.compute, runtime.device) if plan.compute is not None else 1)
    peak = peak_tflops(runtime.device, plan.autocast)
    run.restore(state)
    clock = _Clock(state)
    if job.main and run.out_dir is not None:
        run.trackers = open_trackers(plan.report_to, run.name, run.out_dir / "tensorboard", plan.tracker_config)
    try:
        losses = train(wrapped, batches, plan, hooks=_hooks(run, model, host, clock, evaluate, job), state=state,
                       flops=flops, peak_tflops=peak["tflops"], progress=runtime.progress)
    except TrainingDiverged as e:
        run.close_trackers()
        ckpts = run.checkpoints()
        where = f"last good checkpoint {ckpts[-1]}" if ckpts else "no checkpoint had been written"
        raise TrainingDiverged(f"{run.name}: {e}; {where}") from None
    except KeyboardInterrupt:
        run.close_trackers()
        raise Interrupted(interrupted_line(run, plan)) from None
    except BaseException:
        run.close_trackers()
        raise
    clock.lap("train_s")
    complete = len(losses) >= plan.steps
    if not complete:
        run.close_trackers()
        runtime.say(f"{run.name}: stopped after step {len(losses)}; continue with --resume")
    export = gather(model, host) if complete else None  # every process takes part under FSDP
    return Fit(model, losses, run.records, {k: round(v, 1) for k, v in clock.timing.items()}, complete,
               int(state["step"]) if state else 0, export if export is not None else (model if job.main else None),
               _speed(clock, flops, peak, plan, model, runtime))
