"""The `scalecl` command line: parse, call one library function, print where results went."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from .errors import ScaleclError

console = Console()
err_console = Console(stderr=True)


def print_error(message: str) -> None:
    """One `error:` line on stderr, whatever the message carries (newlines, rich markup)."""
    err_console.print(f"[red]error:[/red] {escape(' '.join(message.split()))}", highlight=False, soft_wrap=True)


class _OneLineErrors(TyperGroup):
    """Click's own usage errors (a bad option value, a missing option, an unknown command) as one `error:` line
    and exit code 2, like the suite's own errors, instead of a boxed usage message."""

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


app = typer.Typer(
    cls=_OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="SCALE: width-upscaled continual learning of LLMs, with baselines, benchmarks and the paper's figures.",
)


def user_errors(fn):
    """Turn a ScaleclError into one red line on stderr and its exit code (2: bad input, 1: the run failed)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ScaleclError as e:
            print_error(str(e))
            raise typer.Exit(e.exit_code) from None

    return wrapper


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _build_base(model: str | None, random_config: str | None, seed: int):
    """Resolve --model / --random-config into (config, loader) so sizes are checked before weights load."""
    from .models import arch_of, load_base_config, load_base_model, model_from_config, tiny_config

    if (model is None) == (random_config is None):
        raise ScaleclError("give exactly one of --model (hub id or directory) and --random-config")
    if model is not None:
        config = load_base_config(model)
        return config, lambda: load_base_model(model), model
    if Path(random_config).suffix == ".json":
        if not Path(random_config).is_file():
            raise ScaleclError(f"config file {random_config} does not exist")
        from transformers import AutoConfig

        try:
            spec = json.loads(Path(random_config).read_text())
            if not isinstance(spec, dict) or "model_type" not in spec:
                raise ValueError("no 'model_type'")
        except (OSError, ValueError) as e:
            raise ScaleclError(f"config file {random_config} is not a JSON transformers config ({e})") from None
        arch_of(type("C", (), {"model_type": spec["model_type"]}))  # unsupported families fail here, by name
        try:
            config = AutoConfig.for_model(**spec)
        except (TypeError, ValueError) as e:
            raise ScaleclError(f"config file {random_config}: {str(e).splitlines()[0]}") from None
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
    router: str = typer.Option(
        "logit", "--router", help="What Route's cosine compares: logit (paper Eq. 5, raw logits), centered (logits "
        "centred over the vocabulary) or prob (softmax probabilities).",
    ),
    embed_init: str = typer.Option(
        "zero", "--embed-init", help="New embedding columns: zero, or rnd (normal, std = the base's initializer_range; "
        "untied embeddings only, so the head's new columns still start at zero).",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for random-init bases and rnd initialisation."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing scalecl checkpoint at --out "
                                   "(never a folder holding anything else)."),
) -> None:
    """Widen a model with SCALE and write the checkpoint (safetensors + scalecl.json + remote code for transformers)."""
    import torch

    from .checkpoint import check_out_dir, save_model
    from .config import ScaleConfig
    from .methods import get_method
    from .summary import param_counts

    check_out_dir(out, overwrite)  # before anything else: a folder of the user's is never touched
    cfg = ScaleConfig(variant=variant, hidden_up=hidden_up, ffn_up=ffn_up, l_fp=l_fp, collab=_csv(collab),
                      init=_csv(init), tau=tau, router=router, embed_init=embed_init)  # names and ranges first
    method = get_method(f"scale-{cfg.variant}", **{k: v for k, v in cfg.to_dict().items() if k != "variant"})
    config, load, source = _build_base(model, random_config, seed)
    method.check(config)  # every size check before the weights load
    base = load()
    base_total, _ = param_counts(base)
    torch.manual_seed(seed)
    widened = method.apply(base)
    _print_params(method, source, base_total, widened)
    path = save_model(widened, out, method, base_model=source, overwrite=overwrite)
    console.print(f"wrote {path}")


def _print_params(method, source: str, base_total, model) -> None:
    """The per-module parameter table (base, added, trainable) and the method's one-line description."""
    from .summary import param_counts, param_rows

    total, train = param_counts(model)
    table = Table(title=f"{method.name} on {source}")
    for col in ("module", "base", "added", "trainable"):
        table.add_column(col, justify="left" if col == "module" else "right")
    for kind, b, a, t in param_rows(base_total, total, train):
        table.add_row(kind, f"{b:,}", f"{a:,}", f"{t:,}")
    console.print(table)
    console.print(method.describe(), highlight=False)


def _method_options(name: str, pairs: list[str]) -> dict:
    """Parse --set key=value pairs; options typed as tuples take comma lists (collab=attn,mlp)."""
    import dataclasses
    import typing

    from .config import parse_scalar
    from .methods import REGISTRY, get_method

    if name not in REGISTRY:
        get_method(name)  # raises the one-line unknown-method error
    hints = typing.get_type_hints(REGISTRY[name])
    known = {f.name for f in dataclasses.fields(REGISTRY[name])}
    opts = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key:
            raise ScaleclError(f"--set expects key=value, got {pair!r}")
        if key not in known:
            raise ScaleclError(f"method {name} has no option {key!r}; options: {', '.join(sorted(known)) or 'none'}")
        is_tuple = typing.get_origin(hints.get(key)) is tuple
        opts[key] = tuple(parse_scalar(v) for v in _csv(value)) if is_tuple or "," in value else parse_scalar(value)
    return opts


@app.command()
@user_errors
def prepare(
    method_name: str = typer.Option(..., "--method", help="fft | lora | freeze | llama-pro | scale-preserve | scale-adapt | scale-route."),
    out: Path = typer.Option(..., "--out", help="Directory to write the prepared checkpoint to."),
    model: str | None = typer.Option(None, "--model", help="Base model: a Hugging Face hub id or a local directory."),
    random_config: str | None = typer.Option(
        None, "--random-config",
        help="Instead of --model, a random-init base: 'gpt_neox' (alias 'pythia') or 'llama', or a config JSON path.",
    ),
    options: list[str] = typer.Option(
        [], "--set", help="Method option key=value, repeatable (e.g. rank=256, k=3, n=4, hidden_up=256, collab=attn,mlp)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for random-init bases and random initialisation."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing scalecl checkpoint at --out "
                                   "(never a folder holding anything else)."),
) -> None:
    """Apply any method to a base model and write the checkpoint ready to train (safetensors + scalecl.json)."""
    import torch

    from .checkpoint import check_out_dir, save_model
    from .methods import get_method
    from .summary import param_counts

    check_out_dir(out, overwrite)  # before anything else: a folder of the user's is never touched
    method = get_method(method_name, **_method_options(method_name, options))
    config, load, source = _build_base(model, random_config, seed)
    method.check(config)  # every size check before the weights load
    base = load()
    base_total, _ = param_counts(base)
    torch.manual_seed(seed)
    prepared = method.apply(base)
    _print_params(method, source, base_total, prepared)
    path = save_model(prepared, out, method, base_model=source, overwrite=overwrite)
    console.print(f"wrote {path}")


@app.command()
@user_errors
def merge(
    model: Path = typer.Option(..., "--model", help="A checkpoint folder written by scalecl."),
    out: Path = typer.Option(..., "--out", help="Folder to write the plain transformers model to."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing scalecl checkpoint at --out "
                                   "(never a folder holding anything else)."),
) -> None:
    """Export a checkpoint as a plain transformers model (no scalecl, peft or remote code needed to load it).

    LoRA: the adapters are merged into the base weights (peft's merge_and_unload). FFT, Freeze, LLaMA Pro and
    base checkpoints are already plain models and are copied. SCALE cannot be folded into the base's shape
    (split norms, new heads) and is refused: its checkpoint already loads with
    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True).
    """
    from .checkpoint import merge_model

    path = merge_model(model, out, overwrite=overwrite)
    console.print(f"wrote {path}")


@app.command()
@user_errors
def budgets() -> None:
    """Trainable parameters of every method at the paper's two settings (meta-device models, no weights)."""
    from .methods.budget import paper_budgets

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


@app.command("train-bio")
@user_errors
def train_bio(
    method: str = typer.Option(
        "scale-route", "--method",
        help="fft, lora, freeze, llama-pro, scale-preserve, scale-adapt, scale-route, or 'all' (every method on "
        "the same cached stages 1-2). Several can be given comma-separated.",
    ),
    preset: str = typer.Option(
        "cpu", "--preset",
        help="tiny (CI smoke, ~1 min), cpu (default: shows the phenomenon on a 2-core CPU in minutes), gpu "
        "(the paper's protocol on Pythia-160M sized for one H100: stages 1-2 and three methods in <= 25 min), "
        "paper (Pythia-160M architecture, the paper's people, steps and learning rates; GPU).",
    ),
    sets: list[str] = typer.Option(
        [], "--set", help="Override a preset value, e.g. --set stage1.steps=2000 --set methods.scale.hidden_up=64 "
        "--set lr_scale.scale-route=5 --set model.vocab=50304 (repeatable). Every key, type and range is checked "
        "before anything runs.",
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer",
        help="'local' (a word-level tokenizer trained on the generated corpus; the tiny and cpu presets' default), "
        "or a hub id or folder of a real tokenizer (the paper preset's default: EleutherAI/pythia-160m).",
    ),
    out: Path = typer.Option(Path("runs/bio"), "--out", help="Folder for run results (one subfolder per run: "
                             "metrics.jsonl, train_log.jsonl, result.json). The committed reference runs are in "
                             "results/bio."),
    cache: Path = typer.Option(Path("cache"), "--cache", help="Folder for cached data, tokenizer and stage 1-2 checkpoints."),
    checkpoints: Path = typer.Option(Path("checkpoints"), "--checkpoints",
                                     help="Folder for model checkpoints (<folder>/bio/<run>/step-N and final)."),
    force: bool = typer.Option(False, "--force", help="Rerun a method even if a finished run with the same config "
                               "exists (its own checkpoints are discarded)."),
    resume: bool = typer.Option(False, "--resume", help="Continue each unfinished run from its latest checkpoint "
                                "(see checkpoint.every). Stages 1-2 always resume their own checkpoints."),
    stop_after: int | None = typer.Option(
        None, "--stop-after", help="Stop stage 3 after this step with a checkpoint (e.g. to fit a job time limit); "
        "--resume continues."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)."),
    report_to: str = typer.Option(
        "none", "--report-to", help="Experiment trackers, comma-separated: none (default), tensorboard (events in "
        "<run>/tensorboard), wandb, mlflow, trackio (accelerate's integrations; install the package). Logged per "
        "step: loss, learning rate, gradient norm, tokens/s; per evaluation: every metric of metrics.jsonl."),
) -> None:
    """Biography continual-learning benchmark (paper Fig. 8): pre-train, Task 0 QA, then Task 1 QA per method."""
    from .bio import METHOD_ORDER, run_bio
    from .config import load_preset
    from .runlayer import check_report_to

    if stop_after is not None and stop_after < 1:
        raise ScaleclError(f"--stop-after must be a positive step, got {stop_after}")
    trackers = check_report_to(report_to)
    rc = load_preset("bio", preset, sets + ([f"tokenizer={tokenizer}"] if tokenizer else []))
    methods = list(METHOD_ORDER) if method == "all" else list(_csv(method))
    results = run_bio(rc, methods, out, cache, preset, force=force, device=device, checkpoints=checkpoints,
                      resume=resume, stop_after=stop_after, report_to=trackers)
    console.print(f"results in {out} ({len(results)} run(s)); metrics.jsonl + result.json per run; "
                  f"`scalecl plot --results {out}` draws them", highlight=False)


@app.command()
@user_errors
def plot(
    results: list[Path] = typer.Option(
        [], "--results", help="Results folder to read, searched recursively (repeatable). Default: runs (your runs) "
        "and results (the committed reference runs), those that exist; for the same preset and method the newest "
        "run is drawn."),
    out: Path = typer.Option(Path("runs/figures"), "--out", help="Folder for figures (PNG + PDF) and tables "
                             "(CSV/MD/TeX). The committed figures: --results results --out paper_figures."),
) -> None:
    """Rebuild the paper's figures and tables from results folders (nothing trains)."""
    from .report import plot_all
    from .runlayer import check_out_dir

    roots = results or [p for p in (Path("runs"), Path("results")) if p.is_dir()]
    if not roots:
        raise ScaleclError("no results folder: run an experiment first, or give --results FOLDER")
    for r in roots:
        if not r.is_dir():
            raise ScaleclError(f"results folder {r} does not exist")
    check_out_dir(out)
    written = plot_all(roots, out)
    if not written:
        raise ScaleclError(f"no finished runs (result.json) found under {', '.join(map(str, roots))}")
    for p in written:
        console.print(f"wrote {p}", highlight=False)


@app.command("eval-harness")
@user_errors
def eval_harness(
    model: Path = typer.Option(..., "--model", help="Checkpoint folder written by scalecl (any method) or a plain transformers folder."),
    tasks: str = typer.Option(
        "paper", "--tasks",
        help="Comma list: kobest (kobest_boolq, kobest_copa, kobest_hellaswag), english (arc_challenge, hellaswag, "
        "mmlu, truthfulqa_mc2, winogrande), paper (both), any lm-eval task/group/tag name, a folder of task YAMLs "
        "or a task YAML file.",
    ),
    num_fewshot: int = typer.Option(0, "--num-fewshot", help="Few-shot examples (the paper: 0)."),
    limit: int | None = typer.Option(None, "--limit", help="At most N examples per task (smoke runs only)."),
    batch_size: str = typer.Option("8", "--batch-size", help="Batch size: a positive integer, 'auto' or 'auto:N'."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)."),
    max_length: int | None = typer.Option(
        None, "--max-length", help="Context length given to lm-eval (default: the model's max positions, at most 2048)."
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Hub id or folder (default: the checkpoint's tokenizer files, else its recorded base model)."
    ),
    include_path: list[Path] = typer.Option(
        [], "--include-path", help="Extra folder of task YAMLs (repeatable); its tasks override built-in ones of the same name."
    ),
    metric: list[str] = typer.Option(
        [], "--metric", help="Override a task's reported metric, task=metric (e.g. kobest_boolq=f1); repeatable."
    ),
    dtype: str = typer.Option("float32", "--dtype", help="float32 | bfloat16 | float16."),
    bootstrap_iters: int = typer.Option(100000, "--bootstrap-iters", help="lm-eval bootstrap iterations for stderrs (0: none)."),
    out: Path = typer.Option(Path("results/harness"), "--out", help="Results folder (one subfolder per model and settings)."),
) -> None:
    """lm-evaluation-harness benchmarks (paper Table 2) on any checkpoint, with the paper's averages beside ours."""
    from .harness import format_rows, parse_metric_overrides, run_harness

    run = run_harness(
        model, tasks, tokenizer=tokenizer, include_paths=include_path, num_fewshot=num_fewshot, limit=limit,
        batch_size=batch_size, device=device, max_length=max_length, dtype=dtype, bootstrap_iters=bootstrap_iters,
        metric_overrides=parse_metric_overrides(metric), out=out,
    )
    table = Table(title=run.title, caption=run.caption)
    for col in ("task", "language", "metric", "score", "stderr", "n", "paper"):
        table.add_column(col, justify="left" if col in ("task", "language", "metric") else "right")
    for cells, is_avg in format_rows(run.rows):
        table.add_row(*cells, style="bold" if is_avg else None)
    console.print(table)
    console.print(f"wrote {run.out_dir} (lm_eval_results.json, scores.csv, scores.md, run.json)", soft_wrap=True)


@app.command("train-cpt")
@user_errors
def train_cpt(
    method: str = typer.Option(
        "scale-route", "--method",
        help="fft, lora, freeze, llama-pro, scale-preserve, scale-adapt, scale-route, or 'all' (every method from "
        "the same base). Several can be given comma-separated.",
    ),
    preset: str = typer.Option(
        "cpu", "--preset",
        help="tiny (CI smoke), cpu (default: offline bilingual stand-in, a small Llama pre-trained on its English "
        "domain, minutes on a CPU), gpu (the stand-in with a ~190M Llama, ~7 min on one H100), paper "
        "(Llama-3.2-1B on FineWeb2 kor_Hang, Table 1 learning rates; GPUs).",
    ),
    sets: list[str] = typer.Option(
        [], "--set", help="Override a preset value, e.g. --set train.steps=100 --set lr.fft=1e-4 "
        "--set data.path=./my_corpus --set methods.scale.hidden_up=64 (repeatable).",
    ),
    out: Path = typer.Option(Path("runs/cpt"), "--out", help="Folder for run results (metrics.jsonl, train_log.jsonl, "
                             "result.json per run). The committed reference runs are in results/cpt."),
    cache: Path = typer.Option(Path("cache"), "--cache", help="Folder for the stand-in corpus, tokenizer and pre-trained base."),
    checkpoints: Path = typer.Option(Path("checkpoints"), "--checkpoints",
                                     help="Folder for model checkpoints (<folder>/cpt/<run>/step-N and final)."),
    force: bool = typer.Option(False, "--force", help="Rerun a method even if a finished run with the same config "
                               "exists (its own checkpoints are discarded)."),
    resume: bool = typer.Option(False, "--resume", help="Continue each unfinished run from its latest checkpoint "
                                "(step 0 if none)."),
    stop_after: int | None = typer.Option(
        None, "--stop-after", help="Stop after this step with a checkpoint (e.g. to fit a job time limit); --resume continues."
    ),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:1 ... (default: cuda if available; "
                                      "under torchrun cuda:LOCAL_RANK)."),
    report_to: str = typer.Option(
        "none", "--report-to", help="Experiment trackers, comma-separated: none (default), tensorboard (events in "
        "<run>/tensorboard), wandb, mlflow, trackio (accelerate's integrations; install the package). Logged per "
        "step: loss, learning rate, gradient norm, tokens/s; per evaluation: every metric of metrics.jsonl."),
) -> None:
    """Continual pre-training on a new language per method: forgetting / learning perplexity (paper Fig. 4, 9)."""
    from .config import load_preset
    from .cpt import METHOD_ORDER, run_cpt
    from .runlayer import check_report_to

    trackers = check_report_to(report_to)
    rc = load_preset("cpt", preset, sets)
    methods = list(METHOD_ORDER) if method == "all" else list(_csv(method))
    if stop_after is not None and stop_after < 1:
        raise ScaleclError(f"--stop-after must be a positive step, got {stop_after}")
    results = run_cpt(rc, methods, out, cache, checkpoints, preset, force=force, resume=resume,
                      stop_after=stop_after, device=device, report_to=trackers)
    if results:
        console.print(f"results in {out} ({len(results)} run(s)); metrics.jsonl + result.json per run")


@app.command("eval-ppl")
@user_errors
def eval_ppl(
    model: str = typer.Option(..., "--model", help="A checkpoint directory written by scalecl (or a plain transformers one)."),
    dataset: str = typer.Option(
        ..., "--dataset", help="Hub id (HuggingFaceFW/fineweb-edu), local folder or file (.jsonl/.txt/.parquet/.csv), "
        "or builtin:en / builtin:ko (the offline stand-in)."
    ),
    name: str = typer.Option("", "--name", help="Dataset config name, e.g. sample-10BT or kor_Hang."),
    split: str = typer.Option("train", "--split", help="Dataset split."),
    text_column: str = typer.Option("text", "--text-column", help="Column holding the documents."),
    skip: int = typer.Option(0, "--skip", help="Documents skipped before the slice."),
    take: int = typer.Option(0, "--take", help="Documents in the slice (0 = all after --skip)."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Tokens per packed chunk (default: the model's positions, at most 2048)."),
    batch: int = typer.Option(8, "--batch", help="Chunks per forward."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="Tokenizer (default: the one saved with the model)."),
    out: Path | None = typer.Option(None, "--out", help="Also write the JSON record to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON record instead of the summary line."),
    cache: Path = typer.Option(Path("cache"), "--cache", help="Cache folder of the builtin stand-in corpus."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)."),
) -> None:
    """Token-weighted perplexity of a saved checkpoint on a dataset slice (JSON record + one line)."""
    from .config import CorpusConfig
    from .cpt import eval_ppl as run_eval
    from .runs import write_json

    if skip < 0 or take < 0 or batch < 1:
        raise ScaleclError("--skip and --take must be >= 0 and --batch >= 1")
    if out is not None:
        from .runlayer import check_out_dir

        if out.is_dir():
            raise ScaleclError(f"--out {out} is a folder; give a file name for the JSON record")
        check_out_dir(out.parent, "--out")
        if out.exists():  # replace only a record this command wrote
            try:
                ours = {"ppl", "model", "dataset"} <= set(json.loads(out.read_text()))
            except (OSError, ValueError, TypeError):
                ours = False
            if not ours:
                raise ScaleclError(f"--out {out} exists and is not a record written by eval-ppl; not overwriting it")
    spec = CorpusConfig(path=dataset, name=name, split=split, text_column=text_column, skip=skip, take=take)
    r = run_eval(model, spec, seq_len, batch, cache, tokenizer=tokenizer, device=device)
    if out is not None:
        write_json(out, r)
    if as_json:
        print(json.dumps(r, indent=2, default=str))
    else:
        console.print(f"[bold]ppl {r['ppl']:.4f}[/bold] (nll {r['nll']:.4f}) on {r['tokens']:,} tokens in "
                      f"{r['sequences']:,} sequences of {r['seq_len']:,} — {r['dataset']['resolved']}"
                      + (f" — wrote {out}" if out is not None else ""), highlight=False)


@app.command()
@user_errors
def study(
    name: str = typer.Argument(..., help="CPT: init (Fig. 5: W21,W22 init pairs, Preserve), l_fp (Fig. 6: Adapt), "
                               "collab (Fig. 7: attn vs mlp W12, Adapt at l_fp = L/2). Biography, SCALE-Route: tau "
                               "(router threshold), router (what it compares), vocab (embedding/head rows)."),
    preset: str = typer.Option("cpu", "--preset", help="A preset of the study's experiment: tiny, cpu or paper."),
    values: str | None = typer.Option(
        None, "--values", help="Values to sweep, ';'-separated (init: 'svd,zero;zero,rnd'; collab: 'attn;mlp'; tau: "
        "'-1;0.9'); an integer range 'a..b' also works (l_fp, vocab). Default: the study's set (l_fp: 0..L; tau: "
        "-1;0;0.5;0.9;0.99; router: logit;centered;prob; vocab: 0;50304). Every value is checked before the first run.",
    ),
    sets: list[str] = typer.Option([], "--set", help="Override a preset value for every run (repeatable)."),
    out: Path = typer.Option(Path("runs/studies"), "--out", help="Folder for the study's runs (<out>/<name>/...). "
                             "The committed reference studies are in results/studies."),
    cache: Path = typer.Option(Path("cache"), "--cache", help="Folder for cached corpora, stages and bases."),
    checkpoints: Path = typer.Option(Path("checkpoints"), "--checkpoints", help="Folder for the runs' models."),
    force: bool = typer.Option(False, "--force", help="Rerun values whose finished run exists."),
    resume: bool = typer.Option(False, "--resume", help="Continue unfinished runs from their latest checkpoint."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda ... (default: cuda if available)."),
    report_to: str = typer.Option(
        "none", "--report-to", help="Experiment trackers, comma-separated: none (default), tensorboard (events in "
        "<run>/tensorboard), wandb, mlflow, trackio (accelerate's integrations; install the package). Logged per "
        "step: loss, learning rate, gradient norm, tokens/s; per evaluation: every metric of metrics.jsonl."),
) -> None:
    """Run a study as a sweep of ordinary train-cpt or train-bio runs (then `scalecl plot`)."""
    from .runlayer import check_report_to
    from .study import run_study

    results = run_study(name, preset, values, sets, out, cache, checkpoints, force=force, device=device,
                        resume=resume, report_to=check_report_to(report_to))
    console.print(f"{len(results)} run(s) in {out / name}; `scalecl plot --results {out.parent}` draws the figure",
                  highlight=False)


def _planned(name: str, issue: str):
    def cmd() -> None:
        err_console.print(f"scalecl {name}: not yet implemented ({issue}).")
        raise typer.Exit(1)

    cmd.__doc__ = f"(planned) {issue}"
    return cmd


for _name, _issue in [
]:
    app.command(_name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})(
        _planned(_name, _issue)
    )


def main() -> None:
    from .runs import tune_cpu_allocator

    tune_cpu_allocator()  # before any tensor exists; see its docstring (SCALECL_TUNE_MALLOC=0 turns it off)
    app()


if __name__ == "__main__":
    sys.exit(main())
