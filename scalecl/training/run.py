"""One training run's files: what makes a run finished, its checkpoints, its logs.

Every training run of the suite (a biography stage or method, a continual pre-training run, each value
of a study, the pre-training of a cached base) is a `Run`, trained by `scalecl.training.fit.fit`. What it
guarantees, once for all of them:

- **Naming and skipping.** A run is named by a hash of its resolved config; a finished run (its
  `result.json` readable) is found before any expensive work and skipped unless forced.
- **Files that never lie.** While training, evaluations stream to `metrics.jsonl.partial` and the per-step
  log (loss, learning rate, gradient norm, tokens/s) to `train_log.jsonl.partial`. `finish` writes the final
  model, then `metrics.jsonl`, `train_log.jsonl`, and `result.json` last: a run is finished exactly when
  `result.json` exists. A diverged run (non-finite loss) records nothing as finished.
- **Checkpoints that resume exactly and safely.** `checkpoints/<experiment>/<run>/step-N/` holds the model
  (a suite checkpoint) and the training state as safetensors + JSON (`scalecl.training.state`, no pickle), plus the
  run's identity (experiment, name, method, options, config hash): `--resume` refuses a checkpoint of
  another method or configuration. A checkpoint is written into a hidden temporary sibling and renamed
  into place when complete, so a process killed at any moment leaves either the previous checkpoints or
  the new one, never half of one; temporaries of killed processes are removed when the run starts again.
- **Data.** Nothing is deleted or replaced that the run did not write, and ownership is proven, not named
  (scalecl.common.files): the run's files in `out_dir` are recorded with their fingerprints in
  `out_dir/.scalecl-run-files.json`, every checkpoint lists its files' fingerprints in `scalecl-checkpoint.json`,
  and every temporary folder holds the suite's mark. A file in the run folder the run would write but cannot
  prove it wrote (a user's `result.json`, `metrics.jsonl`, ...) is refused with one line before training;
  other files there (notes) are left alone; a folder named like a checkpoint or a temporary that is not the
  suite's is never removed, and never replaced (refused before training). `--force` removes only the run's
  own checkpoints, result and logs before starting over, and sets its final model aside (`final.previous`,
  removed when the new run finishes), so that nothing of the previous run lies beside the new one's files.

Processes: under torchrun every process runs the same code; only the main process (rank 0) writes.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from scalecl.common.errors import ScaleclError
from scalecl.common.files import (
    TMP_MARK,
    TMP_PREFIX,
    OwnedFiles,
    atomic_dir,
    fingerprint,
    fingerprints,
    large_digests,
    record_damage,
    remove_temporaries,
    unowned_entries,
    write_json,
)
from scalecl.compute.machine import check_numerics
from scalecl.methods.average import saved_module
from scalecl.training.crash import crash_point
from scalecl.training.record import RESULT_FILE, read_record, record_text
from scalecl.training.state import JSON_NAME, load_state, save_state

STEP_DIR = re.compile(r"^step-(\d{7,})$")
RUN_WRITER = "scalecl run"  # the run folder's manifest: out_dir/.scalecl-run-files.json
PARTIALS = ("metrics.jsonl.partial", "train_log.jsonl.partial")
FINALS = ("metrics.jsonl", "train_log.jsonl", RESULT_FILE)
CKPT_MANIFEST = "scalecl-checkpoint.json"  # (checkpoint.STEP_RECORD) in every step folder: the fingerprint of each file in it


def check_stop(name: str, step: int, stop_at: int | None) -> None:
    """One ScaleclError when run `name`, resuming at `step`, is asked to stop at or before it (stop_at)."""
    if stop_at is not None and step >= stop_at:
        raise ScaleclError(f"{name}: its latest checkpoint is at step {step}, at or past --stop-after {stop_at}; "
                           f"give a later --stop-after to continue it, or leave it out to finish the run")


def owned_checkpoint(p: Path) -> bool:
    """Whether `p` is a step folder the suite wrote: its manifest records every file in it and all still match."""
    m = Path(p) / CKPT_MANIFEST
    if Path(p).is_symlink() or not Path(p).is_dir() or m.is_symlink() or not m.is_file():
        return False
    try:
        doc = json.loads(m.read_text())
    except (OSError, ValueError):
        return False
    written = doc.get("written") if isinstance(doc, dict) else None
    return isinstance(written, dict) and bool(written) and not unowned_entries(p, written, allow=(CKPT_MANIFEST,))


def checkpoint_damage(p: Path) -> str | None:
    """How a step folder differs from what its manifest records (a file changed, truncated or gone; the manifest
    itself unreadable), or None when intact. A step folder of an older scalecl without a manifest: its model's
    own record is verified when it loads."""
    m = Path(p) / CKPT_MANIFEST
    if not m.exists() and not m.is_symlink():
        return None
    return record_damage(p, CKPT_MANIFEST)


def process_age() -> float:
    """Seconds since this process started (its start time as the kernel records it, to 10 ms); 0 where psutil
    (a dependency of accelerate) cannot tell, so that `total` then counts from the first sweep."""
    try:
        import psutil

        return max(time.time() - psutil.Process().create_time(), 0.0)
    except (ImportError, OSError):
        return 0.0


@dataclass
class WallClock:
    """A partition of this process's real time into named phases, so that a run's `wall_s` adds up to the
    time from the process's start to its result.json (`total`).

    The sweep (scalecl.experiments.sweep) starts one: `startup` is the process's age when the first sweep of the process
    began (interpreter, imports, argument parsing), `earlier` what earlier sweeps of the process took
    (replicates, study values). It laps the shared phases (check, prepare, stages); `for_run` starts a run's
    own clock from them, counting what other runs of the sweep took meanwhile as `earlier_runs`; Run.finish
    laps `write` and records the total.
    """

    phases: dict[str, float] = field(default_factory=dict)
    start: float = 0.0  # the process's start, on time.perf_counter's scale
    mark: float = 0.0
    _startup: typing.ClassVar[list[float]] = []  # the age of the process at its first sweep

    @classmethod
    def begin(cls) -> WallClock:
        now, age = time.perf_counter(), process_age()
        if not cls._startup:
            cls._startup.append(age)
        startup = min(cls._startup[0], age)
        return cls({"startup": startup, "earlier": age - startup}, now - age, now)

    def lap(self, key: str) -> None:
        """The time since the last lap counts to `key`."""
        now = time.perf_counter()
        self.phases[key] = self.phases.get(key, 0.0) + now - self.mark
        self.mark = now

    def for_run(self) -> WallClock:
        """A run's clock: the shared phases so far, and the time since them as `earlier_runs`."""
        run = WallClock(dict(self.phases), self.start, self.mark)
        run.lap("earlier_runs")
        return run

    def record(self) -> dict[str, Any]:
        """{"total": seconds since the process started, "phases": the partition of it, rounded}."""
        total = time.perf_counter() - self.start
        return {"total": round(total, 1), "phases": {k: round(v, 1) for k, v in self.phases.items()}}


@dataclass
class Run:
    """One training run's files: results in `out_dir`, checkpoints in `ckpt_root`, the final model in
    `final_dir` (default ckpt_root/final). `identity` is recorded in every checkpoint and the result.

    `method` is the method the run trains (None: a plain model, e.g. a cached stage); `save_kw` what every
    saved model carries besides its weights (tokenizer, base model; scalecl.training.checkpoint.save_model);
    `delta` whether its models are saved as delta checkpoints (only what the method trains)."""

    identity: dict[str, Any]  # experiment, name, method, options, config_hash, numerics (scalecl.compute.machine)
    out_dir: Path | None
    ckpt_root: Path
    final_dir: Path | None = None
    keep: int = 2
    main: bool = True
    method: Any = None
    save_kw: dict[str, Any] = field(default_factory=dict)
    delta: bool = False
    trackers: list[Any] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    wall: WallClock | None = None  # the run's phases (set by the sweep); finish() adds `write` and `total`
    _files: OwnedFiles | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.final_dir is None:
            self.final_dir = self.ckpt_root / "final"

    @property
    def name(self) -> str:
        return self.identity["name"]

    def _owned(self) -> OwnedFiles:
        """The run folder's files this run wrote (their fingerprints in out_dir/.scalecl-run-files.json)."""
        if self._files is None:
            self._files = OwnedFiles(self.out_dir, RUN_WRITER)
        return self._files

    def check_out_files(self) -> None:
        """Before training: each file the run writes in out_dir that is there already must be its own (recorded
        and unchanged; its step log may have grown by what a killed process appended), else one error."""
        if self.out_dir is None or not self.main:
            return
        if self.out_dir.is_symlink() or (self.out_dir.exists() and not self.out_dir.is_dir()):
            raise ScaleclError(f"{self.out_dir} is a symbolic link or a file, not the run's folder; move it away")
        for name in PARTIALS + FINALS:
            self._owned().check(name, grown=name == PARTIALS[1])

    def check_destinations(self) -> None:
        """Before any data or stage is built: every place this run will write holds nothing of the user's (its
        run folder's files, and its final checkpoint folder, which the end of training replaces), so a refusal
        costs seconds and leaves the caches untouched."""
        if not self.main:
            return
        self.check_out_files()
        if self.final_dir is not None and (self.final_dir.exists() or self.final_dir.is_symlink()):
            from scalecl.training.checkpoint import check_checkpoint_dest

            check_checkpoint_dest(self.final_dir, overwrite=True)

    def check_stop(self, stop_at: int | None, resume: bool | str) -> None:
        """Before any data or stage is built: a stop step (--stop-after) at or before the checkpoint --resume would
        continue from is refused (training on would pass the step asked for; --force starts over, so it is not
        checked then)."""
        found = self.checkpoints() if self.main and stop_at is not None and resume else []
        if found:
            check_stop(self.name, int(STEP_DIR.match(found[-1].name).group(1)), stop_at)

    # -- finished runs --------------------------------------------------------------------------------

    def result(self) -> dict[str, Any] | None:
        """The finished run's result, or None. An unreadable result.json is an error, not a silent rerun."""
        if self.out_dir is None:
            return None
        f = self.out_dir / RESULT_FILE
        if not f.exists() and not f.is_symlink():
            return None
        self._files = None  # the manifest as it is now: another process may have finished the run meanwhile
        self._owned().check(RESULT_FILE)  # only a result this layer wrote, unchanged, marks a finished run
        try:
            result = read_record(f, "finished run's result")
        except ScaleclError as e:
            raise ScaleclError(f"{e}; remove it or use --force to rerun") from None
        if "numerics" in self.identity:  # a run of another thread count or device is not this run
            check_numerics(result, self.identity["numerics"], f"the finished run {self.out_dir}",
                           "--force makes it again with this run's")
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
            remove_temporaries(root, prefix)  # only folders holding the suite's mark

    def own_checkpoints(self) -> list[Path]:
        """The complete checkpoints this run can prove it wrote (owned_checkpoint), oldest first."""
        return [p for p in self.checkpoints() if owned_checkpoint(p)]

    def remove_checkpoints(self) -> None:
        """Remove the run's own checkpoints (anything else named like one stays)."""
        for p in self.own_checkpoints():
            shutil.rmtree(p, ignore_errors=True)

    def check_free(self, steps: list[int]) -> None:
        """Before training: no step folder the run will write (`steps`) may be there unless it is the run's own."""
        for step in steps:
            p = self.ckpt_root / f"step-{step:07d}"
            if (p.exists() or p.is_symlink()) and not owned_checkpoint(p):
                raise ScaleclError(f"{p} exists and is not a checkpoint this run wrote (no matching {CKPT_MANIFEST}); "
                                   f"not replacing it: move it away")

    def begin(self, *, resume: bool | str, force: bool, say: Callable[[str], None]) -> tuple[Path, dict] | None:
        """Decide where training starts: (checkpoint, state) to resume from, or None for step 0.

        Without --resume, existing checkpoints of this run are refused (so that progress is never thrown away
        silently); --force removes them (and the run's result) first. resume="auto" (cached stages, whose
        name is their content) resumes when it can, silently starts from 0 otherwise.
        """
        if self.main:
            self.clean_temporaries()
            self.check_out_files()  # a user's file where the run writes: refused before anything is removed
        found = self.checkpoints()
        if force and self.main:  # the previous run goes, so that nothing of it lies beside the new one's files
            self.remove_checkpoints()
            if self.out_dir is not None:
                for name in reversed(FINALS):  # result.json first: the run is unfinished from here on
                    self._owned().remove(name)
            self._set_final_aside()
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
        if not (path / CKPT_MANIFEST).is_file():
            say(f"{self.name}: checkpoint {path} records no fingerprints (an older scalecl wrote it, or its "
                f"{CKPT_MANIFEST} was removed): resuming without verifying it")
        how = checkpoint_damage(path)
        if how is not None:
            raise ScaleclError(f"checkpoint {path} is damaged: {how} (verified against its {CKPT_MANIFEST}); nothing "
                               f"was resumed: remove {path.name} to resume from an earlier checkpoint, or --force "
                               f"to start over")
        state = load_state(path)
        theirs = state.get("run", {})
        for key in ("experiment", "name", "method", "options", "config_hash"):
            if _jsonable(theirs.get(key)) != _jsonable(self.identity.get(key)):
                raise ScaleclError(f"checkpoint {path} belongs to another run ({key} {theirs.get(key)!r}, this run "
                                   f"has {self.identity.get(key)!r}); refusing to resume from it")
        if "numerics" in self.identity:  # the same name made elsewhere: continuing it would mix two runs' sums
            check_numerics(theirs, self.identity["numerics"], f"checkpoint {path}",
                           "--force starts the run over with this run's")
        say(f"{self.name}: resuming from {path} (step {state['step']})")
        return path, state

    @property
    def previous_dir(self) -> Path:
        """Where --force sets the previous run's final model aside until the new run finishes."""
        return self.final_dir.with_name(f"{self.final_dir.name}.previous")

    def _set_final_aside(self) -> None:
        """--force: the previous run's final model (a checkpoint the suite provably wrote) moves to previous_dir,
        replacing an older one there, so that no model of another run stays where this run's will be; removed
        when this run finishes. A folder the suite cannot prove its own stays (the final save refuses it)."""
        from scalecl.training.checkpoint import check_checkpoint_dest

        final, aside = self.final_dir, self.previous_dir
        if not final.is_dir() or final.is_symlink():
            return
        try:
            check_checkpoint_dest(final, overwrite=True)
        except ScaleclError:
            return
        self._remove_previous()
        if not aside.exists():
            final.rename(aside)

    def _remove_previous(self) -> None:
        """Remove previous_dir when it is a checkpoint the suite provably wrote."""
        from scalecl.training.checkpoint import check_checkpoint_dest

        aside = self.previous_dir
        if aside.is_dir() and not aside.is_symlink():
            try:
                check_checkpoint_dest(aside, overwrite=True)
            except ScaleclError:
                return
            shutil.rmtree(aside, ignore_errors=True)

    def save_checkpoint(self, step: int, model: nn.Module, state: dict[str, Any]) -> Path:
        """step-N/model + step-N/trainer_state.*, written into a temporary folder renamed when complete."""
        from scalecl.training.checkpoint import save_model

        dest = self.ckpt_root / f"step-{step:07d}"
        self.check_free([step])
        with atomic_dir(dest) as tmp:
            save_model(saved_module(model), tmp / "model", self.method, delta=self.delta, **self.save_kw)
            crash_point("checkpoint-model-written")
            save_state(tmp, state | {"run": self.identity})
            crash_point("checkpoint-state-written")
            written = fingerprints(tmp, skip=(TMP_MARK,))
            write_json(tmp / CKPT_MANIFEST, {"written_by": RUN_WRITER, "written": written,
                                             "digests": large_digests(tmp, skip=(TMP_MARK,))})
        crash_point("checkpoint-renamed")
        done = self.own_checkpoints()
        for old in done[: max(len(done) - self.keep, 0)]:
            shutil.rmtree(old, ignore_errors=True)
        return dest

    def load_checkpoint_model(self, path: Path) -> nn.Module:
        """The model of a checkpoint, checked to be of this run's method and options."""
        from scalecl.training.checkpoint import load_model, read_meta

        method = self.method
        meta = read_meta(path / "model") or {}
        want = (method.name, method.options()) if method is not None else (None, {})
        got = (meta.get("method"), meta.get("options", {}))
        if _jsonable(got) != _jsonable(want):
            raise ScaleclError(f"checkpoint {path} holds a {got[0] or 'plain'} model with options {got[1]}, this run "
                               f"trains {want[0] or 'a plain model'} with {want[1]}; refusing to resume from it")
        # begin() verified the whole step folder against its manifest; an older one without it: the model's own
        return load_model(path / "model", verify=not (path / CKPT_MANIFEST).is_file())

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
            self._owned().write(PARTIALS[0], "".join(json.dumps(r) + "\n" for r in self.records))
            log = self._partial("train_log")
            keep = []
            if state and log.exists():
                for line in log.read_text().splitlines():
                    with contextlib.suppress(ValueError):
                        row = json.loads(line)
                        if isinstance(row, dict) and row.get("step", 0) <= state["step"]:
                            keep.append(line + "\n")
            self._owned().write(PARTIALS[1], "".join(keep), grown=True)

    def record(self, rec: dict[str, Any]) -> None:
        """One evaluation: kept, streamed to metrics.jsonl.partial, sent to the trackers."""
        self.records.append(rec)
        if self._partial("metrics") is not None:
            self._owned().write(PARTIALS[0], "".join(json.dumps(r) + "\n" for r in self.records))
            values = {f"eval/{k}": v for k, v in rec.items()
                      if isinstance(v, int | float) and not isinstance(v, bool) and k != "step"}
            for t in self.trackers:
                t.log(values, step=rec["step"])

    def log_steps(self, rows: list[dict[str, Any]]) -> None:
        """Per-step rows appended to train_log.jsonl.partial and sent to the trackers."""
        path = self._partial("train_log")
        if path is None:
            return
        self._owned().append(PARTIALS[1], "".join(json.dumps(r) + "\n" for r in rows))  # recorded after appending
        for t in self.trackers:
            for r in rows:
                t.log({f"train/{k}": v for k, v in r.items() if k not in ("step", "seconds")}, step=r["step"])

    def close_trackers(self) -> None:
        for t in self.trackers:
            t.finish()
        self.trackers = []

    # -- the end ----------------------------------------------------------------------------------------

    def finish(self, result: dict[str, Any] | None, model: nn.Module | None = None, **save_extra: Any) -> None:
        """Final model (if any, saved with save_kw and `save_extra`), then metrics.jsonl and train_log.jsonl,
        then result.json (the finished mark)."""
        if not self.main:
            return
        if model is not None:
            from scalecl.training.checkpoint import save_model

            save_model(saved_module(model), self.final_dir, self.method, overwrite=True, delta=self.delta,
                       **(self.save_kw | save_extra))
            crash_point("final-model-written")
        if self.out_dir is None:
            return
        owned = self._owned()
        owned.write("metrics.jsonl", "".join(json.dumps(r) + "\n" for r in self.records))
        log = self._partial("train_log")
        owned.write("train_log.jsonl", log.read_text() if log.exists() else "")
        crash_point("metrics-written")
        result = {} if result is None else result  # the caller's dict: it gets the same wall_s as the file
        if self.wall is not None:  # every second of the process up to this file, in phases (WallClock)
            self.wall.lap("write")
            result["wall_s"] = dict(result.get("wall_s") or {}) | self.wall.record()
        owned.write(RESULT_FILE, record_text(self.identity, result, self.out_dir, self.final_dir))
        self._remove_previous()  # --force set the previous run's model aside: this run replaced it
        self.tidy()
        self.close_trackers()

    def tidy(self) -> None:
        """Remove what only an unfinished run needs (partial files, temporaries) once result.json exists."""
        if self.main and self.out_dir is not None and (self.out_dir / RESULT_FILE).exists():
            for name in PARTIALS:  # only the run's own (a user's file so named stays)
                self._owned().remove(name, grown=name == PARTIALS[1])
            remove_temporaries(self.out_dir)


def adopt_run_folder(out_dir: Path, adopted: dict[str, Any]) -> None:
    """Record the files of a finished run folder that a scalecl older than run-folder manifests wrote, so that
    training and `plot` can prove from now on that nobody changed them. Only a folder without a manifest whose
    result.json reads as a run's record; `adopted` (kept in the manifest) says on what evidence, e.g. the
    commit that added the files unchanged since."""
    out_dir = Path(out_dir)
    manifest = OwnedFiles(out_dir, RUN_WRITER).manifest
    if manifest.exists() or manifest.is_symlink():
        raise ScaleclError(f"{out_dir} has a manifest already; only a folder an older scalecl wrote is adopted")
    read_record(out_dir / RESULT_FILE, "finished run's result")
    files = {name: fingerprint(out_dir / name) for name in FINALS if (out_dir / name).is_file()}
    write_json(manifest, {"written_by": RUN_WRITER, "files": files, "adopted": adopted})


def _jsonable(x: Any) -> Any:
    """Compare options the way they are stored (tuples and lists alike)."""
    return json.loads(json.dumps(x, sort_keys=True, default=str))
