"""Locks: one process at a time writes a folder.

Two commands started together must never delete each other's files nor lose each other's manifest entries.
Every folder the suite writes has one lock: a hidden file beside it (`.<name>.lock`, through `filelock`, an
OS-level lock that is released when its process dies, also after kill -9), or inside it (`.scalecl.lock`)
when its parent folder cannot take a file. The rule, for every command:

- a run folder (`--out/<run>`) and its checkpoint folder: held while the run trains; a second process stops
  with one line (exit 1);
- `plot --out`, and `upscale`/`prepare`/`merge --out`: held for the whole command; a second writer stops with
  one line (exit 1);
- `eval-harness --out` and the folder of `eval-ppl --out`: held while their records and manifest are
  written (a second writer waits; both records land, and the manifest lists both);
- a cache entry (stage, base, encoding, tokenizer, corpus): a second process waits, then finds it filled.

A path is locked by its real location (links resolved, however it is spelled), and a process may take a lock
it already holds (nested writers of one command share it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from scalecl.common.errors import Busy

_HELD: dict[str, int] = {}  # lock files this process holds -> how many blocks hold each


def lock_path(target: Path) -> Path:
    """The lock file of a folder: a hidden sibling `.<name>.lock` of its real location (hidden, so that a
    pattern such as `tiny-fft-*` still names the run folders alone), or `.scalecl.lock` inside it when the
    parent folder exists and takes no file (e.g. `--out .` in a folder whose parent is read-only)."""
    real = Path(os.path.realpath(Path(target).expanduser()))
    beside = real.with_name(f".{real.name}.lock")
    if real.parent.is_dir() and not os.access(real.parent, os.W_OK | os.X_OK) and real.is_dir():
        return real / ".scalecl.lock"
    return beside


@contextlib.contextmanager
def locked(target: Path, *, wait: bool, what: str, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the lock of `target` for the block.

    wait=False: a lock held by another process is one Busy error (exit code 1) naming it; wait=True: say
    once that this process waits, then wait for as long as the other process holds it. On release the lock
    file is removed (while still held: filelock re-checks after locking that its file still has a name, so a
    waiter on the removed file retries on a fresh one), and so are the folders made only to hold it, when
    empty: a refused or finished command leaves no lock behind.
    """
    path = lock_path(target)
    key = str(path)
    if key in _HELD:  # this process holds it already (an outer block of the same command)
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    made = [q for q in (path.parent, *path.parent.parents) if not q.exists()]
    for _ in range(100):  # a folder made here may be removed by another process releasing its lock: make again
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            if not wait:
                raise Busy(f"{what} is being written by another process (lock {path}); wait for it to finish, "
                           f"or write elsewhere (--out / --checkpoints / --cache)") from None
            if say is not None:
                say(f"{what}: another process holds {path}; waiting for it")
                say = None
            try:
                lock.acquire()
            except FileNotFoundError:
                continue
        except FileNotFoundError:
            continue
        break
    _HELD[key] = 1
    try:
        yield
    finally:
        del _HELD[key]
        with contextlib.suppress(OSError):
            path.unlink()
        lock.release()
        for folder in made:  # deepest first; a folder someone else now uses is not empty and stays
            try:
                folder.rmdir()
            except OSError:
                break
