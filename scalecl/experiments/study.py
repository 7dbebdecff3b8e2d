"""Studies as one-command sweeps: each value is an ordinary `train-cpt` or `train-bio` run.

Continual pre-training (paper Sec. 3):
  init:   (W21, W22) initialisation pairs with SCALE-Preserve (Fig. 5)
  l_fp:   number of function-preserving lower layers with SCALE-Adapt (Fig. 6)
  collab: collaborative module, attention vs MLP, with SCALE-Adapt at l_fp = L/2 (Fig. 7)
Biography, SCALE-Route (what decides Route on this task), each on the cached stages 1-2:
  tau:    the router's threshold; -1 always takes the preserve/adapt average, 0.99 almost never
  router: what the router compares (raw logits as the paper, logits centred over the vocabulary, softmax
          probabilities)
  vocab:  rows of the embedding and head (0 = the tokenizer's; 50304 = Pythia's padded vocabulary); each
          value is its own stages 1-2

Every value's config is resolved and checked (keys, types, ranges, the method's sizes), then against its
prepared data (scalecl.experiments.sweep.check_ahead: the tokenizer's size, the memory estimate), before the
first run starts, so a bad value fails before the values before it trained. Runs are written under
`<out>/<study>/` and drawn by `scalecl plot`.

One copy of each run: a value whose run (same name: same config, seeds and method options) has finished
among the experiment's main runs, `<out>/../<experiment>/<name>` (e.g. the default Route run of
`results/bio` for `tau=0.5` in `results/studies/tau`), or in another study's folder (the raw-logit router
at 50,304 rows is the `vocab` study's run), is not trained again. The study writes
`<out>/<study>/<name>/reference.json` pointing at it, and `scalecl plot` reads the run through it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalecl.common.errors import ScaleclError
from scalecl.common.schema import int_span, show_text
from scalecl.experiments import load_preset
from scalecl.experiments.args import Paths, Replicate, SweepOptions
from scalecl.training.record import REFERENCE_WRITER

# the study's name, values and configs load no torch (the command line checks them first); the sweep that trains
# them does, and is imported where it runs

REFERENCE = "reference.json"  # <out>/<study>/<name>/reference.json: the value's run lives elsewhere


@dataclass(frozen=True)
class Study:
    experiment: str  # its registered experiment (scalecl.experiments.EXPERIMENTS)
    method: str
    key: str  # the --set key swept
    default: str | None  # ';'-separated values; None: computed from the model (l_fp: 0..L)
    extra: Callable[[Any], list[str]] = lambda rc: []  # further --set values fixed by the study


def _layers(rc) -> int:
    if getattr(rc, "base", "builtin") == "builtin":
        return rc.model.layers
    from scalecl.experiments.cpt import base_model_config  # any model folder train-cpt takes

    return base_model_config(rc).num_hidden_layers


STUDIES: dict[str, Study] = {
    "init": Study("cpt", "scale-preserve", "methods.scale-preserve.init", "zero,rnd;rnd,zero;svd,svd;svd,zero"),
    "l_fp": Study("cpt", "scale-adapt", "methods.scale-adapt.l_fp", None),
    "collab": Study("cpt", "scale-adapt", "methods.scale-adapt.collab", "attn;mlp",
                    extra=lambda rc: [f"methods.scale-adapt.l_fp={_layers(rc) // 2}"]),
    "tau": Study("bio", "scale-route", "methods.scale-route.tau", "-1;0;0.5;0.9;0.99"),
    "router": Study("bio", "scale-route", "methods.scale-route.router", "logit;centered;prob"),
    "vocab": Study("bio", "scale-route", "model.vocab", "0;50304"),
}


# a study runs one training run per value: more than this many is a typo (0..100000000000), not a study, and
# is refused before a range is expanded
MAX_VALUES = 1_000


def study_values(study: str, rc, values: str | None) -> list[str]:
    """The swept values as --set strings; a range 'a..b' of integers is expanded (at most MAX_VALUES values)."""
    if study not in STUDIES:
        raise ScaleclError(f"unknown study {study!r}; choose one of {', '.join(STUDIES)}")
    if values is not None and not values.strip():  # given but empty: never the default set
        raise ScaleclError(f"{study}: --values is empty; give values, or leave it out for the study's default set")
    text = values if values is not None else STUDIES[study].default or f"0..{_layers(rc)}"
    vals = int_span(text, f"{study} values", MAX_VALUES, "runs")  # its length checked before it is expanded
    if vals is None:
        vals = [v.strip() for v in text.split(";")]
        if any(not v for v in vals):  # an empty value is an error, never dropped
            raise ScaleclError(f"{study} values {show_text(text)} have an empty value; separate them by single ';'")
    if len(vals) > MAX_VALUES:
        raise ScaleclError(f"{study} values {show_text(text)} give more than the {MAX_VALUES:,} runs a study may have")
    if not vals:
        raise ScaleclError(f"no values to sweep in {text!r}")
    return [str(v) for v in vals]


def study_configs(study: str, preset: str, values: str | None, sets: list[str],
                  inputs: dict[str, Any] | None = None) -> tuple[Study, list[str], list]:
    """(study, values, one resolved config per value): every key, type and range checked; `inputs`: the typed
    values of the command's own flags (its seeds: scalecl.experiments.args.Replicate)."""
    if study not in STUDIES:
        raise ScaleclError(f"unknown study {study!r}; choose one of {', '.join(STUDIES)}")
    s = STUDIES[study]
    rc = load_preset(s.experiment, preset, sets, inputs=inputs)
    vals = study_values(study, rc, values)
    configs, kept = [], []
    for v in vals:
        try:
            config = load_preset(s.experiment, preset, sets + s.extra(rc) + [f"{s.key}={v}"], inputs=inputs)
        except ScaleclError as e:
            raise ScaleclError(f"{study} value {v!r}: {e}") from None
        if config not in configs:  # a value given twice ('0.9;0.9', '0.9;0.90') is one run, run and reported once
            configs.append(config)
            kept.append(v)
    return s, kept, configs


def experiments(study: str, preset: str, values: str | None, rep: Replicate, paths: Paths
                ) -> tuple[Study, list[tuple[str, Any]]]:
    """(study, [(value, experiment)]): one experiment per swept value, writing under <out>/<study>/."""
    from scalecl.experiments import experiment

    s, vals, configs = study_configs(study, preset, values, rep.sets, rep.inputs)
    kind = experiment(s.experiment).experiment_class()
    where = Paths(paths.out / study, paths.cache, paths.checkpoints, shared=(paths.out.parent / s.experiment,))
    return s, [(v, kind(cfg, preset, where)) for v, cfg in zip(vals, configs, strict=True)]


def run_study(study: str, preset: str, values: str | None, sets: list[str] | list[Replicate], paths: Paths,
              opts: SweepOptions | None = None) -> list[dict[str, Any]]:
    """Run one run per swept value (after checking all of them); returns their result dicts. `sets` is one
    --set list, or the replicates (scalecl.experiments.args.replicates): every value runs in every replicate."""
    from scalecl.experiments.sweep import check, check_ahead, sweep

    opts = opts or SweepOptions()
    replicas = sets if sets and isinstance(sets[0], Replicate) else [Replicate(list(sets), {})]
    s, exps = None, []
    for rep in replicas:
        s, some = experiments(study, preset, values, rep, paths)
        exps += some
    methods = {}
    for v, exp in exps:
        try:
            methods[id(exp)] = check(exp, [s.method], opts)[1][s.method]
        except ScaleclError as e:
            raise ScaleclError(f"{study} value {v!r}: {e}") from None
    found = {id(exp): None if opts.force else find_shared(s, exp, methods[id(exp)]) for _, exp in exps}
    to_train = [(f"{study} value {v!r}", exp) for v, exp in exps if found[id(exp)] is None]
    check_ahead(to_train[1:], [s.method], opts)  # the first to train makes these checks itself, before it trains
    out, labels = [], []
    for v, exp in exps:
        shared = found[id(exp)]
        got = [refer(s, exp, methods[id(exp)], *shared)] if shared else sweep(exp, [s.method], opts, summary=False)
        out += got
        labels += [_row_label(study, s, v, r) for r in got]
    if out:  # one table for the whole study, a row per value (and seeds), not one per value
        exps[0][1].summary(out, labels)
    return out


def _row_label(study: str, s: Study, value: str, result: dict[str, Any]) -> str:
    """A study table's row: the studied value and, when not 0, the run's seeds (s<base>-r<run>)."""
    seeds = result.get("seeds") if isinstance(result.get("seeds"), dict) else {}
    tag = f" s{seeds.get('base', 0)}-r{seeds.get('run', 0)}" if any(seeds.values()) else ""
    return f"{s.method} {study}={value}{tag}"


def shared_run_dirs(s: Study, exp: Any, name: str) -> list[Path]:
    """Where a run of this name may already have finished: the experiment's main runs, <out>/../<experiment>/
    <name>, then the other studies' folders, <out>/<other study>/<name> (exp writes under <out>/<study>/)."""
    out = exp.paths.out.parent
    others = sorted(p / name for p in out.iterdir() if p.is_dir() and p != exp.paths.out) if out.is_dir() else []
    return [out.parent / s.experiment / name, *others]


def finished_elsewhere(run: Any, target: Path) -> dict[str, Any] | None:
    """The result.json in `target` when it is this run's (same experiment, name, method and config hash -- the
    hash covers the config, seeds and method options -- and the same numerics) and its run folder's manifest
    proves it (the rule training and plot follow), else None. Read only: the study never writes there."""
    from scalecl.common.files import proves
    from scalecl.compute.machine import check_numerics
    from scalecl.training.record import RESULT_FILE, read_record
    from scalecl.training.run import RUN_WRITER

    f = target / RESULT_FILE
    if not f.is_file() or f.is_symlink():
        return None
    if not proves(target, RUN_WRITER, RESULT_FILE):
        return None
    try:
        result = read_record(f, "finished run's result")
        theirs = result["run"]
        if any(theirs.get(k) != run.identity.get(k) for k in ("experiment", "name", "method", "config_hash")):
            return None
        if "numerics" in run.identity:
            check_numerics(result, run.identity["numerics"], str(target), "")
    except ScaleclError:
        return None
    return result


def find_shared(s: Study, exp: Any, method: Any) -> tuple[Path, dict[str, Any]] | None:
    """(folder, result) of a finished main run with this value's name, which the study's folder will refer to
    instead of training it again; None when the study's own folder has the run, or no such main run has finished
    (then the value trains as an ordinary run). A main run this layer cannot prove finished is never referenced.
    Writes nothing (refer writes the reference)."""
    from scalecl.compute.processes import Dist

    run = exp.run_of(method, Dist())
    if run.result() is not None:  # the study holds its own copy (an older study, or --force): the sweep reads it
        return None
    found = ((t, finished_elsewhere(run, t)) for t in shared_run_dirs(s, exp, run.name)
             if t.resolve() != run.out_dir.resolve())
    return next(((t, r) for t, r in found if r is not None), None)


def refer(s: Study, exp: Any, method: Any, target: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Write `<out>/<study>/<name>/reference.json` pointing at the finished run in `target` (once); its result."""
    from scalecl.common.files import OwnedFiles
    from scalecl.common.locks import locked
    from scalecl.compute.processes import Dist, say

    run = exp.run_of(method, Dist())
    doc = {"reference": Path(os.path.relpath(target, run.out_dir)).as_posix(), "run": run.name,
           "experiment": s.experiment}
    text, ref = json.dumps(doc, indent=2) + "\n", run.out_dir / REFERENCE
    if int(os.environ.get("RANK", "0")) == 0:
        run.out_dir.mkdir(parents=True, exist_ok=True)
        with locked(run.out_dir, wait=False, what=f"study folder {run.out_dir}"):  # its manifest: one writer
            files = OwnedFiles(run.out_dir, REFERENCE_WRITER)
            if not (ref.is_file() and files.owns(REFERENCE) and ref.read_text() == text):  # written once
                files.write(REFERENCE, text)
    say(f"{s.method}: finished run found at {target}; {run.out_dir / REFERENCE} refers to it (no copy)")
    return result
