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
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from scalecl.common.errors import ScaleclError

_UMASK = os.umask(0)
os.umask(_UMASK)


TMP_PREFIX = ".tmp-"  # every temporary file or folder the suite writes starts so (removed after a kill)
TMP_MARK = ".scalecl-tmp"  # the file inside every temporary folder the suite makes: its proof of ownership
_MARK_TEXT = "a temporary folder of scalecl; removed when complete or by the next writer after a kill\n"


def make_temporary(parent: Path, prefix: str) -> Path:
    """A new temporary folder `parent/<prefix><random>` holding the suite's mark (a folder named like a
    temporary without the mark is a user's and never removed)."""
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    (tmp / TMP_MARK).write_text(_MARK_TEXT)
    return tmp


def unmark(tmp: Path) -> None:
    """Take the mark out of a complete temporary folder before it is renamed into place, and give it and what
    it holds the permissions the umask allows (mkdtemp makes folders for their owner alone, and some writers,
    safetensors among them, make files so): results and checkpoints are for everyone the user's umask admits."""
    (tmp / TMP_MARK).unlink(missing_ok=True)
    for root, _dirs, names in os.walk(tmp):
        with contextlib.suppress(OSError):
            os.chmod(root, 0o777 & ~_UMASK)
        for name in names:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                with contextlib.suppress(OSError):
                    os.chmod(p, 0o666 & ~_UMASK)


def is_marked_temporary(p: Path) -> bool:
    """Whether `p` is a folder (no link) holding the suite's temporary mark, a regular file with its text."""
    mark = Path(p) / TMP_MARK
    if Path(p).is_symlink() or not Path(p).is_dir() or mark.is_symlink() or not mark.is_file():
        return False
    try:
        return mark.stat().st_size == len(_MARK_TEXT) and mark.read_text() == _MARK_TEXT
    except (OSError, UnicodeDecodeError):
        return False


def remove_temporaries(folder: Path, prefix: str = TMP_PREFIX) -> None:
    """Remove the suite's temporaries directly in `folder` (left there by a process killed mid-write): only
    folders named `prefix...` that hold the suite's mark; anything else named so (a user's file or folder) stays."""
    if Path(folder).is_dir():
        for p in Path(folder).iterdir():
            if p.name.startswith(prefix) and is_marked_temporary(p):
                shutil.rmtree(p, ignore_errors=True)


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write via a marked temporary folder beside `path` and rename: readers never see half a file, and what a
    killed process leaves is provably the suite's. A symbolic link at `path` (even one pointing nowhere) is
    refused, never written through or replaced; the rename replaces the name, never the content of another
    link (hard link) to the old file."""
    path = Path(path)
    if path.is_symlink():
        raise ScaleclError(f"{path} is a symbolic link; scalecl does not write through or replace links")
    tmp_dir = make_temporary(path.parent, f"{TMP_PREFIX}{path.name}-")
    tmp = tmp_dir / path.name
    try:
        with open(tmp, "xb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
        os.chmod(tmp, 0o666 & ~_UMASK)  # results are for everyone the umask allows
        os.replace(tmp, path)
        shutil.rmtree(tmp_dir, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if isinstance(e, OSError) and e.filename is None and e.errno is not None:  # a full disk: name the file
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


_OS_ERROR_TEXT = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+)")  # Rust libraries' I/O errors (safetensors, tokenizers)


def os_error_code(e: BaseException) -> int | None:
    """The errno behind an exception, wherever it comes from: an OSError, or a library's error whose message
    carries one (safetensors' and tokenizers' Rust cores: "No space left on device (os error 28)"), also when
    it is the cause or context of the exception raised; None for any other error."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno:
            return e.errno
        m = _OS_ERROR_TEXT.search(str(e))
        if m:
            return int(m[1] or m[2])
        e = e.__cause__ or e.__context__
    return None


@contextlib.contextmanager
def os_errors_named(path: Path) -> Iterator[None]:
    """An OS error inside the block that names no file (a full disk met by a Rust library, a write to an open
    file) is raised again as an OSError naming `path`, so the user is told where it happened."""
    try:
        yield
    except OSError as e:
        if e.filename is None and e.errno:
            raise OSError(e.errno, e.strerror or os.strerror(e.errno), str(path)) from e
        raise
    except Exception as e:
        code = os_error_code(e)
        if code is None:
            raise
        raise OSError(code, os.strerror(code), str(path)) from e


def write_json(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, default=str) + "\n")


# the records of what the suite verifies on read: a cache entry, a checkpoint, a training checkpoint
VERIFIED_RECORDS = ("scalecl-cache.json", "scalecl.json", "scalecl-checkpoint.json")


def verified_folder(path: Path, *, itself: bool = True) -> Path | None:
    """The nearest folder above `path` (or `path` itself, with `itself`) holding a record the suite verifies its
    files against (VERIFIED_RECORDS), or None: anything written inside one would make it read as damaged, or be
    read as part of it."""
    where = Path(os.path.realpath(Path(path).expanduser()))
    for folder in ([where] if itself else []) + list(where.parents):
        if any((folder / r).is_file() for r in VERIFIED_RECORDS):
            return folder
    return None


def check_writable_dir(path: Path, what: str = "--out", *, replaces: bool = False) -> None:
    """Fail early (one line, nothing written) when `path` cannot be a folder we write into: a file or a path
    under one, a dangling link, a name longer than the file system allows, a folder inside a cache entry or a
    checkpoint (verified_folder; `replaces`: `path` may itself be one, which the caller replaces whole), or a
    folder (the nearest existing one) in which creating an entry fails: read-only, no permission, a pseudo file
    system such as /sys. The last is tried for real (an empty marked folder made and removed), since permission
    bits and os.access do not tell what a root user without CAP_DAC_OVERRIDE, or a read-only mount, allows."""
    p = Path(path).expanduser()
    if str(path) == "":
        raise ScaleclError(f"{what} is empty: give a folder")
    check_path_length(p, what)  # first: stat() itself fails on too long a name
    inside = verified_folder(p, itself=not replaces)
    if inside is not None:
        kind = next(r for r in VERIFIED_RECORDS if (inside / r).is_file())
        raise ScaleclError(f"{what} {path} lies inside {inside}, which the suite verifies on read ({kind}): writing "
                           f"there would damage it; give a folder outside it")
    where = Path(os.path.abspath(p))
    if p.is_symlink() and not p.exists():
        raise ScaleclError(f"{what} {path} is a symbolic link to nothing ({os.readlink(p)}); give a folder")
    if p.exists() and not p.is_dir():
        raise ScaleclError(f"{what} {path} is a file, not a folder")
    if p.is_dir():
        _try_write(where, what, path)
        return
    for parent in where.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ScaleclError(f"{what} {path} lies under {parent}, which is a file")
            _try_write(parent, what, path)
            break


def check_path_length(path: Path, what: str = "--out") -> None:
    """Refuse a path whose whole length or any one name exceeds what the file system allows (ENAMETOOLONG),
    leaving room for the suite's own names below it and its temporaries' prefix and suffix."""
    shown, where = path, Path(os.path.abspath(Path(path).expanduser()))
    anchor = next((q for q in (where, *where.parents) if os.path.lexists(q)), Path("/"))
    try:
        name_max, path_max = os.pathconf(anchor, "PC_NAME_MAX"), os.pathconf(anchor, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    # room for the suite's own names below it (temporaries, run and step folders)
    if len(os.fsencode(where)) + 128 > path_max:
        raise ScaleclError(f"{what} {str(shown)[:80]}...: the path is {len(os.fsencode(where))} bytes long; the file "
                           f"system allows {path_max} with the suite's own names below it (give a shorter path)")
    for i, part in enumerate(where.parts):
        room = 24 if i == len(where.parts) - 1 else 0  # the last name gets a temporary's prefix and suffix
        if len(os.fsencode(part)) + room > name_max:
            raise ScaleclError(f"{what} {str(shown)[:80]}...: the name {part[:40]}... is {len(os.fsencode(part))} "
                               f"bytes; the file system allows {name_max - room} here")


def _try_write(folder: Path, what: str, shown: Any) -> None:
    """Create and remove one empty marked folder in `folder`; an OS error is the user's, as one line."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}probe-", dir=folder))
    except OSError as e:
        name = errno.errorcode.get(e.errno, str(e.errno)) if e.errno else "error"
        raise ScaleclError(f"{what} {shown} is not writable: creating an entry in {folder} failed "
                           f"({e.strerror or e}, {name})") from None
    try:
        tmp.rmdir()
    except OSError:
        pass


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
    return make_temporary(dest.parent, f"{TMP_PREFIX}{dest.name}-")


@contextlib.contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Fill a temporary sibling of `dest`; it replaces dest only when the block completes (else it is removed)."""
    tmp = _tmp_dir(dest)
    try:
        yield tmp
        unmark(tmp)
        _replace_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---------------------------------------------------------------------------------------------------------
# Ownership: what the suite may replace

_SAMPLED_ABOVE = 64 << 20  # larger files are fingerprinted from a sample (the head, the tail and 62 spans)
_SPAN = 64 << 10


def fingerprint(path: Path, size: int | None = None) -> str:
    """`size:hash` of a regular file's content (files over 64 MiB: a hash of its head, tail and 62 spans);
    with `size`, of the file's first `size` bytes (what it held before something was appended)."""
    size = os.lstat(path).st_size if size is None else size
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if size <= _SAMPLED_ABOVE:
            left = size
            while left > 0 and (block := f.read(min(1 << 20, left))):
                h.update(block)
                left -= len(block)
        else:
            for i in range(64):
                f.seek(min(size - _SPAN, i * (size - _SPAN) // 63))
                h.update(f.read(_SPAN))
    return f"{size}:{h.hexdigest()}"


def fingerprint_bytes(data: bytes) -> str:
    """The fingerprint a file holding exactly `data` has (scalecl.common.files.fingerprint)."""
    size, h = len(data), hashlib.blake2b(digest_size=16)
    if size <= _SAMPLED_ABOVE:
        h.update(data)
    else:
        for i in range(64):
            at = min(size - _SPAN, i * (size - _SPAN) // 63)
            h.update(data[at:at + _SPAN])
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


def digest(path: Path) -> str:
    """`size:hash` of a regular file's whole content: what verification on read compares (equal to its
    `fingerprint` for a file of up to 64 MiB, whose fingerprint already hashes all of it)."""
    size, h = os.lstat(path).st_size, hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return f"{size}:{h.hexdigest()}"


def large_digests(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """The whole-content digest of every file under `folder` over 64 MiB, whose fingerprint is only a sample:
    recorded beside the fingerprints so that reading verifies every byte."""
    out = {}
    for root, _dirs, names in os.walk(folder):
        for name in names:
            p = Path(root) / name
            rel = p.relative_to(folder).as_posix()
            if rel not in skip and not p.is_symlink() and p.is_file() and os.lstat(p).st_size > _SAMPLED_ABOVE:
                out[rel] = digest(p)
    return dict(sorted(out.items()))


# what the suite's readers read (weights, configs, states, encodings, corpora, tokenizers, remote code): a file so
# named in a recorded folder must be in the record, else it would be read unverified
READ_SUFFIXES = (".safetensors", ".json", ".jsonl", ".npy", ".py", ".model", ".txt")


def changed_file(folder: Path, written: dict[str, Any], digests: dict[str, Any] | None = None,
                 skip: tuple[str, ...] = ()) -> str | None:
    """The first file a record lists (relative path -> fingerprint; `digests`: whole-content digests of the
    large ones) that is no longer what was written, as `<path> <how>`, or a file a reader would read
    (READ_SUFFIXES) that the record does not list (`skip`: the record itself); None when every one matches. Other
    files are not looked at (a note the user put beside them is theirs)."""
    digests = digests or {}
    for root, _dirs, names in os.walk(folder):
        for name in sorted(names):
            p = Path(root) / name
            rel = p.relative_to(folder).as_posix()
            if p.suffix in READ_SUFFIXES and rel not in written and rel not in skip and name != TMP_MARK:
                return f"{p} is not in its record (a file added, or the record edited)"
    for rel in sorted(written):
        p, rec = Path(folder) / rel, written[rel]
        accepted = [rec] if isinstance(rec, str) else rec if isinstance(rec, list) else []
        if p.is_symlink() or not p.is_file():
            return f"{p} is missing" if not os.path.lexists(p) else f"{p} is not a regular file"
        try:
            size = os.lstat(p).st_size
            sizes = {a.split(":")[0] for a in accepted}
            if str(size) not in sizes:
                return f"{p} has {size:,} bytes, {' or '.join(f'{int(s):,}' for s in sorted(sizes) if s.isdigit())} " \
                       f"were written"
            full = digests.get(rel)
            if isinstance(full, str) and size > _SAMPLED_ABOVE:
                ok = digest(p) == full
            else:
                ok = fingerprint(p) in accepted
        except OSError as e:
            return f"{p} cannot be read ({e.strerror or e})"
        if not ok:
            return f"{p} differs from what was written (same size, other content)"
    return None


def is_owned(path: Path, recorded: Any) -> bool:
    """Whether `path` is a regular file (no link) whose fingerprint is the one a manifest recorded for it (or
    one of those it recorded: the old and the new content while a replacement is being renamed into place)."""
    p = Path(path)
    accepted = [recorded] if isinstance(recorded, str) else recorded if isinstance(recorded, list) else []
    if not accepted or p.is_symlink() or not p.is_file():
        return False
    try:
        return fingerprint(p) in accepted
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


def record_damage(folder: Path, name: str) -> str | None:
    """How `folder` differs from what its record `folder/name` lists (a JSON object whose `written` maps each file
    to its fingerprint, `digests` the whole content of the large ones: a cache entry's seal, a training
    checkpoint's manifest), or None when intact; an unreadable or empty record is damage too. The caller
    decides what a missing record means."""
    record = Path(folder) / name
    try:
        doc = json.loads(record.read_text()) if not record.is_symlink() else None
    except (OSError, ValueError):
        doc = None
    written = doc.get("written") if isinstance(doc, dict) else None
    if not isinstance(written, dict) or not written:
        return f"its record {record} is not one scalecl wrote"
    digests = doc.get("digests") if isinstance(doc.get("digests"), dict) else None
    return changed_file(folder, written, digests, skip=(name,))


# ---------------------------------------------------------------------------------------------------------
# Cache entries: sealed when written, verified when read

SEAL = "scalecl-cache.json"  # in every cache entry the suite fills: each file's fingerprint when it was complete


def seal(folder: Path) -> None:
    """Record every file of a complete cache entry (still in its temporary folder, before the rename)."""
    skip = (TMP_MARK, SEAL)
    write_json(Path(folder) / SEAL, {"written_by": "scalecl cache", "written": fingerprints(folder, skip=skip),
                                     "digests": large_digests(folder, skip=skip)})


def set_aside(folder: Path) -> Path:
    """Rename a damaged entry to a free `<name>.damaged-N` beside it (nothing is deleted); returns the new path."""
    folder = Path(folder)
    for n in range(1, 10_000):
        aside = folder.with_name(f"{folder.name}.damaged-{n}")
        if not os.path.lexists(aside):
            os.rename(folder, aside)
            return aside
    raise ScaleclError(f"{folder} is damaged and 9,999 earlier damaged copies lie beside it; clean them up")


def usable_entry(folder: Path, what: str, *, rebuild: bool, legacy_ok: bool = True,
                 say: Callable[[str], None] = print) -> bool:
    """Whether the cache entry `folder` can be read: its files are those its seal records (verify on read).

    Damaged (a file changed, truncated or gone, or an unreadable seal): with `rebuild` (the command's
    --force) the entry is set aside and False returned, so the caller builds it again; without, one error
    that says so. An entry an older scalecl wrote without a seal has nothing to verify against: it is used
    (`legacy_ok`) with only the caller's own checks of its content, as before (delete it to have it made again,
    sealed).
    """
    folder = Path(folder)
    s = folder / SEAL
    how = None
    if not os.path.lexists(s):
        if legacy_ok:
            say(f"{what} {folder} records no fingerprints (an older scalecl made it, or its {SEAL} was removed): "
                f"read without verification; delete it to have it made again, sealed")
            return True
        how = f"{s} is missing"
    else:
        how = record_damage(folder, SEAL)
    if how is None:
        return True
    if rebuild:
        aside = set_aside(folder)
        say(f"{what} {folder} is damaged ({how}); moved to {aside}, building it again")
        return False
    raise ScaleclError(f"{what} {folder} is damaged: {how}; --force moves it aside and builds it again")


def proves(folder: Path, writer: str, name: str) -> bool:
    """Whether `folder`'s manifest of `writer` records `name` unchanged (no manifest, or another writer's: no)."""
    try:
        return OwnedFiles(folder, writer).owns(name)
    except ScaleclError:
        return False


class OwnedFiles:
    """A folder the suite shares with the user (e.g. `plot --out`): a file is written there only when the name
    is free or the file is one this writer wrote before and nobody changed since (its manifest, a hidden JSON
    file in the folder, records each file's fingerprint). Anything else is one ScaleclError, nothing replaced."""

    def __init__(self, folder: Path, writer: str, deferred: bool = False) -> None:
        self.folder, self.writer = Path(folder), writer
        self.manifest = self.folder / f".scalecl-{writer.split()[-1]}-files.json"
        self.files: dict[str, str | list[str]] = self._read()
        self._running: dict[str, tuple[Any, int]] = {}  # name -> (hash of its content so far, its size)
        # deferred: write() only checks and holds the content; flush() checks every held name again, then
        # writes them all, so a refused name leaves nothing written (all or nothing for a batch of outputs)
        self.deferred = deferred
        self._held: dict[str, str | bytes] = {}

    def flush(self) -> list[Path]:
        """Write every held file (deferred mode), after checking all of them; returns their paths."""
        held, self._held, self.deferred = self._held, {}, False
        for name in held:
            self.check(name)
        return [self.write(name, data) for name, data in held.items()]

    def _read(self) -> dict[str, str | list[str]]:
        if not self.manifest.exists() and not self.manifest.is_symlink():
            return {}
        try:
            doc = json.loads(self.manifest.read_text()) if not self.manifest.is_symlink() else None
        except (OSError, ValueError):
            doc = None
        if not (isinstance(doc, dict) and doc.get("written_by") == self.writer and isinstance(doc.get("files"), dict)):
            raise ScaleclError(f"{self.manifest} is not the record of files {self.writer} wrote; not writing into "
                               f"{self.folder} (move it away or choose another folder)")
        return {k: v for k, v in doc["files"].items()
                if isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))}

    def owns(self, name: str, grown: bool = False) -> bool:
        """Whether `name` is a file this writer wrote and nobody changed since; `grown`: or that file with more
        appended (a log the writer appends to, whose record a killed process did not update)."""
        p, rec = self.folder / name, self.files.get(name)
        if is_owned(p, rec):
            return True
        if not grown or not isinstance(rec, str) or p.is_symlink() or not p.is_file():
            return False
        size = rec.split(":")[0]
        try:
            return size.isdigit() and os.lstat(p).st_size >= int(size) and fingerprint(p, int(size)) == rec
        except OSError:
            return False

    def check(self, name: str, grown: bool = False) -> Path:
        """The path to write `name` to, or one error when something there is not this writer's own file."""
        p = self.folder / name
        if (p.exists() or p.is_symlink()) and not self.owns(name, grown):
            raise ScaleclError(f"{p} exists and was not written by {self.writer} (or was changed since); "
                               f"not overwriting it: move it away or choose another folder")
        return p

    def write(self, name: str, data: str | bytes, grown: bool = False) -> Path:
        """Write `name` (checked first, `grown` as in owns); while it is renamed into place the manifest accepts
        the old and the new content, so a process killed at any moment leaves a file the manifest still proves."""
        p = self.check(name, grown)
        if self.deferred:
            self._held[name] = data
            return p
        new = fingerprint_bytes(data.encode() if isinstance(data, str) else data)
        old = self.files.get(name) if p.exists() else None
        olds = [old] if isinstance(old, str) else old if isinstance(old, list) else []
        if olds:  # replacing: accept both until the rename is done (a free name has nothing to protect)
            self.files[name] = [*olds, new]
            self._save()
        write_atomic(p, data)
        self._running.pop(name, None)
        self.files[name] = new
        self._save()
        return p

    def append(self, name: str, text: str) -> Path:
        """Append to `name`, a file this writer wrote (its record may lag by what a killed process appended), and
        record its new fingerprint from a running hash (no re-reading of a growing log)."""
        p, data = self.folder / name, text.encode()
        if not p.exists() and not p.is_symlink():
            self._running[name] = (hashlib.blake2b(digest_size=16), 0)
        elif name not in self._running or self._running[name][1] != os.lstat(p).st_size:  # else: as last appended
            self.check(name, grown=True)
            h = hashlib.blake2b(digest_size=16)
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            self._running[name] = (h, os.lstat(p).st_size)
        with open(p, "ab") as f:
            f.write(data)
        h, size = self._running[name]
        h.update(data)
        self._running[name] = (h, size + len(data))
        big = size + len(data) > _SAMPLED_ABOVE  # sampled fingerprints are cheap to take from the file
        self.files[name] = fingerprint(p) if big else f"{size + len(data)}:{h.copy().hexdigest()}"
        self._save()
        return p

    def record(self, name: str) -> Path:
        """Record the fingerprint of `name`, a file this writer has just written (or appended to)."""
        p = self.folder / name
        self.files[name] = fingerprint(p)
        self._save()
        return p

    def remove(self, name: str, grown: bool = False) -> None:
        """Delete `name` if it is this writer's own unchanged file (anything else there stays)."""
        p = self.folder / name
        if (p.exists() or p.is_symlink()) and self.owns(name, grown):
            p.unlink()
        self._running.pop(name, None)
        if self.files.pop(name, None) is not None:
            self._save()

    def prune(self, keep: set[str]) -> list[str]:
        """Remove this writer's own unchanged files that are not in `keep` (outputs of an earlier call that this
        one did not make again); a file changed since, or not this writer's, stays. Returns the names removed."""
        gone = [name for name in sorted(self.files) if name not in keep and self.owns(name)]
        for name in gone:
            self.remove(name)
        return gone

    def _save(self) -> None:
        write_json(self.manifest, {"written_by": self.writer, "files": dict(sorted(self.files.items()))})
