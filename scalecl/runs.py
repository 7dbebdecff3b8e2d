"""Run bookkeeping shared by experiments: config hashes, atomic files, provenance."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import tempfile
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch


def config_hash(*parts: Any, n: int = 10) -> str:
    """Stable short hash of JSON-able parts (dataclasses are converted)."""
    blob = json.dumps([asdict(p) if is_dataclass(p) else p for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


def write_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same folder and rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, default=str) + "\n")


def provenance() -> dict[str, Any]:
    """Versions, machine and commit: enough to tell where a number came from."""
    import transformers

    from . import __version__

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
                    "gpu": gpu},
    }


def pick_device(name: str | None = None) -> torch.device:
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
