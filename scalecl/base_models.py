"""Build or load base models, and the per-architecture facts the methods need (module names, sizes)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from .errors import ScaleclError
from .modeling.scale_arch import ARCHS, Arch, head_dim, kv_heads, set_submodule

# the architecture table lives in scalecl.modeling (shipped in SCALE checkpoints): one copy, re-exported
__all__ = ["ARCHS", "Arch", "arch_of", "decoder_layers", "head_dim", "kv_heads", "set_submodule"]


def arch_of(config: PretrainedConfig) -> Arch:
    """The architecture facts for a config, or a clear error for unsupported families."""
    mt = getattr(config, "model_type", None)
    if mt not in ARCHS:
        raise ScaleclError(f"unsupported architecture {mt!r}: scalecl supports {', '.join(ARCHS)}")
    return ARCHS[mt]


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.get_submodule(arch_of(model.config).layers)


# ---------------------------------------------------------------------------------------------------------
# Tiny random configs: tests, CI and the CPU presets build models from these, never from the hub.

def tiny_config(kind: str = "llama", **overrides) -> PretrainedConfig:
    """A small random-init config of one of the paper's families ("gpt_neox"/"pythia" or "llama")."""
    kind = {"pythia": "gpt_neox", "neox": "gpt_neox"}.get(kind, kind)
    if kind == "gpt_neox":
        from transformers import GPTNeoXConfig

        base = dict(
            vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=256, max_position_embeddings=256, rotary_pct=0.25,
            use_parallel_residual=True, tie_word_embeddings=False, hidden_dropout=0.0,
            attention_dropout=0.0,
        )
        base.update(overrides)
        return GPTNeoXConfig(**base)
    if kind == "llama":
        from transformers import LlamaConfig

        base = dict(
            vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=8,
            num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
            tie_word_embeddings=True, rms_norm_eps=1e-5,
        )
        base.update(overrides)
        return LlamaConfig(**base)
    raise ScaleclError(f"unknown tiny config kind {kind!r}; choose gpt_neox (pythia) or llama")


def shape_config(shape, vocab_size: int, **overrides) -> PretrainedConfig:
    """The config of a from-scratch decoder of `shape` (a scalecl.config.ModelShape: arch, hidden, layers,
    heads, ffn, context, rotary_pct) with `vocab_size` embedding and head rows; overrides (e.g. special
    token ids) are passed to the config."""
    if shape.hidden % shape.heads:
        raise ScaleclError(f"model.hidden={shape.hidden} is not divisible by model.heads={shape.heads}")
    kw = dict(rotary_pct=shape.rotary_pct) if shape.arch == "gpt_neox" else {}
    return tiny_config(
        shape.arch, vocab_size=vocab_size, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, intermediate_size=shape.ffn, max_position_embeddings=shape.context,
        **kw, **overrides,
    )


def model_from_config(config: PretrainedConfig, seed: int = 0, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """Random-init model from a config (seeded so tests and presets are reproducible)."""
    arch_of(config)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def check_model_source(name_or_path: str) -> None:
    """Fail early with one line when a model reference cannot possibly load."""
    if os.path.isdir(name_or_path):
        return
    if os.path.exists(name_or_path):
        raise ScaleclError(f"model path {name_or_path} is a file, expected a checkpoint directory")
    if not _HUB_ID.match(name_or_path) or name_or_path.startswith((".", "/", "~")):
        raise ScaleclError(f"model path {name_or_path} does not exist")


def load_base_config(name_or_path: str) -> PretrainedConfig:
    """The config of a hub id or local directory, with the architecture checked before any weights load."""
    check_model_source(name_or_path)
    meta_file = os.path.join(name_or_path, "scalecl.json")
    if os.path.isfile(meta_file):  # methods apply to plain models; SCALE and LoRA checkpoints are not
        meta = json.loads(open(meta_file).read())
        if meta.get("layout") in ("scale", "lora") or str(meta.get("method")).startswith(("scale-", "lora")):
            hint = "`scalecl merge` it first" if meta.get("method") == "lora" else "give its base model"
            raise ScaleclError(f"{name_or_path} is a {meta.get('method')} checkpoint, not a plain model: {hint} "
                               f"(recorded base: {meta.get('base_model')})")
    try:
        config = AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        raise ScaleclError(
            f"cannot load a config from {name_or_path}: not a local checkpoint and not in the Hugging Face "
            f"cache ({type(e).__name__})"
        ) from None
    if getattr(config, "scale", None) is not None:
        raise ScaleclError(f"{name_or_path} is a SCALE-upscaled model, not a plain model: give its base model")
    arch_of(config)
    return config


def load_base_model(name_or_path: str, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A plain pre-trained model from a hub id or a local directory."""
    load_base_config(name_or_path)
    try:
        return AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype).eval()
    except (OSError, ValueError, RuntimeError) as e:  # incl. safetensors' errors on a damaged file
        raise ScaleclError(f"cannot load the weights of {name_or_path} ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}); is the checkpoint complete (truncated?)") from None
    except Exception as e:
        if type(e).__name__ == "SafetensorError":
            raise ScaleclError(f"cannot load the weights of {name_or_path}: {e}; the file looks truncated or damaged"
                               ) from None
        raise


# ---------------------------------------------------------------------------------------------------------
# A base model named on the command line (`scalecl upscale` / `prepare`): --model or --random-config


class BaseModel(NamedTuple):
    """A base model before its weights load: the config (sizes are checked on it first), how to load the
    weights, and where it came from (recorded in checkpoints: a hub id, a folder or "random:<config>")."""

    config: PretrainedConfig
    load: Callable[[], PreTrainedModel]
    source: str


def resolve_base(model: str | None, random_config: str | None, seed: int = 0) -> BaseModel:
    """The base given as exactly one of `model` (hub id or directory) and `random_config` (a tiny config kind,
    "gpt_neox"/"pythia" or "llama", or a transformers config JSON: random weights from `seed`)."""
    if (model is None) == (random_config is None):
        raise ScaleclError("give exactly one of --model (hub id or directory) and --random-config")
    if model is not None:
        return BaseModel(load_base_config(model), lambda: load_base_model(model), model)
    is_file = Path(random_config).suffix == ".json"
    config = config_from_json(random_config) if is_file else tiny_config(random_config)
    return BaseModel(config, lambda: model_from_config(config, seed=seed), f"random:{random_config}")


def config_from_json(path: str | os.PathLike) -> PretrainedConfig:
    """A transformers config from a JSON file (a model_type and its sizes), of a supported architecture."""
    if not Path(path).is_file():
        raise ScaleclError(f"config file {path} does not exist")
    try:
        spec = json.loads(Path(path).read_text())
        if not isinstance(spec, dict) or "model_type" not in spec:
            raise ValueError("no 'model_type'")
    except (OSError, ValueError) as e:
        raise ScaleclError(f"config file {path} is not a JSON transformers config ({e})") from None
    arch_of(type("C", (), {"model_type": spec["model_type"]}))  # unsupported families fail here, by name
    try:
        return AutoConfig.for_model(**spec)
    except (TypeError, ValueError) as e:
        raise ScaleclError(f"config file {path}: {str(e).splitlines()[0]}") from None
