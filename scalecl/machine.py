"""The machine a run executes on: its device, CPU thread and allocator settings, and provenance records."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch


def provenance() -> dict[str, Any]:
    """Versions, machine and commit: enough to tell where a number came from."""
    import transformers

    from .version import __version__

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "scalecl": __version__, "commit": commit, "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                    "gpu": gpu, "malloc_tuned": _ALLOCATOR["tuned"], **cpu_thread_settings(),
                    # SCALE's forward products: blocks (default) or concat (scalecl.modeling.scale_layers)
                    "scale_products": os.environ.get("SCALECL_SCALE_PRODUCTS", "blocks")},
    }


_ALLOCATOR = {"tuned": False}


def tune_cpu_allocator() -> bool:
    """Make glibc keep freed memory for reuse instead of handing it back to the OS after every step.

    A CPU training step frees and reallocates the same large activation buffers each time. With glibc's
    default thresholds some of them go back to the OS and come back as fresh pages, and the page faults can
    cost a tenth of a step (measured in benchmarks/README.md). Serving blocks up to 1 GiB from the heap and
    never trimming it removes that; the price is that the process keeps its peak memory until it exits.
    Done once per process by the `scalecl` command; set SCALECL_TUNE_MALLOC=0 to leave glibc alone.
    Returns whether the setting is in force (False off Linux/glibc).
    """
    if _ALLOCATOR["tuned"] or os.environ.get("SCALECL_TUNE_MALLOC", "1") == "0" or not sys.platform.startswith("linux"):
        return _ALLOCATOR["tuned"]
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc: nothing to tune
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from <malloc.h>
    _ALLOCATOR["tuned"] = bool(mallopt(m_mmap_threshold, 1 << 30)) and bool(mallopt(m_trim_threshold, 2**31 - 1))
    return _ALLOCATOR["tuned"]


# CPU thread defaults that the `scalecl` command put in the environment before torch loaded (the entry
# module scalecl_launch sets them: OpenMP reads them only then); recorded in provenance()["machine"].
_CPU_DEFAULTS: dict[str, str] = {}


def note_cpu_defaults(applied: dict[str, str]) -> None:
    """Record the variables the entry module set (called by scalecl_launch.main)."""
    _CPU_DEFAULTS.update(applied)


def cpu_thread_settings() -> dict[str, Any]:
    """The OpenMP variables (None: unset) and which of them scalecl set by default rather than the user.
    They take effect when torch loads, so a value changed later in the process is not the one in force."""
    return {"omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "thread_defaults_by_scalecl": dict(_CPU_DEFAULTS)}


def pick_device(name: str | None = None) -> torch.device:
    """The device to run on (default: cuda if available); a device this machine lacks is one clear error."""
    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from .errors import ScaleclError

    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ScaleclError(f"unknown device {name!r}: use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ScaleclError(f"--device {name}: CUDA is not available on this machine (torch {torch.__version__})")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ScaleclError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type not in ("cpu", "mps"):
        raise ScaleclError(f"unsupported device {name!r}: use cpu, cuda or cuda:N")
    return dev
