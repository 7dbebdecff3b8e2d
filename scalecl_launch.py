"""Entry point of the `scalecl` command: CPU thread defaults first, then the CLI.

OpenMP reads OMP_WAIT_POLICY once, when torch loads it, and importing the `scalecl` package imports torch.
So this module lives outside the package and touches only the environment before handing over to
`scalecl.cli`. Any variable the user set wins; SCALECL_CPU_DEFAULTS=0 leaves the environment alone.
`python -m scalecl_launch ...` is the same as `scalecl ...`. `python -m scalecl.cli ...` (what torchrun
runs) imports torch first, so there only the runtime part applies (see scalecl.compute.machine.note_cpu_defaults).
Measurements behind the defaults: benchmarks/README.md, "CPU threads".
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

# OMP_WAIT_POLICY=PASSIVE: an idle OpenMP thread sleeps at once instead of spinning (libgomp spins ~3 ms
# first), so it does not take a core that another process, or the other rank of a run, needs.
DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
# a user setting any of these has chosen how OpenMP waits: leave it to them
_WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def cpu_thread_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ`: the defaults it does not already decide; none if opted out (or if
    SCALECL_CPU_DEFAULTS is not 0 or 1: the command then refuses it with one line when it starts)."""
    from scalecl.common.environment import env  # no torch (scalecl/__init__.py loads its names lazily)
    from scalecl.common.errors import ScaleclError

    try:
        if not env("SCALECL_CPU_DEFAULTS", environ):
            return {}
    except ScaleclError:
        return {}
    out = {}
    if not any(v in environ for v in _WAIT_VARS):
        out["OMP_WAIT_POLICY"] = DEFAULTS["OMP_WAIT_POLICY"]
    return out


def main() -> int | None:
    # too late once torch is loaded (e.g. this function called from a script that imported torch)
    applied = {} if "torch" in sys.modules else cpu_thread_defaults(os.environ)
    os.environ.update(applied)
    from scalecl.cli import main as cli_main
    from scalecl.compute.machine import note_cpu_defaults

    note_cpu_defaults(applied)
    return cli_main()


if __name__ == "__main__":
    sys.argv[0] = "scalecl"  # the name in usage lines
    sys.exit(main())
