"""Errors the CLI turns into one `error:` line (no traceback) and a non-zero exit code."""


class ScaleclError(Exception):
    """Bad input caught before heavy work (sizes, names, paths): exit code 2.

    The message speaks to a library caller (argument names: overwrite=True); `cli`, when given, is the same
    message for the `scalecl` command, naming its flags (--overwrite) instead.
    """

    exit_code = 2

    def __init__(self, message: str = "", *, cli: str | None = None) -> None:
        super().__init__(message)
        self.cli = cli

    def cli_message(self) -> str:
        """The line the `scalecl` command prints."""
        return self.cli if self.cli is not None else str(self)


class TrainingDiverged(ScaleclError):
    """A non-finite loss or gradient norm: the run stops, nothing is recorded as finished (exit code 1)."""

    exit_code = 1


class Busy(ScaleclError):
    """Another process holds the lock of the run or cache entry this one would write (exit code 1)."""

    exit_code = 1


class NotFinite(ScaleclError):
    """A result that is not a finite number (a perplexity of a model with NaN weights): nothing is written from
    it (exit code 1)."""

    exit_code = 1


class Interrupted(ScaleclError):
    """Ctrl-C (SIGINT) while a run trains: one line saying where it can continue from; exit code 130, the
    shell's code for a command stopped by SIGINT."""

    exit_code = 130


def cause(e: BaseException, limit: int = 200) -> str:
    """A library exception's message for one error line: its words on one line, shortened to about `limit`
    characters at a space, never inside a word; a URL is always kept whole ("..." marks a cut)."""
    words = str(e).split() or [type(e).__name__]
    kept: list[str] = []
    for w in words:
        if kept and len(" ".join(kept)) + 1 + len(w) > limit and "://" not in w:
            return " ".join(kept) + " ..."
        kept.append(w)
    return " ".join(kept)
