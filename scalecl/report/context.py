"""What one plot reads and writes, passed explicitly to every reader and output: the results folders, the
outputs folder with its writer, and the runs left out with why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scalecl.common.files import OwnedFiles

WRITER = "scalecl plot"  # the name plot's OwnedFiles records its outputs under


@dataclass
class Plot:
    """One plot: `roots` the results folders read, `out` the folder written, `files` its writer (plot_all's is
    deferred: nothing is written before every output was checked), `skipped` file -> why a run was left out,
    `unverified` whether results their run folder's manifest does not prove are drawn (marked so) instead,
    `formats` and `dpi` how figures are saved (None: draw.FIGURE_FORMATS, draw.FIGURE_DPI), `loaded` the runs
    and logs already read (scalecl.report.runs: a plot reads each results folder and each log once)."""

    roots: list[Path]
    out: Path | None = None
    files: OwnedFiles | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    unverified: bool = False
    formats: tuple[str, ...] | None = None
    dpi: int | None = None
    loaded: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, results: Path | str | Sequence[Path], out: Path | None = None, unverified: bool = False,
           formats: Sequence[str] | None = None, dpi: int | None = None) -> Plot:
        """A plot of one results folder or several; `out` where its outputs go (written at once)."""
        roots = [Path(results)] if isinstance(results, str | Path) else [Path(r) for r in results]
        return cls(roots, Path(out) if out is not None else None, unverified=unverified,
                   formats=tuple(formats) if formats is not None else None, dpi=dpi)

    def skip(self, path: Path, why: str) -> None:
        """Record a run left out (a file missing or malformed); the first reason for a file is kept."""
        self.skipped.setdefault(str(path), why)

    def writer(self) -> OwnedFiles:
        """The outputs folder's writer: plot replaces only files it wrote there itself."""
        if self.files is None:
            if self.out is None:
                raise ValueError("this plot has no output folder")
            self.files = OwnedFiles(self.out, WRITER)
        return self.files


@dataclass
class PlotResult:
    """What plot_all did: the files it wrote, its own earlier outputs it removed (not drawn from these
    results), and the runs it left out (file -> why)."""

    written: list[Path]
    removed: list[Path]
    skipped: dict[str, str]
