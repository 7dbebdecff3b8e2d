"""Entry point of the `scalecl` command: CPU thread defaults first, then the CLI.

OpenMP reads OMP_WAIT_POLICY once, when torch loads it, and importing the `scalecl` package imports torch.
So this module lives outside the package and touches only the environment before handing over to
`scalecl.cli`. Any variable the user set wins; SCALECL_CPU_DEFAULTS=0 leaves the environment alone.
`python -m scalecl_launch ...` is the same as `scalecl ...`. `python -m scalecl.cli ...` (what torchrun
runs) and any script get the same defaults from `import scalecl`, which sets them before torch loads.
Measurements behind the defaults: benchmarks/README.md, "CPU threads".
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping


def cpu_thread_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ` (scalecl.common.environment.cpu_thread_defaults: importing it loads no
    torch; importing the package applies them itself when torch is not loaded yet)."""
    from scalecl.common.environment import cpu_thread_defaults as defaults

    return defaults(environ)


def main() -> int | None:
    # too late once torch is loaded (e.g. this function called from a script that imported torch); importing the
    # package (first, below, when this module has not yet) sets them itself and records them
    applied = {} if "torch" in sys.modules else cpu_thread_defaults(os.environ)
    os.environ.update(applied)
    from scalecl.cli import main as cli_main
    from scalecl.compute.machine import note_cpu_defaults

    note_cpu_defaults(applied)
    return cli_main()


if __name__ == "__main__":
    sys.argv[0] = "scalecl"  # the name in usage lines
    sys.exit(main())
