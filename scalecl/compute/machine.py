"""The machine a run executes on: its device, CPU thread and allocator settings, and provenance records."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalecl.common.environment import APPLIED, env
from scalecl.common.errors import ScaleclError

if TYPE_CHECKING:  # torch loads on first use: the `scalecl` command's --help and tune_cpu_allocator need none
    import torch


# measured peaks have come within 15% of the memory estimate (docs/cpt.md: the paper's shapes on a CPU; an FFT
# estimated at 19.8 GiB reached 21.0 GiB before the kernel killed it with 20.6 GiB available): what the suite
# allocates is refused unless the estimate plus this margin fits
MEMORY_MARGIN = 1.15


# a container's memory limit and use: cgroup v2 (memory.max, memory.current, memory.stat's inactive_file), then v1
CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat",
                 "inactive_file"),
                ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                 "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file"))
_NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as a number near 2**63


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cgroup_room() -> int | None:
    """Bytes this process's cgroup (a container, a job's slice) still lets it use: its memory limit less what its
    processes use (page cache it can drop, inactive_file, not counted), or None when no limit is set. The kernel
    kills a process past the limit however much memory the machine has free."""
    for limit_file, usage_file, stat_file, inactive_key in CGROUP_FILES:
        limit = _read_int(limit_file)
        if limit is None:
            continue
        if limit >= _NO_LIMIT:
            return None
        used = _read_int(usage_file) or 0
        try:
            stat = dict(line.split()[:2] for line in Path(stat_file).read_text().splitlines() if line.strip())
            used -= min(int(stat.get(inactive_key, 0)), used)
        except (OSError, ValueError):
            pass
        return max(limit - used, 0)
    return None


def available_memory() -> int | None:
    """Bytes this process can use without swapping or being killed: the OS's MemAvailable, or less where a
    cgroup limit (cgroup_room) allows less; None when neither is known."""
    try:
        import psutil

        free = int(psutil.virtual_memory().available)
    except (ImportError, OSError):
        free = None
    room = cgroup_room()
    known = [x for x in (free, room) if x is not None]
    return min(known) if known else None


def provenance() -> dict[str, Any]:
    """Versions, machine and commit: enough to tell where a number came from."""
    import torch
    import transformers

    from scalecl.version import __version__

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
                    "scale_products": env("SCALECL_SCALE_PRODUCTS")},
    }


_ALLOCATOR = {"tuned": False}


def tune_cpu_allocator() -> bool:
    """Make glibc keep freed memory for reuse instead of handing it back to the OS after every step.

    A CPU training step frees and reallocates the same large activation buffers each time. With glibc's
    default thresholds some of them go back to the OS and come back as fresh pages, and the page faults can
    cost a tenth of a step (measured in benchmarks/README.md). Serving blocks up to 1 GiB from the heap and
    never trimming it removes that; the price is that the process keeps its peak memory until it exits.
    Done once per process by the `scalecl` command; set SCALECL_TUNE_MALLOC=0 to leave glibc alone. Not done in
    a process of several (torchrun's WORLD_SIZE > 1): there each process would keep the peak of every phase it
    passed (the full model before FSDP shards it, evaluation, the step), measured at 2x the memory of the untuned
    processes at Llama-3.2-1B's width (docs/cpt.md), and memory is what several processes on one machine lack.
    Returns whether the setting is in force (False off Linux/glibc).
    """
    try:
        wanted = env("SCALECL_TUNE_MALLOC")
    except ScaleclError:  # left alone: the command refuses the value with one line when it starts
        wanted = False
    several = os.environ.get("WORLD_SIZE", "1").strip() not in ("", "0", "1")
    if _ALLOCATOR["tuned"] or not wanted or several or not sys.platform.startswith("linux"):
        return _ALLOCATOR["tuned"]
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc: nothing to tune
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from <malloc.h>
    _ALLOCATOR["tuned"] = bool(mallopt(m_mmap_threshold, 1 << 30)) and bool(mallopt(m_trim_threshold, 2**31 - 1))
    return _ALLOCATOR["tuned"]


def allocator_tuned() -> bool:
    """Whether tune_cpu_allocator is in force in this process (freed memory stays in it: scalecl.experiments.budget)."""
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
            "thread_defaults_by_scalecl": APPLIED | _CPU_DEFAULTS}


def pick_device(name: str | None = None, local_rank: int | None = None) -> torch.device:
    """The device to run on (default: cuda if available); a device this machine lacks is one clear error.

    A CUDA device always comes back with its index, chosen here once: `cuda` (or the default) is this
    process's GPU, `cuda:{local_rank}` under torchrun (`local_rank`, else the LOCAL_RANK variable torchrun sets),
    else the current device (0 unless the caller changed it). What is downstream (torch.cuda.set_device,
    DistributedDataParallel's device_ids, torch._utils._get_device_index) refuses an index-less `cuda`.
    """
    import torch

    if name is not None and not name.strip():
        raise ScaleclError("--device is empty: use cpu, cuda or cuda:N (or leave it out for cuda when available)")
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ScaleclError(f"unknown device {name!r}: use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        return _cuda_device(name, dev, local_rank)
    if dev.type == "cpu":
        if dev.index not in (None, 0):  # torch accepts cpu:N and runs on the one CPU device anyway
            raise ScaleclError(f"--device {name}: there is one CPU device; use cpu")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ScaleclError(f"--device {name}: MPS is not available on this machine")
    else:
        raise ScaleclError(f"unsupported device {name!r}: use cpu, cuda or cuda:N")
    return dev


def _cuda_device(name: str, dev: torch.device, local_rank: int | None) -> torch.device:
    """`dev` (a CUDA device) with its index: as given, else this process's GPU (see pick_device)."""
    import torch

    if not torch.cuda.is_available():
        raise ScaleclError(f"--device {name}: CUDA is not available on this machine (torch {torch.__version__})")
    index = dev.index
    if index is None:
        if local_rank is None and os.environ.get("LOCAL_RANK", "").strip().isdigit():
            local_rank = int(os.environ["LOCAL_RANK"])
        index = local_rank if local_rank is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ScaleclError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)"
                           + (f", and this process's local rank is {index}" if dev.index is None else ""))
    return torch.device("cuda", index)


# ---------------------------------------------------------------------------------------------------------
# What the machine contributes to a run's numbers (docs/runs.md, "Reproducibility"): the device type and, on a
# CPU, torch's intra-op thread count. Part of every run name and stage cache key (scalecl.common.schema.numerics_key).


def run_numerics(compute: Any, device: torch.device, apply: bool = False) -> dict[str, Any]:
    """{"device": "cpu", "cpu_threads": n} or {"device": "cuda"}: what decides a run's float sums here.

    On a CPU, compute.threads > 0 is the thread count (set in this process when `apply`) and 0 torch's count
    in force (OMP_NUM_THREADS, else one per core). On a GPU the model's sums run there: the CPU count is
    neither set nor part of it.
    """
    import torch

    if device.type != "cpu":
        return {"device": device.type}
    threads = getattr(compute, "threads", 0)
    if apply and threads and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    bf16 = {"autocast": "bfloat16"} if getattr(compute, "cpu_bf16", False) else {}  # compute.cpu_bf16
    return {"device": "cpu", "cpu_threads": threads or torch.get_num_threads()} | bf16


def recorded_numerics(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The numerics a finished run or cached stage was made with, from its record: its own "numerics" (runs
    of this version), else its provenance (the device and torch's thread count, recorded by every run); None
    when the record cannot tell (a stage recorded on a machine with a GPU, which may have trained on either)."""
    if not isinstance(record, dict):
        return None
    for own in (record.get("numerics"), (record.get("run") or {}).get("numerics")):
        if isinstance(own, dict):
            return own
    prov = record.get("provenance") if isinstance(record.get("provenance"), dict) else {}
    machine = prov.get("machine") if isinstance(prov.get("machine"), dict) else {}
    device = prov.get("device")
    if device is None and machine.get("gpu") is None and "threads" in machine:
        device = "cpu"  # a stage's record: no device field, and no GPU on the machine
    if not isinstance(device, str):
        return None
    kind = device.split(":")[0]
    if kind != "cpu":
        return {"device": kind}
    threads = machine.get("threads")
    return {"device": "cpu", "cpu_threads": threads} if isinstance(threads, int) else None


def check_numerics(record: dict[str, Any] | None, ours: dict[str, Any], what: str, remedy: str) -> None:
    """One ScaleclError when `what` (a finished run, a cached stage, a checkpoint) was made with other numerics
    than this run's: its numbers are not the ones this run would compute. Records that cannot tell pass."""
    from scalecl.common.schema import numerics_tag

    theirs = recorded_numerics(record)
    if theirs is None or theirs == ours:
        return
    if theirs.get("scale_products") != ours.get("scale_products"):
        fix = f"SCALECL_SCALE_PRODUCTS={theirs.get('scale_products') or 'blocks'} uses it"
    elif theirs.get("device") == "cpu" == ours["device"] and theirs.get("autocast") != ours.get("autocast"):
        fix = f"--set compute.cpu_bf16={'true' if theirs.get('autocast') else 'false'} uses it"
    elif theirs.get("device") == "cpu" == ours["device"]:
        fix = f"--set compute.threads={theirs['cpu_threads']} uses it"
    else:
        fix = f"--device {theirs['device']} uses it"
    raise ScaleclError(f"{what} was made with {numerics_tag(theirs)}, this run computes with {numerics_tag(ours)} "
                       f"(other float sums, other numbers); {fix}, or {remedy}")
