"""The Hugging Face hub: `--offline`, and one quick line instead of a minute of retries when it cannot be reached.

A model, tokenizer or dataset named by a hub id that is neither local nor in the local cache makes huggingface_hub
retry every file five times with back-off: 23-53 s of warnings on a machine without network before the error
(lm-eval's task data and `evaluate`'s metric scripts the same). Before such a load the suite checks once, in at
most `PROBE_TIMEOUT` seconds, that the hub's host answers; if it does not, the process goes offline (the cache
still serves what it holds) and a miss is one error line saying so. `scalecl --offline` (or HF_HUB_OFFLINE=1)
skips the check: offline from the start. While libraries look into their caches, `quiet_libraries` keeps their
log lines off stderr, so that a miss is the one line.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import sys
import threading
from collections.abc import Iterator
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
    """Turn hub access off for this process: the variables huggingface_hub, transformers, datasets and evaluate
    (lm-eval's metrics) read when imported, and their flags if they are already imported."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_EVALUATE_OFFLINE"):
        os.environ[var] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    for module, flags in (("datasets.config", ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")),  # copied on import
                          ("evaluate.config", ("HF_EVALUATE_OFFLINE",))):
        config = sys.modules.get(module)
        for flag in flags if config is not None else ():
            if hasattr(config, flag):
                setattr(config, flag, True)


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


def hub_off(name: str) -> bool:
    """before_hub_load(`name`), then whether this process can use the hub no more: offline (--offline,
    HF_HUB_OFFLINE) or its host unreachable, so that only the local cache can serve `name`."""
    before_hub_load(name)
    return _STATE["unreachable"] or is_offline()


# the libraries whose log lines about the hub and their caches the suite keeps off stderr while it looks
LIBRARY_LOGGERS = ("huggingface_hub", "datasets", "transformers", "evaluate", "lm_eval", "httpx", "urllib3")


@contextlib.contextmanager
def quiet_libraries(names: tuple[str, ...] = LIBRARY_LOGGERS) -> Iterator[list[logging.LogRecord]]:
    """Keep the log records of these libraries' loggers (warnings and worse) while the block runs instead of
    printing them. A block that ends in a ScaleclError drops them: its one error line says what went wrong.
    Otherwise each message is passed on once, when the block ends, to the handlers the logger had."""
    from scalecl.common.errors import ScaleclError

    kept: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record)

    keep, saved = Keep(logging.WARNING), []
    for name in names:
        log = logging.getLogger(name)
        saved.append((log, log.handlers[:], log.propagate))
        log.handlers, log.propagate = [keep], False
    dropped = False
    try:
        yield kept
    except ScaleclError:
        dropped = True
        raise
    finally:
        for log, handlers, propagate in saved:
            log.handlers, log.propagate = handlers, propagate
        seen: set[str] = set()
        for record in [] if dropped else kept:
            if record.getMessage() not in seen:
                seen.add(record.getMessage())
                logging.getLogger(record.name).handle(record)


def miss_reason(name: str) -> str | None:
    """Why `name` could not come from the hub, for the error line: offline mode or an unreachable hub (None when
    the hub was reachable, i.e. the name itself is wrong or the files are damaged)."""
    where = f"{name} is not a local folder and not in the local Hugging Face cache"
    if _STATE["unreachable"]:
        return f"{where}, and the hub ({endpoint()}) cannot be reached from this machine"
    if is_offline():
        return f"{where}, and hub access is off (--offline or HF_HUB_OFFLINE=1)"
    return None
