"""The registries refuse a name twice, and every experiment and preset they name loads."""

from __future__ import annotations

from importlib import resources

import pytest

from scalecl.experiments import EXPERIMENTS, ExperimentSpec, load_preset, register
from scalecl.methods import REGISTRY
from scalecl.methods.base import register as register_method


def test_method_registry_refuses_a_name_twice():
    cls = REGISTRY["fft"]
    with pytest.raises(ValueError, match="'fft' is already registered"):
        register_method(cls)
    assert REGISTRY["fft"] is cls


def test_experiment_registry_refuses_a_name_twice():
    spec = EXPERIMENTS["bio"]
    with pytest.raises(ValueError, match="'bio' is already registered"):
        register(ExperimentSpec("bio", spec.config, spec.module, spec.cls, spec.report))
    assert EXPERIMENTS["bio"] is spec


def _presets() -> list[tuple[str, str]]:
    names = [p.name for p in resources.files("scalecl.presets").iterdir() if p.name.endswith(".toml")]
    return sorted(tuple(n.removesuffix(".toml").split("_", 1)) for n in names)


def test_every_preset_file_belongs_to_a_registered_experiment():
    kinds = {kind for kind, _ in _presets()}
    assert kinds == set(EXPERIMENTS) and len(_presets()) >= 10


@pytest.mark.parametrize(("kind", "preset"), _presets())
def test_every_preset_file_loads_into_its_experiment_config(kind, preset):
    rc = load_preset(kind, preset)
    assert isinstance(rc, EXPERIMENTS[kind].config)


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_registered_experiment_resolves_its_class_and_report(name):
    spec = EXPERIMENTS[name]
    cls = spec.experiment_class()
    assert cls.name == name and cls.end_table.columns
    report = spec.report_spec()
    assert report.name == name
