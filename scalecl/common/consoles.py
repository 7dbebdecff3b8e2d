"""The suite's rich consoles: wrapped to the window on a terminal, never hard-wrapped in a log file or a pipe."""

from __future__ import annotations

import os

from rich.console import Console

# Where the output is not a terminal (nohup, a job log, CI, `| tee`), rich would wrap every line at 80 columns
# and split paths and error lines in two. There lines and tables keep their own width (up to this many
# columns), so a path, an error line or a table row can be found with grep and copied whole.
LOG_WIDTH = 1_000


def make_console(stderr: bool = False) -> Console:
    """A console for stdout (or stderr); off a terminal, lines are not wrapped unless COLUMNS says a width."""
    console = Console(stderr=stderr)
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console
    return Console(stderr=stderr, width=LOG_WIDTH, soft_wrap=True)
