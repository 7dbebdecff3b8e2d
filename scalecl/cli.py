"""The `scalecl` command line: parse, call one library function, print where results went."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from .errors import ScaleclError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="SCALE: width-upscaled continual learning of LLMs, with baselines, benchmarks and the paper's figures.",
)
console = Console()
err_console = Console(stderr=True)


def user_errors(fn):
    """Turn a ScaleclError into one red line on stderr and exit code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ScaleclError as e:
            err_console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _build_base(model: str | None, random_config: str | None, seed: int):
    """Resolve --model / --random-config into (config, loader) so sizes are checked before weights load."""
    from .models import load_base_config, load_base_model, model_from_config, tiny_config

    if (model is None) == (random_config is None):
        raise ScaleclError("give exactly one of --model (hub id or directory) and --random-config")
    if model is not None:
        config = load_base_config(model)
        return config, lambda: load_base_model(model), model
    if Path(random_config).suffix == ".json":
        if not Path(random_config).is_file():
            raise ScaleclError(f"config file {random_config} does not exist")
        from transformers import AutoConfig

        config = AutoConfig.for_model(**json.loads(Path(random_config).read_text()))
    else:
        config = tiny_config(random_config)
    return config, lambda: model_from_config(config, seed=seed), f"random:{random_config}"


@app.command()
@user_errors
def upscale(
    out: Path = typer.Option(..., "--out", help="Directory to write the upscaled checkpoint to."),
    model: str | None = typer.Option(None, "--model", help="Base model: a Hugging Face hub id or a local directory."),
    random_config: str | None = typer.Option(
        None, "--random-config",
        help="Instead of --model, a random-init base: 'gpt_neox' (alias 'pythia') or 'llama' for a tiny model, "
        "or a path to a transformers config JSON.",
    ),
    variant: str = typer.Option("route", "--variant", help="preserve | adapt | route (paper Eq. 3, 4, 5)."),
    hidden_up: int = typer.Option(128, "--hidden-up", help="Channels added to the residual stream and attention (multiple of head_dim)."),
    ffn_up: int = typer.Option(128, "--ffn-up", help="Intermediate units added to every MLP."),
    l_fp: int | None = typer.Option(
        None, "--l-fp", help="Lowest layers whose W12 stays frozen at zero (0..L). Default: L for preserve, L-1 otherwise."
    ),
    collab: str = typer.Option("attn,mlp", "--collab", help="Modules whose W12 trains in collaborative layers: attn, mlp or attn,mlp."),
    init: str = typer.Option("svd,zero", "--init", help="Initialisation of W21,W22: each zero, rnd or svd (paper Fig. 5)."),
    tau: float = typer.Option(0.9, "--tau", help="Route's cosine threshold in [-1, 1] (the paper gives no value)."),
    seed: int = typer.Option(0, "--seed", help="Seed for random-init bases and rnd initialisation."),
) -> None:
    """Widen a model with SCALE and write the checkpoint (safetensors + scalecl.json)."""
    import torch

    from .checkpoint import save_model
    from .methods import get_method
    from .summary import param_counts, param_rows

    method = get_method(
        f"scale-{variant}" if variant in ("preserve", "adapt", "route") else variant,
        hidden_up=hidden_up, ffn_up=ffn_up, l_fp=l_fp, collab=_csv(collab), init=_csv(init), tau=tau,
    )
    config, load, source = _build_base(model, random_config, seed)
    method.check(config)  # every size check before the weights load
    base = load()
    base_total, _ = param_counts(base)
    torch.manual_seed(seed)
    widened = method.apply(base)
    total, train = param_counts(widened)
    table = Table(title=f"{method.name} on {source}")
    for col in ("module", "base", "added", "trainable"):
        table.add_column(col, justify="left" if col == "module" else "right")
    for kind, b, a, t in param_rows(base_total, total, train):
        table.add_row(kind, f"{b:,}", f"{a:,}", f"{t:,}")
    console.print(table)
    console.print(method.describe(), highlight=False)
    path = save_model(widened, out, method, base_model=source)
    console.print(f"wrote {path}")


def _planned(name: str, issue: str):
    def cmd() -> None:
        err_console.print(f"scalecl {name}: not yet implemented ({issue}).")
        raise typer.Exit(1)

    cmd.__doc__ = f"(planned) {issue}"
    return cmd


for _name, _issue in [
    ("train-bio", "biography Task 0 / Task 1 benchmark"),
    ("train-cpt", "continual pre-training with perplexity tracking"),
    ("eval-ppl", "perplexity of a checkpoint on a dataset slice"),
    ("eval-harness", "lm-evaluation-harness benchmarks"),
    ("plot", "paper figures and tables from the results folder"),
]:
    app.command(_name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})(
        _planned(_name, _issue)
    )


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
