"""The experiments: the biography benchmark and continual pre-training, their configs, sweeps and studies.

`EXPERIMENTS` is the registry: an experiment's name (its result.json `experiment`, its presets'
`presets/<name>_<preset>.toml` prefix, its checkpoint subfolder) -> `ExperimentSpec`. The CLI, studies and
`scalecl plot` find an experiment here; nothing outside this folder branches on an experiment's name.
Importing this package does not import torch: an experiment's class and report load on first use.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalecl.common.errors import ScaleclError
from scalecl.common.schema import overlay
from scalecl.experiments.config import (
    BioRunConfig,
    CptRunConfig,
    check_config,
    fresh_corpora,
    merge,
    parse_sets,
)


@dataclass(frozen=True)
class ExperimentSpec:
    """An experiment as the registry knows it: its name, config dataclass and where its class and report live."""

    name: str
    config: type  # the run config dataclass its presets override (scalecl.experiments.config)
    module: str  # the module of its experiment class and its report spec (imported on first use)
    cls: str  # its ExperimentBase subclass
    report: str  # its scalecl.report ReportSpec, in scalecl.experiments.reports

    def experiment_class(self) -> type:
        return getattr(importlib.import_module(self.module), self.cls)

    def report_spec(self) -> Any:
        return getattr(importlib.import_module("scalecl.experiments.reports"), self.report)

    def load(self, preset: str, sets: list[str], inputs: dict[str, Any] | None = None) -> Any:
        """The preset's config with `sets` and the typed `inputs` applied, every key, type and range checked."""
        return load_preset(self.name, preset, sets, self.config, inputs)

    def make(self, preset: str, sets: list[str], paths: Path | Any) -> Any:
        """An experiment of this kind: the preset's config with `sets`, writing where `paths` say."""
        return self.build(self.load(preset, sets), preset, paths)

    def build(self, config: Any, preset: str, paths: Path | Any, **inputs: Any) -> Any:
        """An experiment of this kind from a config `load` resolved (the command line resolves every replicate's
        config, which loads no torch, before the experiment's class loads it); `inputs`: typed values the command
        line resolved from its own flags (train-cpt: `source`, its --model)."""
        return self.experiment_class()(config, preset, paths, **inputs)


EXPERIMENTS: dict[str, ExperimentSpec] = {}


def register(spec: ExperimentSpec) -> ExperimentSpec:
    """Add an experiment to the registry; a name registered twice is a programming error."""
    if spec.name in EXPERIMENTS:
        raise ValueError(f"experiment {spec.name!r} is already registered")
    EXPERIMENTS[spec.name] = spec
    return spec


def experiment(name: str) -> ExperimentSpec:
    """The registered experiment `name`, or one clear error naming those there are."""
    if name not in EXPERIMENTS:
        raise ScaleclError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]


register(ExperimentSpec("bio", BioRunConfig, "scalecl.experiments.bio", "BioExperiment", "BIO_REPORT"))
register(ExperimentSpec("cpt", CptRunConfig, "scalecl.experiments.cpt", "CptExperiment", "CPT_REPORT"))


def load_preset(kind: str, name: str, sets: list[str] | None = None, config_type: type | None = None,
                inputs: dict[str, Any] | None = None) -> Any:
    """Resolve a preset file (scalecl/presets/<kind>_<name>.toml) plus --set overrides into a checked config.

    config_type is the dataclass the file overrides; by default that of the experiment registered as `kind`
    (scalecl.experiments.EXPERIMENTS). `inputs`: values of a command's own flags (--data, --seeds, ...), already
    in their types and nested as the config ({"data": {"path": "x.txt"}, "seed": 1}), merged and checked as the
    overrides are, never written as --set text.
    """
    if config_type is None:
        config_type = experiment(kind).config
    import tomllib
    from importlib import resources

    path = resources.files("scalecl.presets") / f"{kind}_{name}.toml"
    if not path.is_file():
        avail = sorted(p.name.removeprefix(f"{kind}_").removesuffix(".toml")
                       for p in resources.files("scalecl.presets").iterdir() if p.name.startswith(f"{kind}_"))
        raise ScaleclError(f"unknown preset {name!r}; choose one of {', '.join(avail)}")
    cfg = merge(config_type(), tomllib.loads(path.read_text()), "")
    updates = overlay(parse_sets(sets or []), inputs or {})
    cfg = merge(fresh_corpora(cfg, updates), updates, "")  # a corpus the user names: none of the preset's selection
    check_config(cfg)
    return cfg
