"""The progress display: a live bar on a terminal, plain lines in a log file (LineProgress), and the progress
of an evaluation (eval_progress) on whichever display is entered. Showing progress reads no tensor and changes
no number; training (scalecl.training.loop.train) and the evaluations report to it."""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

# An evaluation's display is updated at most this often: what a batch pays is one clock read
EVAL_TICK_S = 0.2

_SHOWING: list[Any] = []  # the progress displays entered, innermost last: evaluations report to it


def progress_bar(stderr: bool = False) -> Progress | LineProgress:
    """A live bar on a terminal; plain progress lines when the output is a log file, nohup or CI, where a bar
    would print nothing until the stage ends. While entered (`with progress_bar() as p`) it is the display
    that evaluations (`eval_progress`) report to. stderr=True: the lines go to stderr (a command whose stdout
    is its record)."""
    from rich.console import Console

    if not Console().is_terminal:
        return LineProgress(write=(lambda line: print(line, file=sys.stderr, flush=True)) if stderr else None)
    return _Bar(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), _FieldsColumn(),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
    )


class _FieldsColumn(ProgressColumn):
    """A training task's loss, or what an evaluation task counts (questions, sequences)."""

    def render(self, task) -> Text:
        fields = task.fields
        return Text(f"loss {fields['loss']}" if "loss" in fields else str(fields.get("unit", "")))


class _Bar(Progress):
    """rich's Progress, known to evaluations while entered."""

    def __enter__(self) -> _Bar:
        _SHOWING.append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        _SHOWING.remove(self)
        super().__exit__(*exc)


class _Ticks:
    """advance(n): n more items of an evaluation done; passed on to the display at most every EVAL_TICK_S."""

    def __init__(self, display: Any, task: int) -> None:
        self.display, self.task, self.done, self.shown = display, task, 0, time.monotonic()

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.shown >= EVAL_TICK_S:
            self.shown = now
            self.display.update(self.task, completed=self.done)


@contextlib.contextmanager
def eval_progress(desc: str, total: int, unit: str, quiet: bool = False) -> Iterator[Callable[[int], None]]:
    """Progress of one evaluation, of `total` `unit` (questions, sequences), on the display in use (none, as on
    a process other than the main one: nothing shown). Yields advance(n), which the evaluation calls with the
    items of each batch it has done; it reads no tensor and changes no number.

    On a terminal: a task of the live bar, removed when the evaluation ends. In a log file (LineProgress):
    a line at the start, every SCALECL_PROGRESS_EVERY seconds and at the end; `quiet` (evaluations inside
    training, dozens of them, each a second or so) leaves out the start line, so only one that runs longer
    than that interval prints (then its progress lines and its end)."""
    display = _SHOWING[-1] if _SHOWING else None
    if display is None:
        yield lambda n: None
        return
    task = display.add_task(desc, total=total, unit=unit, quiet=quiet)
    try:
        yield _Ticks(display, task)
        display.update(task, completed=total)
    finally:
        display.remove_task(task)


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}"


class LineProgress:
    """The progress bar's interface (add_task, update, remove_task) for output that is not a terminal: one
    line per task when it starts, then at most one every `every` seconds (SCALECL_PROGRESS_EVERY, default 30)
    and one when it completes: steps done (or, for an evaluation's `unit`, items done), loss, elapsed time and
    the remaining time at the rate since the task started. A `quiet` task writes no start line: it writes
    only after it has run `every` seconds, and then its end too."""

    def __init__(self, every: float | None = None, write: Callable[[str], None] | None = None) -> None:
        from scalecl.common.environment import env

        self.every = env("SCALECL_PROGRESS_EVERY") if every is None else every
        self.write = write or (lambda line: print(line, flush=True))
        self.tasks: dict[int, dict[str, Any]] = {}
        self._ids = itertools.count()

    def __enter__(self) -> LineProgress:
        _SHOWING.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _SHOWING.remove(self)

    def add_task(self, description: str, total: int, completed: int = 0, **fields: Any) -> int:
        now = time.monotonic()
        task = next(self._ids)
        self.tasks[task] = {"desc": description, "total": total, "start": completed, "done": completed,
                            "t0": now, "shown": now, "written": not fields.get("quiet"), **fields}
        if self.tasks[task]["written"]:
            self.write(f"{description}: {_count(self.tasks[task])}")
        return task

    def remove_task(self, task: int) -> None:
        self.tasks.pop(task, None)

    def update(self, task: int, completed: int | None = None, **fields: Any) -> None:
        t = self.tasks[task]
        t.update(fields)
        if completed is not None:
            t["done"] = completed
        now = time.monotonic()
        ended = t["done"] >= t["total"]
        if (now - t["shown"] < self.every and not ended) or t.get("ended") or \
                (ended and not t["written"] and now - t["t0"] < self.every):
            return
        t["shown"], t["written"], t["ended"], took = now, True, ended, now - t["t0"]
        rate = (t["done"] - t["start"]) / took if took > 0 else 0.0
        eta = f", ETA {_clock((t['total'] - t['done']) / rate)}" if rate > 0 and t["done"] < t["total"] else ""
        loss = f" loss {t['loss']}" if "loss" in t else ""
        self.write(f"{t['desc']}: {_count(t)} ({100 * t['done'] / max(t['total'], 1):.0f}%)"
                   f"{loss}, {_clock(took)} elapsed{eta}")


def _count(t: dict[str, Any]) -> str:
    """'step 40/600' for training, '1,200/2,400 questions' for an evaluation."""
    if "unit" in t:
        return f"{t['done']:,}/{t['total']:,} {t['unit']}"
    return f"step {t['done']}/{t['total']}"
