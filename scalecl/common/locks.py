"""Locks: one process at a time trains a run or fills a cache entry.

Two identical commands started together must never delete each other's files. Every run folder and every
cache entry has a hidden lock file beside it (`.<name>.lock`, through `filelock`, an OS-level lock that is
released when its process dies, also after kill -9). A training run that finds its lock taken stops with
one line (another process is training it); a cache entry waits for the process filling it, and the caller
then finds the entry filled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from scalecl.common.errors import Busy


def lock_path(target: Path) -> Path:
    """The lock file of a run folder or cache entry: a hidden sibling `.<name>.lock` (hidden, so that a
    pattern such as `tiny-fft-*` still names the run folders alone)."""
    target = Path(target)
    return target.with_name(f".{target.name}.lock")


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
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        lock.release()
        for folder in made:  # deepest first; a folder someone else now uses is not empty and stays
            try:
                folder.rmdir()
            except OSError:
                break
