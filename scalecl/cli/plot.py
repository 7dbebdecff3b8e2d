"""The `plot` command: the paper's figures and tables from results folders (nothing trains)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from scalecl.cli.errors import console, err_console, user_errors
from scalecl.common.errors import ScaleclError

commands = typer.Typer()
SAVE_FORMATS = ("png", "pdf", "svg")  # what --formats accepts (scalecl.report.draw saves each; checked before it loads)


@commands.command()
@user_errors
def plot(
    results: list[Path] = typer.Option(
        [], "--results", help="Results folder to read, searched recursively (repeatable, in order). Default: results "
        "(the committed reference runs), then runs (your runs), those that exist. Runs from a folder after the first "
        "are marked '(yours)' in legends and tables, a setting of their own. Runs of one setting that differ only in "
        "their seeds are replicates: tables give their mean and 95% Student-t interval (paired_*.csv: per-base "
        "differences between methods), curves a band. Of runs with the same setting and seeds one is drawn, the "
        "first folder's (within a folder the newest), and each left out is one 'skipped:' line. Every figure and "
        "table lists the runs it used (<name>.inputs.txt)."),
    out_text: str = typer.Option("runs/figures", "--out", help="Folder for figures (PNG + PDF, see --formats) and tables "
                                 "(CSV/MD/TeX). The committed figures: --results results --out paper_figures. Only plot's own "
                                 "earlier outputs are replaced, and those these results no longer give are removed; "
                                 "any other file there is never touched."),
    unverified: bool = typer.Option(False, "--unverified", help="Also draw results their run folder's manifest "
                                    "(.scalecl-run-files.json) does not prove a run wrote unchanged (edited by hand, "
                                    "copied without it), each setting marked '(unverified)'. Without it they are "
                                    "skipped, as training does not count them as finished runs either."),
    formats_text: str | None = typer.Option(None, "--formats", help="Figure formats, comma-separated, of png, pdf "
                                            "and svg. Default: png,pdf (as paper_figures holds them). Earlier figures "
                                            "of a format left out are removed as outputs these results no longer give. "
                                            "--formats png --dpi 50 draws quickly (the tests do)."),
    dpi: int | None = typer.Option(None, "--dpi", min=10, max=1200, help="Resolution of the PNG figures, in dots "
                                   "per inch. Default: 150."),
) -> None:
    """Rebuild the paper's figures and tables from results folders (nothing trains)."""
    from scalecl.common.files import check_writable_dir

    out = Path(out_text)  # not empty: scalecl.cli.errors.refuse_empty
    formats = _formats(formats_text)

    roots = results or [p for p in (Path("results"), Path("runs")) if p.is_dir()]  # the committed runs first
    if not roots:
        raise ScaleclError("no results folder: run an experiment first, or give --results FOLDER")
    for r in roots:
        if not r.is_dir():
            raise ScaleclError(f"results folder {r} does not exist")
    check_writable_dir(out)
    # the report loads pandas, matplotlib and torch: after the checks
    from scalecl.experiments import EXPERIMENTS
    from scalecl.report import plot_all

    result = plot_all(roots, out, [spec.report_spec() for spec in EXPERIMENTS.values()], unverified=unverified,
                      formats=formats, dpi=dpi)
    if not result.written:
        skipped = "".join(f"; skipped {why}" for why in list(result.skipped.values())[:3])
        raise ScaleclError(f"no finished runs (result.json) found under {', '.join(map(str, roots))}{skipped}")
    for p in result.written:
        console.print(f"wrote {p}", highlight=False)
    for p in result.removed:  # a figure of an earlier plot that these results no longer give
        console.print(f"removed {p} (an earlier plot's output, not drawn from these results)", highlight=False)
    for why in result.skipped.values():  # one line per file a run was left out for (docs/figures.md: such runs are skipped)
        err_console.print(f"skipped: {escape(' '.join(why.split()))}", highlight=False, soft_wrap=True)


def _formats(text: str | None) -> tuple[str, ...] | None:
    """--formats as a tuple of known figure formats (None: the default)."""
    if text is None:
        return None
    formats = tuple(dict.fromkeys(f.strip().lower() for f in text.split(",") if f.strip()))
    wrong = [f for f in formats if f not in SAVE_FORMATS]
    if not formats or wrong:
        raise ScaleclError(f"--formats {text!r}: give one or more of {', '.join(SAVE_FORMATS)}, comma-separated")
    return formats
