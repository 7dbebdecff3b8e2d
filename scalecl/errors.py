"""Errors the CLI turns into one `error:` line (no traceback) and a non-zero exit code."""


class ScaleclError(Exception):
    """Bad input caught before heavy work (sizes, names, paths): exit code 2."""

    exit_code = 2


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
