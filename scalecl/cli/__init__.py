"""The `scalecl` command line: parse, call one library function, print where results went.

One module per command group: models (upscale, prepare, merge, budgets), train (train-bio, train-cpt, study),
evaluate (eval-ppl, eval-harness) and plot; the options several commands share are declared once in options, the
one-line errors in errors. Nothing imported here loads torch or transformers, so `scalecl --help` and every
command's --help stay fast: each command imports what it runs inside its function.
"""

from __future__ import annotations

import os

import typer

from scalecl.cli import evaluate, models, plot, train
from scalecl.cli.errors import OneLineErrors, fold_help_cells

fold_help_cells()  # --help never cuts a word with "…"

app = typer.Typer(
    cls=OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="SCALE: width-upscaled continual learning of LLMs, with baselines, benchmarks and the paper's figures.",
)


@app.callback()
def _global_options(
    offline: bool = typer.Option(
        False, "--offline", help="Never contact the Hugging Face hub (the same as HF_HUB_OFFLINE=1): models, "
        "tokenizers, datasets and lm-eval's task data named by hub id load from the local cache or fail with one "
        "line. Without it an unreachable hub is noticed by one probe of at most 3 s and the command goes offline "
        "by itself.", show_default=False),
) -> None:
    if offline:
        from scalecl.common.hub import go_offline

        go_offline()  # before any command imports huggingface_hub, transformers or datasets


for group in (models, train, evaluate, plot):  # the order of `scalecl --help`: build, train, evaluate, draw
    app.add_typer(group.commands)  # no name: its commands join this group as they are


def main() -> None:
    from scalecl.compute.machine import tune_cpu_allocator

    tune_cpu_allocator()  # before any tensor exists; see its docstring (SCALECL_TUNE_MALLOC=0 turns it off)
    # transformers' per-load "Loading weights" bars would fill logs and stderr (where only an error line
    # belongs); read when transformers is imported, so set before. HF_HUB_DISABLE_PROGRESS_BARS=0 keeps them.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # datasets logs a damaged file at ERROR level ("Failed to load JSON ...") before raising; the suite turns
    # the exception into its one error line, so only CRITICAL records of datasets reach stderr
    os.environ.setdefault("DATASETS_VERBOSITY", "critical")
    app()
