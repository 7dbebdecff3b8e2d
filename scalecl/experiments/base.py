"""What every experiment shares, written once: the protocol the sweep drives (`ExperimentBase`: every hook the
sweep calls, with its contract), where it writes, how a run is named, the result envelope, the micro-batch split,
cached stages and the end-of-run table. An experiment (scalecl.experiments.bio, .cpt) subclasses `ExperimentBase`
and implements its abstract hooks: its checks, data, stages, model building, batches, plan, evaluation and its own
result keys; scalecl.experiments.sweep calls nothing else.
"""

from __future__ import annotations

import abc
import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from rich.table import Table

from scalecl.common.consoles import make_console
from scalecl.common.errors import Busy, ScaleclError
from scalecl.common.files import set_aside
from scalecl.common.locks import locked
from scalecl.common.schema import config_hash, named_dict, numerics_key, seed_key, seed_tag
from scalecl.compute.machine import check_numerics, provenance, run_numerics
from scalecl.compute.processes import Dist
from scalecl.experiments.args import Paths  # noqa: F401  (where a sweep writes; light, for the command line)
from scalecl.methods import Method
from scalecl.training.checkpoint import find_damage, read_meta
from scalecl.training.fit import Fit, Runtime, TrainPlan
from scalecl.training.record import Envelope, fft_reference, params
from scalecl.training.run import Run

console = make_console()  # off a terminal: lines are not wrapped at 80 columns


def micro_split(batch: int, micro_batch: int, world: int) -> tuple[int, int]:
    """(rows per forward on each process, accumulation steps) of a global batch of `batch` rows over `world`
    processes; micro_batch 0 means one forward per process (no accumulation)."""
    per = batch // world
    micro = min(micro_batch, per) if micro_batch else per
    return micro, per // micro if micro else 0


@dataclass(frozen=True)
class EndTable:
    """The end-of-run table of an experiment: its title, columns, one row's cells from a result (None: the
    result cannot be shown), and the dim rows under them (chance)."""

    title: str
    columns: tuple[str, ...]
    cells: Callable[[dict[str, Any]], list[str] | None]
    footer: Callable[[list[dict[str, Any]]], list[list[str]]]


def print_end_table(table: EndTable, results: list[dict[str, Any]], labels: list[str] | None,
                    folders: Sequence[Path]) -> None:
    """A row per run (labelled by `labels`, default its method), the FFT run of the same base when one exists
    (this sweep's, or a finished one in the first of `folders` that has one) and the footer rows."""
    shown = Table(title=table.title)
    shown.add_column("run" if labels else "method", no_wrap=True)
    for col in table.columns:
        shown.add_column(col, justify="right")
    rows = list(zip(labels or [r["method"] for r in results], results, strict=True))
    fft = fft_reference(results, folders)
    if fft is not None and not any(r is fft for r in results):
        rows.append((f"fft (same base: {fft['run']['name']})", fft))
    for label, r in rows:
        cells = table.cells(r)
        if cells is not None:
            shown.add_row(label, *cells)
    for row in table.footer(results):
        shown.add_row(*row, style="dim")
    console.print(shown)


class ExperimentBase(abc.ABC):
    """An experiment as the sweep (scalecl.experiments.sweep) drives it: the hooks below, called in this order on
    every process (under torchrun, every method runs on every process; only rank 0 writes):

      set_device, check                      every check that writes nothing (sweep.check)
      run_of (per method)                    a run's name; a finished run is skipped before any data is built
      prepare, budget_phases                 the shared data, then the memory and time estimate
      stages                                 the cached stages every method starts from
      per method: save_kw, plan, batches, build (or, to resume, a checkpoint and attach), evaluate, result
      summary                                the end-of-sweep table (main process)

    `rc` is the experiment's resolved config (a scalecl.experiments.config.RunConfig), `paths` where it writes,
    `numerics` the device and CPU threads its runs compute with. A subclass sets `name` (its result.json
    `experiment`, its checkpoint subfolder), `not_named` (config keys, dotted for nested ones, left out of a run's
    name: they cannot change its numbers, or what they change is named apart: the method's options and rate, the
    run seed, the numerics; `scalecl plot` leaves them out of its replicate groups too), `end_table`, and
    implements the abstract hooks; the others have the shared behaviour written here."""

    name: ClassVar[str]
    not_named: ClassVar[tuple[str, ...]] = ("checkpoint", "methods", "compute", "run_seed")
    end_table: ClassVar[EndTable]

    def __init__(self, rc: Any, preset_name: str, paths: Paths) -> None:
        self.rc, self.preset, self.paths = rc, preset_name, paths
        self.device = torch.device("cpu")
        self.numerics = run_numerics(rc.compute, self.device)  # the sweep sets the device's (set_device)
        self.started: dict[str, Any] = {}
        self.never_rows: torch.Tensor | None = None  # stages: vocabulary rows never a target (SCALE-Route measures)

    def set_device(self, device: torch.device) -> None:
        """The device the sweep checked; from here on compute.threads is in force and runs are named by it."""
        self.device = device
        self.numerics = run_numerics(self.rc.compute, device, apply=True)

    @abc.abstractmethod
    def check(self, methods: dict[str, Method], dist: Dist) -> None:
        """Every check of the experiment's own that writes nothing and needs no data (sizes, the corpora it names,
        each of `methods`' options against the model), for `dist.world` processes; a ScaleclError says what to fix.
        Called after the sweep's own checks (device, compute options, folders), before any run is named."""

    def begin(self, runtime: Runtime) -> None:
        """Record the device and the provenance of the code that runs (called when the data are prepared)."""
        self.device = runtime.device
        self.started = provenance() | {"device": str(runtime.device)}

    # -- naming ------------------------------------------------------------------------------------------

    def lr_of(self, method: Method) -> float:
        """The rate `method` trains at, by the config's scheme (RunConfig.method_lr); named in its run's name,
        recorded in its result."""
        return self.rc.method_lr(method.name)

    # keys added after runs were named, with their default (the behaviour before them): left out of a name while
    # at that default, so that every earlier run keeps its name
    named_when_set: ClassVar[dict[str, Any]] = {}

    def named_config(self) -> dict[str, Any]:
        """The config a run's name hashes: all of it but what cannot change its numbers (`not_named`), and keys
        added later while at their default (`named_when_set`)."""
        return named_dict(asdict(self.rc), self.not_named, self.named_when_set)

    def name_parts(self, dist: Dist) -> tuple:
        """Further values a run's name depends on under `dist`'s processes (none by default)."""
        return ()

    def run_of(self, method: Method, dist: Dist) -> Run:
        """The run of one method, named by everything its numbers depend on."""
        rc = self.rc
        numerics = self.numerics | method.numerics()
        h = config_hash(self.named_config(), method.name, method.options(), self.lr_of(method), *self.name_parts(dist),
                        *seed_key(rc.run_seed), *numerics_key(numerics))
        name = f"{self.preset}-{method.name}-{seed_tag(rc.seed, rc.run_seed)}{h}"
        identity = {"experiment": self.name, "name": name, "method": method.name, "options": method.options(),
                    "config_hash": h, "numerics": numerics}
        return Run(identity, self.paths.out / name, self.paths.checkpoints / self.name / name,
                   keep=rc.checkpoint.keep, main=dist.main, method=method,
                   delta=rc.checkpoint.delta and method.delta)

    def attach(self, model: torch.nn.Module, method: Method) -> torch.nn.Module:
        """What a method's model needs from the experiment besides its weights, whether built for step 0 or
        loaded from a checkpoint to resume: the method takes what it measures (Method.attach; SCALE-Route: the
        never-target rows, whose logit shares it measures)."""
        return method.attach(model, never_rows=self.never_rows)

    @abc.abstractmethod
    def budget_phases(self, methods: list[str], world: int) -> list:
        """What a sweep of `methods` over `world` processes will run, as scalecl.experiments.budget phases (its
        memory and time estimate): from the prepared data once `prepare` ran, else from the config alone; a stage
        already cached is left out."""

    # -- shared data and stages --------------------------------------------------------------------------

    @abc.abstractmethod
    def prepare(self, runtime: Runtime) -> None:
        """The data every method shares (tokenizer, corpora, evaluation sets), made or read from the cache; calls
        `begin`. Runs before the progress display starts (`runtime.progress` is None); `runtime.force` rebuilds a
        damaged cache entry. The sweep also calls it on a throwaway copy of the experiment to check a replicate
        ahead."""

    @abc.abstractmethod
    def stages(self, runtime: Runtime) -> None:
        """The cached stages every method starts from (scalecl.experiments.base.cached_stage): trained under the
        progress display when not cached, read otherwise; afterwards `build` can make any method's model."""

    # -- one method ----------------------------------------------------------------------------------------

    @abc.abstractmethod
    def build(self, method: Method) -> torch.nn.Module:
        """The model of step 0 for `method` (on the CPU; the sweep moves it): the stages' model with the method
        applied, then `attach`ed, from the method's seed."""

    def save_kw(self) -> dict[str, Any]:
        """What every saved model of a method's run carries besides its weights (scalecl.training.run.Run.save_kw:
        tokenizer, base model, extra record keys); nothing by default."""
        return {}

    @abc.abstractmethod
    def batches(self, method: Method, runtime: Runtime) -> Iterator[dict[str, torch.Tensor]]:
        """This process's training batches of `method`'s run (its share of every global batch, one micro-batch
        per accumulation step), in the order the run's seed gives."""

    @abc.abstractmethod
    def plan(self, method: Method, runtime: Runtime) -> TrainPlan:
        """How `method`'s run trains: steps, optimizer at `lr_of(method)`, accumulation, autocast, evaluation and
        checkpoint steps (the sweep adds resume, force, stop and trackers)."""

    @abc.abstractmethod
    def evaluate(self, model: torch.nn.Module, method: Method, step: int, loss: float) -> dict[str, Any]:
        """One record of metrics.jsonl at `step` (`loss`: the step's training loss); every process runs it, in
        lock-step."""

    @abc.abstractmethod
    def result(self, method: Method, run: Run, res: Fit, runtime: Runtime) -> dict[str, Any]:
        """The result.json of a finished run: `envelope` plus the experiment's own keys (every process calls it;
        final evaluations run in lock-step; rank 0's is written)."""

    # -- the result --------------------------------------------------------------------------------------

    def envelope(self, method: Method, res: Any, runtime: Runtime) -> dict[str, Any]:
        """The result keys every experiment records (scalecl.training.record.Envelope)."""
        rc = self.rc
        return Envelope(
            experiment=self.name, preset=self.preset, method=method.name, method_options=method.options(),
            description=method.describe(), lr=self.lr_of(method), seeds={"base": rc.seed, "run": rc.run_seed},
            **params(res.model), config=asdict(rc), provenance=self.started | {"finished": provenance()["date"]},
            processes=runtime.dist.world, speed=res.speed).as_dict()

    def summary(self, results: list[dict[str, Any]], labels: list[str] | None = None) -> None:
        """The end-of-sweep table (see print_end_table), a row per result labelled by `labels` (default its
        method); a study compares with its main runs too."""
        print_end_table(self.end_table, results, labels, [self.paths.out, *self.paths.shared])


# ---------------------------------------------------------------------------------------------------------
# cached stages: the biography's stages 1-2 and the CPT's builtin base


def path_key(path: str, cache: Path) -> str:
    """How a path enters a cache key, whatever its spelling: inside the cache, `cache/<its place there>` (what
    the default `--cache cache` always gave, so those entries keep their keys); another existing path, its
    real absolute location; anything else (a hub id), as given."""
    p = Path(path).expanduser()
    if not p.exists():
        return path
    real, root = Path(os.path.realpath(p)), Path(os.path.realpath(cache))
    if real == root or root in real.parents:
        return Path("cache", real.relative_to(root)).as_posix()
    return str(real)


def adopt_entry(old: Path, new: Path, say: Callable[[str], None]) -> None:
    """A cache entry an earlier version keyed by how a path was spelled (`--cache /abs/cache`, a relative
    `--tokenizer`) is renamed to its spelling-independent key once, and said, instead of being built again
    while the old one lies unused."""
    if old == new or os.path.lexists(new) or old.is_symlink() or not old.is_dir():
        return
    with locked(new, wait=True, what=f"cache entry {new}"):
        if os.path.lexists(new) or not old.is_dir():
            return
        os.rename(old, new)
    say(f"cache entry {old.name} renamed to {new.name} (cache keys no longer depend on how a path is spelled)")


def stage_run(folder: Path, name: str, experiment: str, key: str, keep: int, main: bool, save_kw: dict,
              numerics: dict | None = None) -> Run:
    """A cached stage: its final model is the cache folder `folder/name` itself; checkpoints beside it, in
    `folder/checkpoints/name`, until it is done."""
    identity = {"experiment": experiment, "name": name, "method": None, "options": {}, "config_hash": key}
    if numerics is not None:
        identity["numerics"] = numerics
    return Run(identity, None, folder / "checkpoints" / name, final_dir=folder / name, keep=keep, main=main,
               save_kw=save_kw)


@contextlib.contextmanager
def hold(target: Path, runtime: Runtime, *, wait: bool, what: str) -> Iterator[None]:
    """The lock of a run folder or cache entry (scalecl.common.locks), taken by rank 0 for every process: a lock
    another process holds is one Busy error on every process (wait=False) or a wait (wait=True)."""
    with contextlib.ExitStack() as stack:
        refused = None
        if runtime.dist.main:
            try:
                stack.enter_context(locked(target, wait=wait, what=what, say=runtime.say))
            except Busy as e:
                refused = str(e)
        refused = runtime.dist.share(refused)
        if refused is not None:
            raise Busy(refused)
        yield


def cached_stage(run: Run, runtime: Runtime, train: Callable[[], dict], *, alone: bool = False) -> dict:
    """A cached stage's record: read from the cache when its final model is there, else `train()` (which trains
    it, resuming its own checkpoints, caches it and returns its record). `alone`: rank 0 trains while the other
    processes wait and then read the cache; otherwise every process trains (rank 0 writes)."""
    trained = None
    with hold(run.final_dir, runtime, wait=True, what=f"cached {run.name}"):
        runtime.dist.barrier()  # every process sees the same cache
        # verified on read, by rank 0
        refused = runtime.dist.share(_damaged_stage(run, runtime) if runtime.dist.main else None)
        if refused is not None:
            raise ScaleclError(refused)
        if read_meta(run.final_dir) is None and (runtime.dist.main or not alone):
            trained = train()
    if alone:
        runtime.dist.barrier()  # rank 0 has written the cache
    if trained is not None:
        return {**trained, "cached": False}
    meta = read_meta(run.final_dir) or {}
    if "numerics" in run.identity:  # an entry trained elsewhere under a key without its numerics
        check_numerics(meta.get("stage"), run.identity["numerics"], f"cached {run.name} ({run.final_dir})",
                       f"delete {run.final_dir} to train it again")
    return {**meta.get("stage", {}), "cached": True}


def _damaged_stage(run: Run, runtime: Runtime) -> str | None:
    """Verify a cached stage before it is used: every file its record lists must be what was written. A damaged
    entry is the error returned, or with --force (runtime.force) set aside (`<name>.damaged-N`, nothing deleted) so
    that it is trained again."""
    if not run.final_dir.exists():
        return None
    try:
        if read_meta(run.final_dir) is not None:
            how = find_damage(run.final_dir)
        elif run.final_dir.is_dir() and any(run.final_dir.iterdir()):  # files, but no record: it was removed
            how = f"{run.final_dir} holds no scalecl.json (its record was removed)"
        else:
            how = None
    except ScaleclError as e:  # its scalecl.json itself is damaged
        how = str(e)
    if how is None:
        return None
    if runtime.force:
        aside = set_aside(run.final_dir)
        runtime.say(f"cached {run.name} is damaged ({how}); moved to {aside}, training it again")
        return None
    return (f"cached {run.name} ({run.final_dir}) is damaged: {how}; --force moves it aside and trains it "
            f"again")


def stage_record(run: Run, res: Any, started: float, **info: Any) -> dict[str, Any]:
    """What a trained stage records in its cache entry: time, final loss, numerics and provenance, and `info`."""
    return {"wall_s": round(time.perf_counter() - started, 1), "final_loss": res.losses[-1], **info,
            "numerics": run.identity.get("numerics"),
            "provenance": {k: v for k, v in provenance().items() if k in ("date", "commit", "torch", "machine")}}
