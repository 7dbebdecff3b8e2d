"""Files that are never half-written: atomic writes and folders, the suite's temporaries, writable folders.

Everything the suite writes goes to a hidden `.tmp-*` sibling first and is renamed into place when
complete, so a reader (or a process killed mid-write) never sees half a file; the next writer removes the
temporaries a killed process left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import ScaleclError

_UMASK = os.umask(0)
os.umask(_UMASK)


TMP_PREFIX = ".tmp-"  # every temporary file or folder the suite writes starts so (removed after a kill)


def remove_temporaries(folder: Path, prefix: str = TMP_PREFIX) -> None:
    """Remove the suite's temporaries directly in `folder` (left there by a process killed mid-write)."""
    if Path(folder).is_dir():
        for p in Path(folder).iterdir():
            if p.name.startswith(prefix):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same folder and rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; results are for everyone the umask allows
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    import json

    write_atomic(path, json.dumps(obj, indent=2, default=str) + "\n")


def check_writable_dir(path: Path, what: str = "--out") -> None:
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
