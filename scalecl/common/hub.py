"""The Hugging Face hub: `--offline`, and one quick line instead of a minute of retries when it cannot be reached.

A model or tokenizer named by a hub id that is neither a local folder nor in the local cache makes
huggingface_hub retry every file five times with back-off: 35-53 s of warnings on a machine without network
before the error. Before such a load the suite checks once, in at most `PROBE_TIMEOUT` seconds, that the hub's
host answers; if it does not, the process goes offline (the cache still serves what it holds) and a miss is
one error line saying so. `scalecl --offline` (or HF_HUB_OFFLINE=1) skips the check: offline from the start.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
from urllib.parse import urlsplit

PROBE_TIMEOUT = 3.0  # seconds for name lookup + TCP connect; a reachable hub answers in well under one
_TRUE = ("1", "on", "yes", "true")
_STATE = {"unreachable": False}


def endpoint() -> str:
    """The hub's address (HF_ENDPOINT, as huggingface_hub reads it)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def is_offline() -> bool:
    """Whether hub access is off (`--offline`, HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def go_offline() -> None:
    """Turn hub access off for this process: the variables huggingface_hub, transformers and datasets read
    when imported, and huggingface_hub's flag if it is already imported."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[var] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    dconfig = sys.modules.get("datasets.config")  # datasets copies both flags when it is imported
    if dconfig is not None:
        for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
            if hasattr(dconfig, flag):
                setattr(dconfig, flag, True)


@functools.cache
def hub_reachable(timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the hub's host resolves and accepts a TCP connection within `timeout` seconds (checked once)."""
    parts = urlsplit(endpoint())
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    if not host:
        return False
    answer = {"ok": False}

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                answer["ok"] = True
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)  # a name lookup ignores socket timeouts: bound it here
    t.start()
    t.join(timeout)
    return answer["ok"]


def before_hub_load(name: str) -> None:
    """Call before loading `name` with transformers: nothing for a local path or when offline already; an
    unreachable hub turns this process offline, so a cached copy loads at once and a miss fails at once."""
    if os.path.exists(os.path.expanduser(name)) or is_offline():
        return
    if not hub_reachable():
        _STATE["unreachable"] = True
        go_offline()


def miss_reason(name: str) -> str | None:
    """Why `name` could not come from the hub, for the error line: offline mode or an unreachable hub (None when
    the hub was reachable, i.e. the name itself is wrong or the files are damaged)."""
    where = f"{name} is not a local folder and not in the local Hugging Face cache"
    if _STATE["unreachable"]:
        return f"{where}, and the hub ({endpoint()}) cannot be reached from this machine"
    if is_offline():
        return f"{where}, and hub access is off (--offline or HF_HUB_OFFLINE=1)"
    return None
