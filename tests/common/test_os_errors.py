"""Every OS error is one line naming the path, wherever it comes from: Python's own, a Rust library's message
("(os error 28)"), or the cause of another error. A file-size limit (`ulimit -f`) makes the writes fail for
real in a child process: one `error:` line, exit 1, no traceback, nothing recorded as finished."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from scalecl.cli.errors import os_error_line
from scalecl.common.files import os_error_code, os_errors_named


class SafetensorError(Exception):
    """What safetensors raises (its Rust core words the OS error in the message)."""


@pytest.mark.parametrize("error, line", [
    (OSError(errno.ENOSPC, "No space left on device", "/d/f"), "/d/f: No space left on device (ENOSPC)"),
    (OSError(errno.EFBIG, "File too large", "/d/f"), "/d/f: File too large (EFBIG)"),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "/d/f"), "/d/f: Disk quota exceeded (EDQUOT)"),
    (OSError(errno.EMFILE, "Too many open files"), "Too many open files (EMFILE)"),
    (SafetensorError("I/O error: No space left on device (os error 28)"), "No space left on device (ENOSPC)"),
    (SafetensorError("IoError(Os { code: 27, kind: FileTooLarge })"), "File too large (EFBIG)"),
    (Exception("tokenizers: Read-only file system (os error 30)"), "Read-only file system (EROFS)"),
])
def test_every_os_error_is_one_line(error, line):
    assert os_error_line(error).endswith(line)


def test_an_os_error_behind_another_error_and_one_named_by_its_writer():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/cache/x")
        except OSError as e:
            raise RuntimeError("saving failed") from e
    except RuntimeError as e:
        assert os_error_line(e) == "/cache/x: No space left on device (ENOSPC)"
    with pytest.raises(OSError) as e, os_errors_named(Path("/out/model")):
        raise SafetensorError("I/O error: File too large (os error 27)")
    assert os_error_line(e.value) == "/out/model: File too large (EFBIG)"
    assert os_error_code(ValueError("a bug, not the machine")) is None and os_error_line(KeyError("x")) is None


def _limited(kib: int, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`scalecl ARGS` in a child process that may write files of at most `kib` KiB (ulimit -f)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (kib * 1024, kib * 1024))

    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, "-m", "scalecl_launch", *args], cwd=cwd, env=env, preexec_fn=limit,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("kib, args, where", [
    (200, ["upscale", "--random-config", "llama", "--hidden-up", "32", "--ffn-up", "16", "--out", "u"], "u"),
    (1, ["train-cpt", "--preset", "tiny", "--method", "fft", "--out", "out", "--cache", "cache", "--checkpoints",
         "ck"], "cache/"),
])
def test_a_file_size_limit_is_one_line_and_records_nothing(tmp_path, kib, args, where):
    res = _limited(kib, args, tmp_path)
    errors = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 1 and len(errors) == 1, (res.returncode, res.stderr[-2000:])
    assert errors[0].startswith(f"error: {where}") and errors[0].endswith("File too large (EFBIG)"), errors
    assert "Traceback" not in res.stdout + res.stderr
    assert not (tmp_path / "u" / "scalecl.json").exists() and not list(tmp_path.glob("out/*/result.json"))
