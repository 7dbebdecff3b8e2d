"""Files that are never half-written: atomic writes and folders, the suite's temporaries, writable folders,
and who owns a file the suite would replace.

Everything the suite writes goes to a hidden `.tmp-*` sibling first and is renamed into place when
complete, so a reader (or a process killed mid-write) never sees half a file; the next writer removes the
temporaries a killed process left.

Ownership: the suite replaces or deletes a file only when a manifest it wrote records that file's
fingerprint (size and content hash) and the file still matches it. A name in a manifest is never enough
(manifests are plain JSON anyone can edit); a file the user changed, added or linked is not the suite's. A
symbolic link is never written through or replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
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


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write via a temp file in the same folder and rename: readers never see half a file. A symbolic link
    at `path` (even one pointing nowhere) is refused, never written through or replaced."""
    path = Path(path)
    if path.is_symlink():
        raise ScaleclError(f"{path} is a symbolic link; scalecl does not write through or replace links")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; results are for everyone the umask allows
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None and e.errno is not None:  # a full disk: name the file
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


def write_json(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, default=str) + "\n")


def check_writable_dir(path: Path, what: str = "--out") -> None:
    """Fail early (one line, nothing written) when `path` cannot be a folder we write into."""
    p = Path(path).expanduser()
    if p.is_symlink() and not p.exists():
        raise ScaleclError(f"{what} {path} is a symbolic link to nothing ({os.readlink(p)}); give a folder")
    if p.exists() and not p.is_dir():
        raise ScaleclError(f"{what} {path} is a file, not a folder")
    if p.is_dir():
        if not os.access(p, os.W_OK | os.X_OK):  # also a read-only file system, whoever runs it
            raise ScaleclError(f"{what} {path} is not writable (read-only folder or file system)")
        return
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


# ---------------------------------------------------------------------------------------------------------
# Ownership: what the suite may replace

_SAMPLED_ABOVE = 64 << 20  # larger files are fingerprinted from a sample (the head, the tail and 62 spans)
_SPAN = 64 << 10


def fingerprint(path: Path) -> str:
    """`size:hash` of a regular file's content (files over 64 MiB: a hash of its head, tail and 62 spans)."""
    size = os.lstat(path).st_size
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if size <= _SAMPLED_ABOVE:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        else:
            for i in range(64):
                f.seek(min(size - _SPAN, i * (size - _SPAN) // 63))
                h.update(f.read(_SPAN))
    return f"{size}:{h.hexdigest()}"


def fingerprints(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every regular file under `folder` (relative POSIX path -> fingerprint); links are not followed."""
    out = {}
    for root, _dirs, names in os.walk(folder):
        for name in names:
            p = Path(root) / name
            rel = p.relative_to(folder).as_posix()
            if rel not in skip and not p.is_symlink() and p.is_file():
                out[rel] = fingerprint(p)
    return dict(sorted(out.items()))


def is_owned(path: Path, recorded: Any) -> bool:
    """Whether `path` is a regular file (no link) whose fingerprint is the one a manifest recorded for it."""
    p = Path(path)
    if not isinstance(recorded, str) or p.is_symlink() or not p.is_file():
        return False
    try:
        return fingerprint(p) == recorded
    except OSError:
        return False


def unowned_entries(folder: Path, manifest: dict[str, Any], allow: tuple[str, ...] = ()) -> list[str]:
    """Top-level names in `folder` holding anything the manifest (relative path -> fingerprint) does not prove
    the suite wrote: a file missing from it or changed since, a link, anything not a file or folder. `allow`:
    names that are the manifest itself (checked by its reader)."""
    bad = set()
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            p = Path(root) / name
            rel = p.relative_to(folder).as_posix()
            top = rel.split("/")[0]
            if rel in allow or top in bad:
                continue
            if p.is_symlink() or not (p.is_dir() or is_owned(p, manifest.get(rel))):
                bad.add(top)
    return sorted(bad)


class OwnedFiles:
    """A folder the suite shares with the user (e.g. `plot --out`): a file is written there only when the name
    is free or the file is one this writer wrote before and nobody changed since (its manifest, a hidden JSON
    file in the folder, records each file's fingerprint). Anything else is one ScaleclError, nothing replaced."""

    def __init__(self, folder: Path, writer: str) -> None:
        self.folder, self.writer = Path(folder), writer
        self.manifest = self.folder / f".scalecl-{writer.split()[-1]}-files.json"
        self.files: dict[str, str] = self._read()

    def _read(self) -> dict[str, str]:
        if not self.manifest.exists() and not self.manifest.is_symlink():
            return {}
        try:
            doc = json.loads(self.manifest.read_text()) if not self.manifest.is_symlink() else None
        except (OSError, ValueError):
            doc = None
        if not (isinstance(doc, dict) and doc.get("written_by") == self.writer and isinstance(doc.get("files"), dict)):
            raise ScaleclError(f"{self.manifest} is not the record of files {self.writer} wrote; not writing into "
                               f"{self.folder} (move it away or choose another folder)")
        return {k: v for k, v in doc["files"].items() if isinstance(v, str)}

    def check(self, name: str) -> Path:
        """The path to write `name` to, or one error when something there is not this writer's own file."""
        p = self.folder / name
        if (p.exists() or p.is_symlink()) and not is_owned(p, self.files.get(name)):
            raise ScaleclError(f"{p} exists and was not written by {self.writer} (or was changed since); "
                               f"not overwriting it: move it away or choose another folder")
        return p

    def write(self, name: str, data: str | bytes) -> Path:
        p = self.check(name)
        write_atomic(p, data)
        self.files[name] = fingerprint(p)
        write_json(self.manifest, {"written_by": self.writer, "files": dict(sorted(self.files.items()))})
        return p
