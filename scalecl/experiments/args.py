"""The arguments of a sweep (train-bio, train-cpt, study), checked before torch loads.

A user's mistake on the command line (an unknown method or preset, a bad --set, --seeds or --stop-after, a
missing file) is one `error:` line within a second: this module, the configs (scalecl.experiments.config) and
the methods' option checks (scalecl.methods) import no torch, transformers or datasets, and the command line
checks everything here before it imports the sweep (scalecl.experiments.sweep) that trains.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from scalecl.common.errors import ScaleclError
from scalecl.common.sources import check_corpus_ref, check_model_ref, check_tokenizer_ref
from scalecl.methods import method_names


@dataclass(frozen=True)
class Paths:
    """Where a sweep writes: results (one folder per run), caches (data, stages, bases), checkpoints."""

    out: Path
    cache: Path = Path("cache")
    checkpoints: Path = Path("checkpoints")
    # folders of finished runs this sweep may compare with besides `out` (a study: the main runs, whose FFT run
    # of the same base its end-of-run table shows)
    shared: tuple[Path, ...] = ()


@dataclass(frozen=True)
class SweepOptions:
    """How a sweep treats existing runs and where it runs: --force, --resume, --stop-after, --report-to,
    --device."""

    force: bool = False
    resume: bool = False
    stop_after: int | None = None
    report_to: tuple[str, ...] = ()
    device: str | None = None

    def __post_init__(self) -> None:
        from scalecl.common.schema import MAX_STEPS
        from scalecl.training.trackers import check_report_to

        if self.stop_after is not None and not 1 <= self.stop_after <= MAX_STEPS:
            raise ScaleclError(f"--stop-after must be a step in 1..{MAX_STEPS:,}, got {self.stop_after}")
        object.__setattr__(self, "report_to", check_report_to(self.report_to))  # "a,b" or names; installed


def parse_methods(text: str) -> list[str]:
    """`--method`: 'all', or one or more method names separated by commas."""
    if text.strip() == "all":
        return method_names()
    from scalecl.common.schema import split_items

    if not text.strip():
        raise ScaleclError(f"--method {text!r} names no method; choose from {', '.join(method_names())} or all")
    names = split_items(text, "--method")
    if not names:
        raise ScaleclError(f"--method {text!r} names no method; choose from {', '.join(method_names())} or all")
    unknown = next((n for n in names if n not in method_names()), None)
    if unknown is not None:
        raise ScaleclError(f"unknown method {unknown!r}; choose one of {', '.join(method_names())} or all")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # one run per method and setting: a repeat would train nothing more, and say nothing
        raise ScaleclError(f"--method {text!r} names {', '.join(twice)} more than once; give each method once "
                           f"(--seeds / --run-seeds replicate a method)")
    return names


MAX_REPLICATES = 1000


def parse_seeds(text: str | None, key: str) -> list[int] | None:
    """`--seeds` / `--run-seeds`: integers separated by commas, or a range a..b (both ends included); None
    when not given. Each is checked like a config seed; repeats are dropped."""
    if text is None:
        return None
    from scalecl.common.schema import check_seed, int_span, show_text, show_value, split_items

    vals = int_span(text, key, MAX_REPLICATES, "seeds")  # its length checked before it is expanded
    if vals is None:
        try:
            vals = [int(v) for v in split_items(text, key)]
        except ValueError:
            raise ScaleclError(f"{key} takes integers separated by commas or a range a..b, got "
                               f"{show_text(text)}") from None
    if not vals or len(vals) > MAX_REPLICATES:
        raise ScaleclError(f"{key} {show_value(text)} gives {len(vals)} seeds; give 1..{MAX_REPLICATES}")
    return list(dict.fromkeys(check_seed(v, key) for v in vals))


class Replicate(NamedTuple):
    """One replicate of a sweep: the user's --set overrides as written, and the values of the command's own
    flags in their types, nested as the config ({"seed": 1, "data": {"path": "x.txt"}}; load_preset merges
    both and checks them alike)."""

    sets: list[str]
    inputs: dict[str, Any]

    def load(self, kind: str, preset: str) -> Any:
        """This replicate's config of experiment `kind` (every key, type and range checked)."""
        from scalecl.experiments import experiment

        return experiment(kind).load(preset, self.sets, self.inputs)


def set_keys(sets: list[str]) -> set[str]:
    """The config keys a --set list names ('data.path', 'seed')."""
    return {s.split("=", 1)[0].strip() for s in sets}


def replicates(sets: list[str], seeds: str | None, run_seeds: str | None,
               inputs: dict[str, Any] | None = None) -> list[Replicate]:
    """Every replicate: each base seed (--seeds) with each run seed (--run-seeds), beside `inputs` (the
    command's other flags, typed); one replicate when neither is given. A seed given both ways is refused
    rather than silently overridden."""
    base, run = parse_seeds(seeds, "--seeds"), parse_seeds(run_seeds, "--run-seeds")
    for given, key in ((base, "seed"), (run, "run_seed")):
        if given is not None and key in set_keys(sets):
            raise ScaleclError(f"the {key.replace('_', ' ')} is given twice (--set {key}=... and "
                               f"--{key.replace('_', '-')}s); give it once")
    inputs = inputs or {}
    return [Replicate(list(sets), inputs | ({"seed": b} if b is not None else {})
                      | ({"run_seed": r} if r is not None else {}))
            for b in (base or [None]) for r in (run or [None])]


DEVICE = re.compile(r"(cpu|cuda|mps)(:\d+)?")


def check_device_name(name: str | None) -> None:
    """--device written as a device can be (cpu, cuda, cuda:N, mps); whether this machine has it is checked where
    torch is loaded (scalecl.compute.machine.pick_device, with the same words)."""
    if name is None:
        return
    if not name.strip():
        raise ScaleclError("--device is empty: use cpu, cuda or cuda:N (or leave it out for cuda when available)")
    if not DEVICE.fullmatch(name.strip()):
        raise ScaleclError(f"unknown device {name!r}: use cpu, cuda or cuda:N")


# a run config's keys that name a model, tokenizer or text, with how each is checked
_SOURCES = (("base", check_model_ref), ("tokenizer", check_tokenizer_ref), ("data.path", check_corpus_ref),
            ("old_eval.path", check_corpus_ref), ("new_eval.path", check_corpus_ref))


# what to give instead of a tokenizer folder that does not exist, per experiment
_TOKENIZER_HINT = {"bio": "; give a folder of tokenizer files, a hub id, or --tokenizer local (a word-level "
                          "tokenizer trained on the generated corpus)"}


def check_sources(rc: Any, kind: str = "") -> None:
    """One error for the first local path a resolved run config (of experiment `kind`) names that does not exist
    (its base model, its tokenizer, its texts): before anything loads, as the loaders would say it later."""
    for key, check in _SOURCES:
        value: Any = rc
        for part in key.split("."):
            value = getattr(value, part, None)
        if not isinstance(value, str) or not value:
            continue
        if check is check_tokenizer_ref:
            check(value, hint=_TOKENIZER_HINT.get(kind, ""))
        else:
            check(value)
