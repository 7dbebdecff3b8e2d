"""One exception type for mistakes a user can make; the CLI turns it into one line and exit code 2."""


class ScaleclError(Exception):
    """Bad input caught before heavy work (sizes, names, paths)."""
