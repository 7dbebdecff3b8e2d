"""One sweep over methods for every experiment: `sweep(experiment, methods, options)`.

An experiment (the biography protocol, continual pre-training) says what is particular to it through the hooks
`ExperimentBase` declares (scalecl.experiments.base, each with its contract): its checks, how a run is named,
the shared data and cached stages every method starts from, how a method's model is built, its batches, its
TrainPlan, its evaluation and its result.
The sweep owns everything else, once: the process group, the device, the method order (the registry's),
the checks before anything is written, finding finished runs before any expensive work, the progress
display, training each run with scalecl.training.fit, writing its files, and the summary.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from scalecl.common.errors import ScaleclError
from scalecl.common.files import check_writable_dir
from scalecl.compute.machine import pick_device
from scalecl.compute.processes import Dist, distributed, say
from scalecl.experiments.args import (  # noqa: F401  (the arguments of a sweep, checked before torch loads)
    MAX_REPLICATES,
    SweepOptions,
    parse_methods,
    parse_seeds,
    replicates,
)
from scalecl.experiments.base import ExperimentBase, hold
from scalecl.methods import Method, method_names
from scalecl.training.fit import Runtime, fit
from scalecl.training.run import Run, WallClock


def order_methods(methods: list[str]) -> list[str]:
    """The asked-for methods in the registry's order; an unknown name is one clear error."""
    for name in methods:
        if name not in method_names():
            raise ScaleclError(f"unknown method {name!r}; choose one of {', '.join(method_names())} or all")
    return [m for m in method_names() if m in methods]


def _device(name: str | None, dist: Dist) -> torch.device:
    """--device with its index (an index-less `cuda` is this process's GPU: cuda:{local rank} under torchrun)."""
    return pick_device(name, local_rank=dist.local_rank if dist.world > 1 else None)


def enter_device(dev: torch.device, compute: Any) -> None:
    """Make `dev` this process's device for what follows: its CUDA device (an indexed one, pick_device) and
    the process-wide settings of compute (TF32)."""
    from scalecl.compute.perf import configure_device

    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    configure_device(dev, compute.tf32)


def check(exp: ExperimentBase, methods: list[str], opts: SweepOptions, dist: Dist | None = None
          ) -> tuple[torch.device, dict[str, Method]]:
    """Every check that writes nothing: method names, device, compute options, folders, the experiment's own
    checks and each method's options against the model. Returns (device, methods by name, in order)."""
    from scalecl.compute.loss import check_loss, resolve_loss
    from scalecl.compute.perf import check_compute

    dist = dist or Dist()
    order = order_methods(methods)
    dev = _device(opts.device, dist)
    check_compute(exp.rc.compute, dev, dist.world)
    check_loss(resolve_loss(exp.rc.compute.loss, dev), dev)
    exp.set_device(dev)  # compute.threads in force from here on; runs named by the device's numerics
    for path, what in ((exp.paths.out, "--out"), (exp.paths.cache, "--cache"),
                       (exp.paths.checkpoints, "--checkpoints")):
        check_writable_dir(path, what)
    prepared = {name: exp.rc.method(name) for name in order}
    exp.check(prepared, dist)
    return dev, prepared


def sweep(exp: ExperimentBase, methods: list[str], opts: SweepOptions | None = None, summary: bool = True
          ) -> list[dict[str, Any]]:
    """Train every asked-for method that has no finished run; returns one result per method (on the main
    process; [] on the others). When every run has finished, nothing is built: no data, no stage. summary=False
    leaves out the end-of-sweep table (a study prints one for all its values)."""
    opts = opts or SweepOptions()
    clock = WallClock.begin()  # every run's wall_s: the process's real time up to its result, in phases
    with distributed() as dist:
        dev, prepared = check(exp, methods, opts, dist)
        runs = {name: exp.run_of(m, dist) for name, m in prepared.items()}
        done = {name: run.result() for name, run in runs.items()}
        for name, run in runs.items():
            if done[name] is not None and not opts.force:
                say(f"{name}: finished run found at {run.out_dir} (use --force to rerun)")
        if opts.force or any(r is None for r in done.values()):
            refused = None  # a user's file where a run will write: refused before any stage, on every process
            try:
                for name, run in runs.items():
                    if opts.force or done[name] is None:
                        run.check_destinations()
                        if not opts.force:  # --force starts the run over: its checkpoints go
                            run.check_stop(opts.stop_after, opts.resume)
            except ScaleclError as e:
                refused = str(e)
            refused = dist.share(refused)
            if refused is not None:
                raise ScaleclError(refused)
            clock.lap("check")
            results = _train_all(exp, prepared, runs, done, opts, dev, dist, clock)
        else:
            results = list(done.values())
        if not dist.main:
            return []
        if results and summary:
            exp.summary(results)
        return results


def _check_budget(exp: ExperimentBase, methods: list[str], dev: torch.device, dist: Dist, show=say) -> list[str]:
    """Show the estimated peak memory and time of what the sweep will train (scalecl.experiments.budget), once its
    data is ready; returns the methods to train. A sweep that cannot fit is one error on every process before any
    training, except a sweep of every method (`--method all`): there each method that cannot fit is left out with
    one line saying why, and the others train (the error when none fits)."""
    from scalecl.experiments.budget import check_fits, describe, sweep_estimate

    refused, kept = None, methods
    if dist.main:
        e = sweep_estimate(exp, methods, dev, dist.world)
        show(describe(e))
        try:
            check_fits(e)
        except ScaleclError as err:
            refused = str(err)
            if len(methods) > 1 and set(methods) >= set(method_names()):
                kept, lines = [], []
                for name in methods:
                    try:
                        check_fits(sweep_estimate(exp, [name], dev, dist.world))
                        kept.append(name)
                    except ScaleclError as one:
                        lines.append(f"{name}: not trained: {one}")
                if kept:
                    for line in lines:
                        show(line)
                    refused = None
    refused, kept = dist.share((refused, kept))
    if refused is not None:
        raise ScaleclError(refused)
    return kept


def check_ahead(exps: Sequence[tuple[str, ExperimentBase]], methods: list[str], opts: SweepOptions) -> None:
    """The checks a sweep makes only just before it trains, for each of `exps` that has a run to train, so that
    a bad one fails before any of them trains: --stop-after against each run's latest checkpoint, and those
    that need the data (the tokenizer's size against model.vocab, the corpus against the batch, the memory
    estimate). Each prepares its data on a throwaway copy of itself: the experiment's own sweep prepares them
    again, from what this cached on disk (tokenizer, encoded corpus), and no set of data is held for long. A
    refusal names its label (a study's value, a replicate's seeds)."""
    for label, exp in exps:
        try:
            with distributed() as dist:
                dev, prepared = check(exp, methods, opts, dist)
                todo = [n for n, m in prepared.items() if opts.force or exp.run_of(m, dist).result() is None]
                refused = None
                try:
                    for n in todo if not opts.force else []:
                        exp.run_of(prepared[n], dist).check_stop(opts.stop_after, opts.resume)  # the main process
                except ScaleclError as e:
                    refused = str(e)
                refused = dist.share(refused)
                if refused is not None:
                    raise ScaleclError(refused)
                if todo:
                    trial = copy.copy(exp)  # prepare assigns the data to the copy; `exp` stays unprepared
                    trial.prepare(Runtime(dist, dev, None, lambda _: None))
                    _check_budget(trial, todo, dev, dist, show=lambda _: None)
        except ScaleclError as e:
            raise type(e)(f"{label}: {e}", cli=f"{label}: {e.cli_message()}") from None


def sweep_replicates(exps: list[ExperimentBase], methods: list[str], opts: SweepOptions) -> list[dict[str, Any]]:
    """Sweep every replicate (one experiment per seed pair) after checking all of them, data included, so a bad
    one fails before the first trains; every replicate is an ordinary run with its own name."""
    if len(exps) > 1:
        for exp in exps:
            check(exp, methods, opts)
        # the first makes these checks itself before it trains: the others, before it
        check_ahead([(f"base seed {e.rc.seed}, run seed {e.rc.run_seed}", e) for e in exps[1:]], methods, opts)
    return [r for exp in exps for r in sweep(exp, methods, opts)]


def _train_all(exp: ExperimentBase, prepared: dict[str, Method], runs: dict[str, Run], done: dict[str, Any],
               opts: SweepOptions, dev: torch.device, dist: Dist,
               clock: WallClock | None = None) -> list[dict[str, Any]]:
    from scalecl.training.progress import progress_bar

    enter_device(dev, exp.rc.compute)
    clock = clock or WallClock.begin()
    exp.prepare(Runtime(dist, dev, None, say, force=opts.force))
    clock.lap("prepare")
    todo = [n for n in prepared if opts.force or done[n] is None]
    fits = _check_budget(exp, todo, dev, dist)  # before any training
    prepared = {n: m for n, m in prepared.items() if n in fits or n not in todo}
    clock.lap("check")
    results = []
    with progress_bar() if dist.main else contextlib.nullcontext() as progress:
        runtime = Runtime(dist, dev, progress, say, force=opts.force)
        exp.stages(runtime)
        clock.lap("stages")
        for name, method in prepared.items():
            runs[name].wall = clock.for_run()
            r = done[name] if done[name] is not None and not opts.force else train_one(exp, method, runs[name],
                                                                                     runtime, opts)
            if r is not None:
                results.append(r)
    return results


def train_one(exp: ExperimentBase, method: Method, run: Run, runtime: Runtime, opts: SweepOptions
              ) -> dict[str, Any] | None:
    """Train one method's run and write its files, holding the run's lock (a second process training the same
    run stops with one line); its result (None: stopped early, or not the main process)."""
    with contextlib.ExitStack() as held:  # its results folder and its checkpoints, whatever --out and --checkpoints
        for folder in (run.out_dir, run.ckpt_root):
            if folder is not None:
                held.enter_context(hold(folder, runtime, wait=False, what=f"run {run.name} ({folder})"))
        finished = run.result() if runtime.dist.main and not opts.force else None
        if runtime.dist.share(finished is not None):  # finished by another process since the sweep looked
            runtime.say(f"{method.name}: another process finished this run while this one prepared it: {run.out_dir} "
                   f"(use --force to rerun)")
            return finished
        return _train_locked(exp, method, run, runtime, opts)


def _train_locked(exp: ExperimentBase, method: Method, run: Run, runtime: Runtime, opts: SweepOptions
                  ) -> dict[str, Any] | None:
    run.save_kw = run.save_kw | exp.save_kw()
    plan = replace(exp.plan(method, runtime), resume=opts.resume, force=opts.force, stop_at=opts.stop_after,
                   report_to=opts.report_to)
    res = fit(run, plan, build=lambda: exp.build(method), batches=exp.batches(method, runtime),
              evaluate=lambda model, step, loss: exp.evaluate(model, method, step, loss), runtime=runtime,
              attach=lambda model: exp.attach(model, method))
    if run.wall is not None:
        run.wall.lap("run")  # building the model, training, evaluations and checkpoints (fit)
    if not res.complete:
        return None
    result = exp.result(method, run, res, runtime)
    if run.wall is not None:
        run.wall.lap("final_eval")  # what the experiment does after training (biography: the full ranges)
    if runtime.dist.main:
        if res.resumed_from:
            result["resumed_from_step"] = res.resumed_from
        run.finish(result, res.export.cpu())
        runtime.say(f"{method.name}: wrote {run.out_dir}; final model {run.final_dir}")
    runtime.dist.barrier()
    return result if runtime.dist.main else None
