"""The run layer: one implementation of what every experiment's training run must guarantee.

Every training run of the suite (a biography stage or method, a continual pre-training run, each value
of a study, the pre-training of a cached base) is a `Run` trained by `fit`. What that gives, once:

- **Naming and skipping.** A run is named by its resolved config (`run_name`); a finished run (its
  `result.json` readable) is found before any expensive work and skipped unless forced.
- **Files that never lie.** While training, evaluations stream to `metrics.jsonl.partial` and the per-step
  log (loss, learning rate, gradient norm, tokens/s) to `train_log.jsonl.partial`. `finish` writes the final
  model, then `metrics.jsonl`, `train_log.jsonl`, and `result.json` last: a run is finished exactly when
  `result.json` exists. A diverged run (non-finite loss) stops with TrainingDiverged and records nothing
  as finished.
- **Checkpoints that resume exactly and safely.** `checkpoints/<experiment>/<run>/step-N/` holds the model
  (a suite checkpoint) and the training state as safetensors + JSON (`scalecl.state`, no pickle), plus the
  run's identity (experiment, name, method, options, config hash): `--resume` refuses a checkpoint of
  another method or configuration. A checkpoint is written into a hidden temporary sibling and renamed
  into place when complete, so a process killed at any moment leaves either the previous checkpoints or
  the new one, never half of one; temporaries of killed processes are removed when the run starts again.
- **Divergence and data.** Nothing is deleted that the suite did not write; `--force` removes only the
  run's own checkpoints and result before starting over.

Processes: under torchrun every process runs the same code; only the main process (rank 0) writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console
from torch import nn

from .errors import ScaleclError, TrainingDiverged
from .runs import TMP_PREFIX, config_hash, remove_temporaries, write_atomic, write_json
from .state import JSON_NAME, load_state, save_state
from .train import OptimConfig, train

console = Console()
STEP_DIR = re.compile(r"^step-(\d{7,})$")


# ---------------------------------------------------------------------------------------------------------
# processes


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


# ---------------------------------------------------------------------------------------------------------
# crash points: kill -9 at a named moment (tests of the guarantees above; SCALECL_CRASH_AT=name[:n])


def crash_point(name: str) -> None:
    """SIGKILL this process the n-th time `name` is reached, when SCALECL_CRASH_AT=name[:n] asks for it.

    The windows where a kill is most dangerous (between writing a checkpoint's model and its state, between
    the final files) are too short to hit with a timer; tests name them instead. Unset, this is one dict
    lookup.
    """
    want = os.environ.get("SCALECL_CRASH_AT")
    if not want:
        return
    target, _, nth = want.partition(":")
    if target != name:
        return
    _CRASH_HITS[name] = _CRASH_HITS.get(name, 0) + 1
    if _CRASH_HITS[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


_CRASH_HITS: dict[str, int] = {}


# ---------------------------------------------------------------------------------------------------------
# folders


def check_out_dir(path: Path, what: str = "--out") -> None:
    """Fail early (one line, nothing written) when `path` cannot be a folder we write into."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise ScaleclError(f"{what} {path} is a file, not a folder")
    for parent in p.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ScaleclError(f"{what} {path} lies under {parent}, which is a file")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ScaleclError(f"{what} {path}: {parent} is not writable")
            break


def _replace_dir(tmp: Path, dest: Path) -> None:
    """Rename a complete temporary folder onto dest (moving a previous dest aside first, then removing it)."""
    old = None
    if dest.exists():
        old = dest.with_name(f"{TMP_PREFIX}{dest.name}-old-{os.getpid()}")
        os.replace(dest, old)
    os.replace(tmp, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _tmp_dir(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{dest.name}-", dir=dest.parent))


@contextlib.contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Fill a temporary sibling of `dest`; it replaces dest only when the block completes (else it is removed)."""
    tmp = _tmp_dir(dest)
    try:
        yield tmp
        _replace_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def run_name(prefix: str, *parts: Any) -> str:
    """`<prefix>-<hash>`: the hash of everything the run's numbers depend on (never of where files go)."""
    return f"{prefix}-{config_hash(*parts)}"


# ---------------------------------------------------------------------------------------------------------
# experiment trackers (accelerate's integrations; nothing hand-written)

REPORT_TO = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}  # -> module


def check_report_to(names: str | Collection[str] | None) -> tuple[str, ...]:
    """`--report-to` as a tuple of tracker names, each installed: one clear error otherwise, before any work."""
    import importlib.util

    items = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names or [])
    items = [n for n in items if n and n != "none"]
    for n in items:
        if n not in REPORT_TO:
            raise ScaleclError(f"--report-to {n!r}: choose none or any of {', '.join(REPORT_TO)}")
        if importlib.util.find_spec(REPORT_TO[n]) is None:
            raise ScaleclError(f"--report-to {n}: the {REPORT_TO[n]} package is not installed (pip install "
                               f"{REPORT_TO[n]})")
    return tuple(dict.fromkeys(items))


def _flat_config(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> flat {a.b.c: scalar} (trackers take scalars as hyperparameters)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flat_config(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, bool | int | float | str) or v is None else str(v)
    return out


def open_trackers(names: tuple[str, ...], run_name: str, logging_dir: Path, config: dict[str, Any]) -> list[Any]:
    """Started accelerate trackers for one run, its resolved config stored as hyperparameters."""
    if not names:
        return []
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    trackers = []
    for n in names:
        cls = LOGGER_TYPE_TO_CLASS[n]
        if n == "tensorboard":
            t = cls(run_name, logging_dir)  # events in <run dir>/tensorboard/<run name>
        elif n == "mlflow":
            t = cls(experiment_name="scalecl", logging_dir=str(logging_dir), run_name=run_name)
        else:  # wandb, trackio: one project, one run per scalecl run
            t = cls("scalecl", name=run_name)
        t.start()
        t.store_init_configuration({k: v for k, v in _flat_config(config).items() if v is not None})
        trackers.append(t)
    return trackers


# ---------------------------------------------------------------------------------------------------------
# a run


@dataclass
class Run:
    """One training run's files: results in `out_dir`, checkpoints in `ckpt_root`, the final model in
    `final_dir` (default ckpt_root/final). `identity` is recorded in every checkpoint and the result."""

    identity: dict[str, Any]  # experiment, name, method, options, config_hash
    out_dir: Path | None
    ckpt_root: Path
    final_dir: Path | None = None
    keep: int = 2
    main: bool = True
    trackers: list[Any] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.final_dir is None:
            self.final_dir = self.ckpt_root / "final"

    @property
    def name(self) -> str:
        return self.identity["name"]

    # -- finished runs --------------------------------------------------------------------------------

    def result(self) -> dict[str, Any] | None:
        """The finished run's result, or None. An unreadable result.json is an error, not a silent rerun."""
        if self.out_dir is None:
            return None
        f = self.out_dir / "result.json"
        if not f.exists():
            return None
        try:
            result = json.loads(f.read_text())
            if not isinstance(result, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:
            raise ScaleclError(f"{f} is unreadable ({type(e).__name__}); remove it or use --force to rerun") from None
        self.tidy()  # a process killed right after writing result.json may have left partial files
        return result

    # -- checkpoints ------------------------------------------------------------------------------------

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first (a folder named step-N holding a training state)."""
        if not self.ckpt_root.is_dir():
            return []
        found = [p for p in self.ckpt_root.iterdir() if STEP_DIR.match(p.name) and (p / JSON_NAME).exists()]
        return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))

    def clean_temporaries(self) -> None:
        """Remove hidden temporaries a killed process of this run left (only this layer's names for this run;
        save_model removes its own, `.<name>.tmp-*`, when it next writes there)."""
        spots = [(self.ckpt_root, TMP_PREFIX), (self.final_dir.parent, f"{TMP_PREFIX}{self.final_dir.name}-")]
        for root, prefix in spots:
            if root.is_dir():
                for p in root.iterdir():
                    if p.name.startswith(prefix) and p.is_dir():
                        shutil.rmtree(p, ignore_errors=True)

    def begin(self, *, resume: bool | str, force: bool, say: Callable[[str], None]) -> tuple[Path, dict] | None:
        """Decide where training starts: (checkpoint, state) to resume from, or None for step 0.

        Without --resume, existing checkpoints of this run are refused (so that progress is never thrown away
        silently); --force removes them (and the run's result) first. resume="auto" (cached stages, whose
        name is their content) resumes when it can, silently starts from 0 otherwise.
        """
        if self.main:
            self.clean_temporaries()
        found = self.checkpoints()
        if force and self.main:
            for p in found:
                shutil.rmtree(p)
            if self.out_dir is not None:
                (self.out_dir / "result.json").unlink(missing_ok=True)
            found = []
        if not found:
            if resume and resume != "auto":
                say(f"{self.name}: no checkpoint under {self.ckpt_root}; starting from step 0")
            return None
        if not resume:
            step = int(STEP_DIR.match(found[-1].name).group(1))
            raise ScaleclError(f"{self.name} has checkpoints up to step {step} in {self.ckpt_root}: --resume continues "
                               f"it, --force starts it over")
        path = found[-1]
        state = load_state(path)
        theirs = state.get("run", {})
        for key in ("experiment", "name", "method", "options", "config_hash"):
            if _jsonable(theirs.get(key)) != _jsonable(self.identity.get(key)):
                raise ScaleclError(f"checkpoint {path} belongs to another run ({key} {theirs.get(key)!r}, this run "
                                   f"has {self.identity.get(key)!r}); refusing to resume from it")
        say(f"{self.name}: resuming from {path} (step {state['step']})")
        return path, state

    def save_checkpoint(self, step: int, model: nn.Module, method, state: dict[str, Any],
                        save_kw: dict[str, Any]) -> Path:
        """step-N/model + step-N/trainer_state.*, written into a temporary folder renamed when complete."""
        from .checkpoint import save_model

        dest = self.ckpt_root / f"step-{step:07d}"
        with atomic_dir(dest) as tmp:
            save_model(model, tmp / "model", method, **save_kw)
            crash_point("checkpoint-model-written")
            save_state(tmp, state | {"run": self.identity})
            crash_point("checkpoint-state-written")
        crash_point("checkpoint-renamed")
        done = self.checkpoints()
        for old in done[: max(len(done) - self.keep, 0)]:
            shutil.rmtree(old, ignore_errors=True)
        return dest

    def load_checkpoint_model(self, path: Path, method) -> nn.Module:
        """The model of a checkpoint, checked to be of this run's method and options."""
        from .checkpoint import load_model, read_meta

        meta = read_meta(path / "model") or {}
        want = (method.name, method.options()) if method is not None else (None, {})
        got = (meta.get("method"), meta.get("options", {}))
        if _jsonable(got) != _jsonable(want):
            raise ScaleclError(f"checkpoint {path} holds a {got[0] or 'plain'} model with options {got[1]}, this run "
                               f"trains {want[0] or 'a plain model'} with {want[1]}; refusing to resume from it")
        return load_model(path / "model")

    # -- records and logs -------------------------------------------------------------------------------

    def _partial(self, stem: str) -> Path | None:
        return None if self.out_dir is None or not self.main else self.out_dir / f"{stem}.jsonl.partial"

    def restore(self, state: dict[str, Any] | None) -> None:
        """Records from a resumed state; the step log cut back to the checkpoint's step (a killed process may
        have logged steps after it, and may have left a half-written last line)."""
        self.records = list(state["records"]) if state else []
        if self._partial("metrics") is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            remove_temporaries(self.out_dir)  # half-written files of a killed process
            write_atomic(self._partial("metrics"), "".join(json.dumps(r) + "\n" for r in self.records))
            log = self._partial("train_log")
            keep = []
            if state and log.exists():
                for line in log.read_text().splitlines():
                    with contextlib.suppress(ValueError):
                        row = json.loads(line)
                        if isinstance(row, dict) and row.get("step", 0) <= state["step"]:
                            keep.append(line + "\n")
            write_atomic(log, "".join(keep))

    def record(self, rec: dict[str, Any]) -> None:
        """One evaluation: kept, streamed to metrics.jsonl.partial, sent to the trackers."""
        self.records.append(rec)
        if self._partial("metrics") is not None:
            write_atomic(self._partial("metrics"), "".join(json.dumps(r) + "\n" for r in self.records))
            values = {f"eval/{k}": v for k, v in rec.items()
                      if isinstance(v, int | float) and not isinstance(v, bool) and k != "step"}
            for t in self.trackers:
                t.log(values, step=rec["step"])

    def log_steps(self, rows: list[dict[str, Any]]) -> None:
        """Per-step rows appended to train_log.jsonl.partial and sent to the trackers."""
        path = self._partial("train_log")
        if path is None:
            return
        with open(path, "a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        for t in self.trackers:
            for r in rows:
                t.log({f"train/{k}": v for k, v in r.items() if k not in ("step", "seconds")}, step=r["step"])

    def close_trackers(self) -> None:
        for t in self.trackers:
            t.finish()
        self.trackers = []

    # -- the end ----------------------------------------------------------------------------------------

    def finish(self, result: dict[str, Any] | None, final: tuple[nn.Module, Any, dict[str, Any]] | None) -> None:
        """Final model (if any), then metrics.jsonl and train_log.jsonl, then result.json (the finished mark)."""
        if not self.main:
            return
        if final is not None:
            from .checkpoint import save_model

            model, method, save_kw = final
            save_model(model, self.final_dir, method, overwrite=True, **save_kw)  # atomic replace of our own
            crash_point("final-model-written")
        if self.out_dir is None:
            return
        write_atomic(self.out_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in self.records))
        log = self._partial("train_log")
        write_atomic(self.out_dir / "train_log.jsonl", log.read_text() if log.exists() else "")
        crash_point("metrics-written")
        write_json(self.out_dir / "result.json", {"run": self.identity} | (result or {}))
        self.tidy()
        self.close_trackers()

    def tidy(self) -> None:
        """Remove what only an unfinished run needs (partial files, temporaries) once result.json exists."""
        if self.main and self.out_dir is not None and (self.out_dir / "result.json").exists():
            for stem in ("metrics", "train_log"):
                self._partial(stem).unlink(missing_ok=True)
            remove_temporaries(self.out_dir)


def _jsonable(x: Any) -> Any:
    """Compare options the way they are stored (tuples and lists alike)."""
    return json.loads(json.dumps(x, sort_keys=True, default=str))


# ---------------------------------------------------------------------------------------------------------
# training a run


@dataclass
class Fit:
    """What `fit` hands back: the trained model, its losses and evaluation records, and whether it finished.

    `model` is what every process evaluates (sharded under FSDP); `export` is the full model to save: the
    model itself, or under FSDP rank 0's host copy holding the gathered weights (None on other ranks).
    `speed` summarises the steps this process trained (tokens/s, model TFLOP/s, MFU; scalecl.perf) and how
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


def fit(
    run: Run,
    build: Callable[[], nn.Module],
    batches: Iterator[dict[str, torch.Tensor]],
    steps: int,
    oc: OptimConfig,
    *,
    method=None,
    device: torch.device,
    evaluate: Callable[[nn.Module, int, float], dict[str, Any]] | None = None,
    eval_steps: Collection[int] = (),
    resume: bool | str = False,
    force: bool = False,
    save_every: int = 0,
    stop_at: int | None = None,
    accum: int = 1,
    autocast: torch.dtype | None = None,
    wrap: Callable[[nn.Module], nn.Module] | None = None,
    d: Dist = Dist(),
    progress=None,
    desc: str = "train",
    save_kw: dict[str, Any] | None = None,
    say: Callable[[str], None] = lambda s: console.print(s, highlight=False),
    sync_every: int | None = None,
    report_to: tuple[str, ...] = (),
    config: dict[str, Any] | None = None,
    compute=None,
) -> Fit:
    """Train one run from step 0 or its latest checkpoint, evaluating at eval_steps and checkpointing.

    build() makes the model of step 0 (e.g. method.apply(base)); when resuming, the checkpoint's model is
    loaded instead (checked to be of the same method and options). evaluate(model, step, loss) returns one
    record; it runs on every process (under FSDP every process must run the same forwards). The model is
    moved to `device` and prepared by `compute` (a config.ComputeConfig: activation checkpointing, compile,
    DDP or FSDP2 across d.world processes; scalecl.parallel.prepare), or wrapped by `wrap`.
    sync_every: steps between host reads (default: compute.sync_every resolved for the device, else 1).
    """
    from .parallel import describe, gather, host_copy, prepare, reshard
    from .perf import model_flops, peak_tflops, speed_provenance
    from .perf import sync_every as auto_sync

    save_kw = save_kw or {}
    start = run.begin(resume=resume, force=force, say=say) if d.main else None
    if d.world > 1:  # every process resumes from what rank 0 decided
        box = [None if start is None else str(start[0])]
        dist.broadcast_object_list(box, src=0)
        start = None if box[0] is None else (Path(box[0]), load_state(box[0]))
    state = start[1] if start else None
    model = run.load_checkpoint_model(start[0], method) if start else build()
    sharding = compute is not None and compute.parallel == "fsdp" and d.world > 1
    host = host_copy(model) if sharding and d.main else None  # rank 0 saves full models from it
    flops = model_flops(model)
    model = model.to(device)
    if compute is not None:
        wrapped = prepare(model, compute, device, d.world)
    else:
        wrapped = wrap(model) if wrap is not None else model
    if sync_every is None:
        sync_every = auto_sync(compute, device) if compute is not None else 1
    peak = peak_tflops(device, autocast)
    run.restore(state)
    timing = dict(state["timing"]) if state else {"train_s": 0.0, "eval_s": 0.0}
    clock = [time.perf_counter()]

    def on_step(step: int, loss: float) -> None:
        t = time.perf_counter()
        timing["train_s"] += t - clock[0]
        if evaluate is not None:
            run.record(evaluate(model, step, loss))
            reshard(model)  # FSDP: evaluation's forwards leave the root group gathered
        clock[0] = time.perf_counter()
        timing["eval_s"] += clock[0] - t

    def on_save(step: int, tstate: dict[str, Any]) -> None:
        timing["train_s"] += time.perf_counter() - clock[0]
        clock[0] = time.perf_counter()
        full = gather(model, host)  # every process takes part under FSDP
        if d.main:
            run.save_checkpoint(step, full, method, tstate | {"records": run.records, "timing": timing}, save_kw)
        d.barrier()

    totals = {"tokens": 0, "seconds": 0.0, "flops": 0.0, "steps": 0}

    def on_log(rows: list[dict[str, Any]]) -> None:
        for r in rows:
            totals["steps"] += 1
            totals["tokens"] += r["tokens"]
            totals["seconds"] += r["seconds"]
            totals["flops"] += (r.get("model_tflops") or 0.0) * 1e12 * r["seconds"]
        run.log_steps(rows)

    if d.main and run.out_dir is not None:
        run.trackers = open_trackers(report_to, run.name, run.out_dir / "tensorboard", config or {})
    try:
        losses = train(wrapped, batches, steps, oc, on_step=on_step, progress=progress, desc=desc,
                       autocast_dtype=autocast, eval_steps=set(eval_steps), accum=accum, save_every=save_every,
                       on_save=on_save, on_log=on_log, sync_every=sync_every, resume=state, stop_at=stop_at,
                       flops=flops, peak_tflops=peak["tflops"])
    except TrainingDiverged as e:
        run.close_trackers()
        ckpts = run.checkpoints()
        where = f"last good checkpoint {ckpts[-1]}" if ckpts else "no checkpoint had been written"
        raise TrainingDiverged(f"{run.name}: {e}; {where}") from None
    except BaseException:
        run.close_trackers()
        raise
    timing["train_s"] += time.perf_counter() - clock[0]
    complete = len(losses) >= steps
    if not complete:
        run.close_trackers()
        say(f"{run.name}: stopped after step {len(losses)}; continue with --resume")
    export = gather(model, host) if complete else None  # every process takes part under FSDP
    sec = totals["seconds"]
    tflops = totals["flops"] / sec / 1e12 if sec > 0 else None
    speed = {
        "steps_timed": totals["steps"], "tokens": totals["tokens"], "seconds": round(sec, 3),
        "tokens_per_s": round(totals["tokens"] / sec, 1) if sec > 0 else None,
        "model_flops_per_token": {"definition": "6N + 12 L H Q T (scalecl.perf)", **flops.to_dict()},
        "model_tflops": None if tflops is None else float(f"{tflops:.4g}"),
        "mfu": float(f"{tflops / (peak['tflops'] * d.world):.4g}") if tflops is not None and peak["tflops"] else None,
        "sync_every": sync_every,
        "parallel": describe(compute, d.world, model) if compute is not None else {"mode": "custom" if wrap else
                                                                                     "single", "processes": d.world},
    }
    if compute is not None:
        speed |= speed_provenance(compute, device, autocast)
    else:
        speed["peak"] = peak
    return Fit(model, losses, run.records, {k: round(v, 1) for k, v in timing.items()}, complete,
               int(state["step"]) if state else 0, export if export is not None else (model if d.main else None),
               speed)
