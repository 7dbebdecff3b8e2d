"""What the command line prints, and its errors as one line: a ScaleclError, a user's OS error (a read-only or
full disk, a missing permission, an impossible path) and click's own usage errors each become one red `error:`
line on stderr and an exit code, never a traceback or a boxed usage message."""

from __future__ import annotations

import errno
import functools
import os
import sys
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperGroup

from scalecl.common.consoles import make_console
from scalecl.common.environment import check_environment
from scalecl.common.errors import ScaleclError
from scalecl.common.files import os_error_code

console = make_console()  # off a terminal: lines and paths are not wrapped at 80 columns
err_console = make_console(stderr=True)


def print_error(message: str) -> None:
    """One `error:` line on stderr, whatever the message carries (newlines, rich markup)."""
    err_console.print(f"[red]error:[/red] {escape(' '.join(message.split()))}", highlight=False, soft_wrap=True)


def fold_help_cells() -> None:
    """Make `--help` wrap a word wider than its column onto the next line instead of cutting it with "…" (rich's
    default overflow for table cells, which typer's options panel keeps): e.g. a list of file types in 80
    columns. typer builds each option's help (its text, default and "required") in
    typer.rich_utils._get_parameter_help and its panels as typer.rich_utils.Table: both get rich's `fold`."""
    import typer.rich_utils as rich_utils
    from rich.table import Table

    parameter_help = rich_utils._get_parameter_help
    if getattr(parameter_help, "folds", False):
        return

    class FoldingTable(Table):  # the panel's own columns (option names, types) in a narrow terminal
        def add_row(self, *renderables: Any, **kwargs: Any) -> None:
            super().add_row(*renderables, **kwargs)
            for column in self.columns:
                column.overflow = "fold"

    def folding(*args: Any, **kwargs: Any) -> Any:
        cells = parameter_help(*args, **kwargs)  # rich Columns of Text (or Markdown)
        for item in getattr(cells, "renderables", ()):
            if hasattr(item, "overflow"):
                item.overflow = "fold"
        return cells

    folding.folds = True
    rich_utils._get_parameter_help, rich_utils.Table = folding, FoldingTable


class OneLineErrors(TyperGroup):
    """Click's own usage errors (a bad option value, a missing option, an unknown command) as one `error:` line
    and exit code 2, like the suite's own errors, instead of a boxed usage message."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in (self, *self.commands.values()):
            help_option = command.get_help_option(typer.Context(command))  # built once and kept by click
            for param in (*command.params, *([help_option] if help_option is not None else [])):
                if getattr(param, "is_flag", False) and param.metavar is None:
                    # typer's rich help gives a flag the type column of a value (`--force <bool>`): a flag
                    # takes none, so it shows no type (plain click help already leaves it out)
                    param.metavar = ""
                if not getattr(param, "is_flag", False) and not getattr(param, "refuses_empty", False):
                    refuse_empty(param)

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except typer.Abort:
            print_error("aborted")
            sys.exit(1)
        except typer.TyperException as e:  # click's errors, as typer vendors them
            if type(e).__name__ == "NoArgsIsHelpError" or not hasattr(e, "format_message"):
                e.show()  # `scalecl` alone: the help text
                sys.exit(getattr(e, "exit_code", 2))
            ctx = getattr(e, "ctx", None)
            hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
            print_error(f"{e.format_message()}{hint}")
            sys.exit(getattr(e, "exit_code", 2))
        sys.exit(rv if isinstance(rv, int) else 0)


class EmptyValue(typer.BadParameter):
    """An option or argument given as empty text: its message names it already ("--out is empty: ...")."""

    def format_message(self) -> str:
        return self.message


def refuse_empty(param: Any) -> None:
    """An empty value given to `param` (`--values ''`, `--out ''`, one empty `--set ''`) is a usage error, never
    "not given": left to the command it would mean the default (a whole sweep), or the current folder for a path
    (Path('') is '.'). Only a value the user gave is checked (a default of "" stays allowed); the check runs
    before the text is converted, where '' and '.' still differ."""
    process = param.process_value
    name = param.opts[0] if param.opts else param.name  # --out; an argument: its name
    leave_out = "" if param.required else ", or leave it out for its default"

    def process_value(ctx: typer.Context, value: Any) -> Any:
        source = getattr(ctx.get_parameter_source(param.name), "name", None)
        texts = value if isinstance(value, list | tuple) else (value,)
        if source in ("COMMANDLINE", "ENVIRONMENT") and any(isinstance(t, str) and not t.strip() for t in texts):
            raise EmptyValue(f"{name} is empty: give a value{leave_out}", ctx=ctx, param=param)
        return process(ctx, value)

    param.process_value = process_value
    param.refuses_empty = True


# An OS error under a command is the user's machine, not a bug: a full or read-only disk, a file-size or quota
# limit, no permission, a path that cannot be one, too many open files. Wherever it comes from (Python, or a
# library's Rust core that words it "(os error 28)"), it is one `error:` line naming the path and exit code 1.


def os_error_line(e: BaseException) -> str | None:
    """The one line for an OS error (also as safetensors or tokenizers report one, or as the cause of another
    error), or None for any other error."""
    code = os_error_code(e)
    if code is None:
        return None
    named = next((x for x in _chain(e) if isinstance(x, OSError) and x.errno == code and x.filename is not None), None)
    where = " -> ".join(str(f) for f in (named.filename, named.filename2) if f is not None) if named else ""
    name = errno.errorcode.get(code, str(code))
    strerror = named.strerror if named is not None and named.strerror else os.strerror(code)
    return f"{where + ': ' if where else 'reading or writing files failed: '}{strerror} ({name})"


def _chain(e: BaseException | None):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def user_errors(fn):
    """Check the SCALECL_* environment variables (scalecl.common.environment), then run the command; a
    ScaleclError is one red line on stderr and its exit code (2: bad input, 1: the run failed); a read-only or
    full disk, a missing permission or an impossible path (any OS error, os_error_line) is one line and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            check_environment()  # every command, before it reads or writes anything
            return fn(*args, **kwargs)
        except ScaleclError as e:
            print_error(e.cli_message())  # the flags' names, where the library's message names its arguments
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:  # Ctrl-C outside training (which says where its run continues from)
            print_error("interrupted; nothing was recorded as finished by the step that was running")
            raise typer.Exit(130) from None
        except Exception as e:
            line = os_error_line(e)
            if line is None:
                raise
            print_error(line)
            raise typer.Exit(1) from None

    return wrapper
