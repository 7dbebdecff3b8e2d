"""Crash points: kill -9 at a named moment, for the tests of what a killed run leaves behind."""

from __future__ import annotations

import os
import signal

from scalecl.common.environment import env


def crash_point(name: str) -> None:
    """SIGKILL this process the n-th time `name` is reached, when SCALECL_CRASH_AT=name[:n] asks for it.

    The windows where a kill is most dangerous (between writing a checkpoint's model and its state, between
    the final files) are too short to hit with a timer; tests name them instead. Unset, this is one dict
    lookup.
    """
    want = env("SCALECL_CRASH_AT")
    if not want:
        return
    target, _, nth = want.partition(":")
    if target != name:
        return
    _CRASH_HITS[name] = _CRASH_HITS.get(name, 0) + 1
    if _CRASH_HITS[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


_CRASH_HITS: dict[str, int] = {}
