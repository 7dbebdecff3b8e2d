"""A method owns its checkpoint layout: every registered method names a layout the checkpoint code knows, its
model shows that layout and (where the structure tells) the method itself, and the hooks the checkpoint and
experiment code call instead of comparing names behave per method."""

from __future__ import annotations

import pytest
import torch

from scalecl.common.errors import ScaleclError
from scalecl.methods import REGISTRY, get_method
from scalecl.methods.base import method_of_model
from scalecl.models.build import model_from_config, tiny_config
from scalecl.training.layouts import (
    DELTA,
    LAYOUTS,
    PLAIN,
    layout_of_model,
    method_layout,
    record_layout,
    stored_base,
)
from tests.conftest import method_cases

METHODS = method_cases()
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny matrices, one thread


def _model(name: str):
    base = model_from_config(tiny_config("llama", num_hidden_layers=3), seed=0)
    return get_method(name, **METHODS[name]), base


def test_every_method_names_a_known_layout():
    assert set(METHODS) == set(REGISTRY)
    for name, cls in REGISTRY.items():
        assert cls.layout in LAYOUTS and method_layout(name) is LAYOUTS[cls.layout], name
    assert method_layout(None) is PLAIN and method_layout("no-such-method") is None
    assert record_layout({}) is PLAIN and record_layout({"layout": "delta"}) is DELTA
    assert record_layout({"layout": "nonsense"}) is None


@pytest.mark.parametrize("name", list(METHODS))
def test_a_methods_model_shows_its_layout_and_method(name):
    method, base = _model(name)
    model = method.apply(base)
    layout = layout_of_model(model)
    assert layout.name == method.layout
    found = method_of_model(model)
    if layout.plain:  # a transformers model carries no trace of the method that made it
        assert found is None
    else:
        # the same model (LoRA's alpha reads back as the number its default stands for: describe() shows it)
        assert found is not None and found.name == name and found.describe() == method.describe()
    method.check_model(model)  # the method that built it matches it


def test_a_scale_method_of_other_widths_does_not_match_the_model():
    method, base = _model("scale-adapt")
    model = method.apply(base)
    other = get_method("scale-adapt", **(METHODS["scale-adapt"] | {"l_fp": 0}))
    with pytest.raises(ScaleclError, match="l_fp"):
        other.check_model(model)


def test_only_scale_refuses_a_plain_export():
    for cls in REGISTRY.values():
        if cls.layout == "scale":
            with pytest.raises(ScaleclError, match="cannot be merged"):
                cls.check_merge()
        else:
            cls.check_merge()


@pytest.mark.parametrize("name", ["scale-route", "scale-adapt", "fft"])
def test_attach_gives_never_rows_to_routes_path_state_only(name):
    method, base = _model(name)
    model = method.apply(base)
    rows = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    assert method.attach(model, never_rows=rows) is model
    state = getattr(model, "scale_state", None)
    if name == "scale-route":
        assert state.never_rows is rows
    elif state is not None:
        assert state.never_rows is None


def test_only_lora_stores_its_base_inside(tmp_path):
    for name in LAYOUTS:
        inside = stored_base(tmp_path, {"layout": name})
        assert inside == (tmp_path / "base" if name == "lora" else None)
