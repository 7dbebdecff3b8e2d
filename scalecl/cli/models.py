"""Commands that build or inspect a model: upscale, prepare, merge, budgets."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from scalecl.cli.errors import console, user_errors
from scalecl.cli.options import METHOD_NAMES, BaseModel, GgufCache, Overwrite, RandomConfig, Seed
from scalecl.common.errors import ScaleclError
from scalecl.common.schema import Raw
from scalecl.modeling.scale_spec import ScaleSpec, option_help  # no torch: --help must stay fast

commands = typer.Typer()


def _csv(value: str) -> tuple[str, ...]:
    from scalecl.common.schema import split_items

    return tuple(split_items(value, "a comma list"))


@commands.command()
@user_errors
def upscale(
    out: Path = typer.Option(..., "--out", help="Directory to write the upscaled checkpoint to."),
    model: BaseModel = None,
    random_config: RandomConfig = None,
    # SCALE's options: defaults and help declared once, on modeling's ScaleSpec (ScaleConfig inherits them)
    variant: str = typer.Option(ScaleSpec.variant, "--variant", help=option_help("variant")),
    hidden_up: int = typer.Option(ScaleSpec.hidden_up, "--hidden-up", help=option_help("hidden_up")),
    ffn_up: int = typer.Option(ScaleSpec.ffn_up, "--ffn-up", help=option_help("ffn_up")),
    l_fp: int | None = typer.Option(ScaleSpec.l_fp, "--l-fp", help=option_help("l_fp")),
    collab: str = typer.Option(",".join(ScaleSpec.collab), "--collab", help=option_help("collab")),
    init: str = typer.Option(",".join(ScaleSpec.init), "--init", help=option_help("init")),
    tau: float = typer.Option(ScaleSpec.tau, "--tau", help=option_help("tau")),
    router: str = typer.Option(ScaleSpec.router, "--router", help=option_help("router")),
    embed_init: str = typer.Option(ScaleSpec.embed_init, "--embed-init", help=option_help("embed_init")),
    seed: Seed = 0,
    cache: GgufCache = Path("cache"),
    overwrite: Overwrite = False,
) -> None:
    """Widen a model with SCALE and write the checkpoint (safetensors + scalecl.json + remote code for transformers).

    The same as `scalecl prepare --method scale-<variant>`, with SCALE's options as flags.
    """
    from scalecl.methods.scale import ScaleMethod
    from scalecl.methods.scale.config import ScaleConfig

    cfg = ScaleConfig(variant=variant, hidden_up=hidden_up, ffn_up=ffn_up, l_fp=l_fp, collab=_csv(collab),
                      init=_csv(init), tau=tau, router=router, embed_init=embed_init)  # names and ranges first
    options = {k: v for k, v in cfg.to_dict().items() if k != "variant"}
    _prepare(ScaleMethod.for_variant(cfg.variant).name, options, out, model, random_config, seed, overwrite, cache)


def _prepare(method_name: str, options: dict, out: Path, model: str | None, random_config: str | None,
             seed: int, overwrite: bool, cache: Path) -> None:
    """`upscale` and `prepare`: build the method, write the checkpoint, print its parameter table and path."""
    from scalecl.common.schema import check_seed
    from scalecl.methods import get_method

    check_seed(seed)  # 0..2**32 - 1, before anything is loaded
    method = get_method(method_name, **options)
    _check_base_args(model, random_config)  # what needs no torch first: a mistake is one line within a second
    from scalecl.experiments.sources import ModelSource
    from scalecl.training.checkpoint import check_checkpoint_dest
    from scalecl.training.prepare import prepare_checkpoint

    check_checkpoint_dest(out, overwrite)  # before anything is written or read: a folder of the user's is never touched
    if model is not None:  # a .gguf file or a packaged model: its dequantized transformers folder
        model = ModelSource.parse(model, "--model").loadable(cache)
    done = prepare_checkpoint(method, out, model, random_config, seed=seed, overwrite=overwrite)
    _print_params(method, done.source, done.base_total, done.model)
    console.print(f"wrote {done.path}")


def _check_base_args(model: str | None, random_config: str | None) -> None:
    """--model / --random-config as far as their text and the files they name tell (no torch loaded): exactly one
    of them, and no local path that does not exist."""
    from scalecl.common.sources import check_model_ref

    if (model is None) == (random_config is None):
        raise ScaleclError("give exactly one of --model (hub id or directory) and --random-config")
    if model is not None:
        check_model_ref(model)
    elif Path(random_config).suffix == ".json" and not Path(random_config).is_file():
        raise ScaleclError(f"config file {random_config} does not exist")


def _print_params(method, source: str, base_total, model) -> None:
    """The per-module parameter table (base, added, trainable) and the method's one-line description."""
    from scalecl.models.summary import param_counts, param_rows

    total, train = param_counts(model)
    table = Table(title=f"{method.name} on {source}")
    for col in ("module", "base", "added", "trainable"):
        table.add_column(col, justify="left" if col == "module" else "right")
    for kind, b, a, t in param_rows(base_total, total, train):
        table.add_row(kind, f"{b:,}", f"{a:,}", f"{t:,}")
    console.print(table)
    console.print(method.describe(), highlight=False)


def _option_texts(pairs: list[str]) -> dict[str, Raw]:
    """--set key=value pairs as {key: text}; the method types them (Method.coerce_options: tuples take comma
    lists, collab=attn,mlp)."""
    opts = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key:
            raise ScaleclError(f"--set expects key=value, got {pair!r}")
        opts[key] = Raw(value.strip())
    return opts


@commands.command()
@user_errors
def prepare(
    method_name: str = typer.Option(..., "--method", help=" | ".join(METHOD_NAMES) + "."),
    out: Path = typer.Option(..., "--out", help="Directory to write the prepared checkpoint to."),
    model: BaseModel = None,
    random_config: RandomConfig = None,
    options: list[str] = typer.Option(
        [], "--set", help="Method option key=value, repeatable (e.g. rank=256, k=3, n=4, hidden_up=256, collab=attn,mlp)."
    ),
    seed: Seed = 0,
    cache: GgufCache = Path("cache"),
    overwrite: Overwrite = False,
) -> None:
    """Apply any method to a base model and write the checkpoint ready to train (safetensors + scalecl.json)."""
    from scalecl.methods import REGISTRY, get_method

    if method_name not in REGISTRY:
        get_method(method_name)  # the one-line unknown-method error, before the options are read
    _prepare(method_name, _option_texts(options), out, model, random_config, seed, overwrite, cache)


@commands.command()
@user_errors
def merge(
    model: Path = typer.Option(..., "--model", help="A checkpoint folder written by scalecl."),
    out: Path = typer.Option(..., "--out", help="Folder to write the merged checkpoint to."),
    base: str | None = typer.Option(
        None, "--base", help="Only for a delta checkpoint: its base (folder or hub id), when not where the "
        "checkpoint records it. A base whose weights differ from the recorded digest is refused."),
    overwrite: Overwrite = False,
) -> None:
    """Write a checkpoint as one that needs nothing else to load.

    LoRA: the adapters are merged into the base weights (peft's merge_and_unload): a plain transformers model.
    FFT, Freeze, LLaMA Pro and base checkpoints are already plain models and are copied. A delta checkpoint
    (only what trained) is merged with its base into the full checkpoint of its method: plain for Freeze and
    LLaMA Pro, SCALE's own (weights + remote code) for SCALE. A full SCALE checkpoint cannot be folded into the
    base's shape (split norms, new heads) and is refused: it already loads with
    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True).
    """
    if not model.is_dir():  # before torch loads, as merge_model says it
        raise ScaleclError(f"model path {model} does not exist or is not a directory")
    if base is not None:
        from scalecl.common.sources import check_model_ref

        check_model_ref(base, "base model path")
    from scalecl.training.prepare import merge_model

    path = merge_model(model, out, base=base, overwrite=overwrite)
    console.print(f"wrote {path}")


@commands.command()
@user_errors
def budgets() -> None:
    """Trainable parameters of every method at the paper's two settings, and the supported decoder families: their
    widening constraints and budgets in a paper-like setting (meta-device models, no weights)."""
    from scalecl.experiments.budget import family_budgets, paper_budgets

    rows = paper_budgets()
    for setting in dict.fromkeys(r.setting for r in rows):  # one table per setting, in order
        vocab = next(r.vocab for r in rows if r.setting == setting)
        table = Table(title=f"trainable parameters: {setting} (embedding and head: {vocab:,} rows)")
        table.add_column("method (options)", overflow="fold")
        for col in ("trainable", "total", "%"):
            table.add_column(col, justify="right", no_wrap=True)
        for r in (r for r in rows if r.setting == setting):
            opts = ", ".join(f"{k}={v}" for k, v in r.options.items())
            label = f"{r.method} ({opts})" if opts else r.method
            table.add_row(label, f"{r.trainable:,}", f"{r.total:,}", f"{100 * r.trainable / r.total:.2f}")
        console.print(table)
    families = family_budgets()
    if not families:
        return
    table = Table(title="supported families: widening constraints (hidden_up: a multiple of head_dim x GQA group "
                  "that transformers' config accepts)")
    for col in ("family", "model", "d", "heads q/kv", "head_dim", "unit", "hidden_up >= d/8", "what widening keeps"):
        table.add_column(col, overflow="fold")
    for f in families:
        table.add_row(f.family, f.model, f"{f.hidden:,}", f"{f.heads}/{f.kv_heads}", str(f.head_dim), str(f.unit),
                      str(f.hidden_up), f.note)
    console.print(table)
    methods = [b.method for b in families[0].budgets if b.method != "fft"]
    table = Table(title="trainable parameters (% of the model's total), paper-like setting per family: SCALE "
                  "+hidden_up above / +ffn/8, l_fp=3; LoRA r=256 or less; Freeze k=3; LLaMA Pro n nearest L/4")
    for col in ("model", "base", *methods, "options"):
        table.add_column(col, justify="left" if col in ("model", "options") else "right", overflow="fold")
    for f in families:
        by = {b.method: b for b in f.budgets}
        opts = (f"r={by['lora'].options['rank']}, n={by['llama-pro'].options['n']}, "
                f"ffn_up={by['scale-preserve'].options['ffn_up']}")
        table.add_row(f.model, f"{by['fft'].total:,}",
                      *(f"{by[m].trainable:,} ({100 * by[m].trainable / by[m].total:.1f}%)" for m in methods), opts)
    console.print(table)
