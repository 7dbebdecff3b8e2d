"""Build or load base models, and the per-architecture facts the methods need (module names, sizes)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from scalecl.common.errors import ScaleclError
from scalecl.common.hub import before_hub_load, miss_reason
from scalecl.common.readers import check_weights_folder, read_json
from scalecl.common.remote_code import NO_REMOTE_CODE, is_refusal, refusal_line
from scalecl.common.schema import MAX_LAYERS
from scalecl.common.sources import HUB_ID as _HUB_ID
from scalecl.modeling.scale_arch import ARCHS, REFUSED, Arch, head_dim, kv_heads, set_submodule

# the architecture table lives in scalecl.modeling (shipped in SCALE checkpoints): one copy, re-exported
__all__ = ["ARCHS", "Arch", "arch_of", "decoder_layers", "head_dim", "kv_heads", "set_submodule"]


def arch_of(config: PretrainedConfig) -> Arch:
    """The architecture facts for a config, or a clear error for unsupported families."""
    mt = getattr(config, "model_type", None)
    if mt in REFUSED:
        raise ScaleclError(f"unsupported architecture {mt!r}: {REFUSED[mt]}")
    if mt not in ARCHS:
        raise ScaleclError(f"unsupported architecture {mt!r}: scalecl supports {', '.join(ARCHS)}")
    return ARCHS[mt]


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.get_submodule(arch_of(model.config).layers)


# ---------------------------------------------------------------------------------------------------------
# Tiny random configs: tests, CI and the CPU presets build models from these, never from the hub.

_LLAMA_SHAPE = dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                    intermediate_size=128, max_position_embeddings=256, rms_norm_eps=1e-5)
# kind -> (transformers config class, its tiny sizes). Every family has GQA (or MQA); the newer ones add what
# sets them apart, small enough to matter in a 12-token test: sliding windows of 4 tokens (Mistral, Qwen2 above
# layer 0, Gemma's sliding layers), a head_dim that is not hidden/heads (Qwen3, Gemma), soft-capping that bites
# (Gemma 2: attention and logits; Gemma 3: logits)
TINY_CONFIGS: dict[str, tuple[str, dict]] = {
    "gpt_neox": ("GPTNeoXConfig", dict(
        vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=256,
        max_position_embeddings=256, rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False,
        hidden_dropout=0.0, attention_dropout=0.0)),
    "llama": ("LlamaConfig", dict(_LLAMA_SHAPE, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", dict(_LLAMA_SHAPE, tie_word_embeddings=False, sliding_window=4)),
    "qwen2": ("Qwen2Config", dict(_LLAMA_SHAPE, tie_word_embeddings=True, use_sliding_window=True, sliding_window=4,
                                  max_window_layers=1)),
    "qwen3": ("Qwen3Config", dict(_LLAMA_SHAPE, num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                                  tie_word_embeddings=False)),
    "phi3": ("Phi3Config", dict(_LLAMA_SHAPE, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                                eos_token_id=2)),
    "olmo2": ("Olmo2Config", dict(_LLAMA_SHAPE, tie_word_embeddings=False, pad_token_id=0, bos_token_id=None,
                                  eos_token_id=2)),
    "gemma2": ("Gemma2Config", dict(_LLAMA_SHAPE, num_attention_heads=4, head_dim=8, query_pre_attn_scalar=8,
                                    tie_word_embeddings=True, sliding_window=4, attn_logit_softcapping=3.0,
                                    final_logit_softcapping=5.0)),
    "gemma3_text": ("Gemma3TextConfig", dict(
        _LLAMA_SHAPE, num_attention_heads=4, num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=8,
        tie_word_embeddings=True, sliding_window=4, final_logit_softcapping=5.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
}
TINY_ALIASES = {"pythia": "gpt_neox", "neox": "gpt_neox", "gemma3": "gemma3_text"}


def tiny_config(kind: str = "llama", **overrides) -> PretrainedConfig:
    """A small random-init config of a supported family: "gpt_neox" ("pythia"), "llama", "mistral", "qwen2",
    "qwen3", "phi3", "olmo2", "gemma2" or "gemma3_text" ("gemma3"); overrides replace any field."""
    import transformers

    kind = TINY_ALIASES.get(kind, kind)
    if kind not in TINY_CONFIGS:
        raise ScaleclError(f"unknown tiny config kind {kind!r}; choose one of {', '.join(TINY_CONFIGS)} "
                           f"(or {', '.join(TINY_ALIASES)})")
    cls, base = TINY_CONFIGS[kind]
    base = {**base, **overrides}
    if kind == "gemma3_text" and "layer_types" not in overrides and base["num_hidden_layers"] != 3:
        base.pop("layer_types")  # the family's own pattern for another depth
    return getattr(transformers, cls)(**base)


def shape_config(shape, vocab_size: int, **overrides) -> PretrainedConfig:
    """The config of a from-scratch decoder of `shape` (a scalecl.experiments.config.ModelShape: arch, hidden, layers,
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




def check_model_source(name_or_path: str) -> None:
    """Fail early with one line when a model reference cannot possibly load."""
    if os.path.isdir(name_or_path):
        return
    if os.path.exists(name_or_path):
        raise ScaleclError(f"model path {name_or_path} is a file, expected a checkpoint directory")
    if not _HUB_ID.match(name_or_path) or name_or_path.startswith((".", "/", "~")):
        raise ScaleclError(f"model path {name_or_path} does not exist")


_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "intermediate_size", "max_position_embeddings", "head_dim")


# real-valued fields of the supported configs: name -> whether it must be > 0 (else >= 0); a string or NaN here
# would fail only at the first forward, or silently change the model
_REALS = {"rope_theta": True, "rms_norm_eps": True, "layer_norm_eps": True, "initializer_range": False,
          "attention_dropout": False, "hidden_dropout": False, "rotary_pct": True, "partial_rotary_factor": True,
          "factor": True}


def check_config_sizes(config: PretrainedConfig | dict, where: str) -> None:
    """Every size a config (or its JSON) gives is a positive integer (int32), heads divide the width: else one
    error naming `where` (a config.json with "64" as a size, -1 layers or 0 heads would otherwise fail deep in
    transformers or torch)."""
    got = {k: config.get(k) if isinstance(config, dict) else getattr(config, k, None) for k in _SIZES}
    for k, v in got.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 2**31):
            raise ScaleclError(f"{where}: {k} must be a positive integer, got {v!r}")
    if got["num_hidden_layers"] is not None and got["num_hidden_layers"] > MAX_LAYERS:
        raise ScaleclError(f"{where}: num_hidden_layers={got['num_hidden_layers']:,} exceeds {MAX_LAYERS:,} (the "
                           f"deepest published decoders have under 130)")
    doc = config if isinstance(config, dict) else config.to_dict()
    nested = [v for k in ("rope_parameters", "rope_scaling") if isinstance(v := doc.get(k), dict)]
    for source in (doc, *nested):
        for k, positive in _REALS.items():
            v = source.get(k)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or (positive and v <= 0) \
                    or v < 0:
                need = "a positive" if positive else "a non-negative"
                raise ScaleclError(f"{where}: {k} must be {need} finite number, got {v!r}")
    heads, kv = got["num_attention_heads"], got["num_key_value_heads"]
    if heads and got["hidden_size"] and got["head_dim"] is None and got["hidden_size"] % heads:
        raise ScaleclError(f"{where}: hidden_size {got['hidden_size']} is not divisible by num_attention_heads {heads}")
    if heads and kv and heads % kv:
        raise ScaleclError(f"{where}: num_attention_heads {heads} is not divisible by num_key_value_heads {kv}")


def read_config(folder: str | os.PathLike) -> PretrainedConfig:
    """The transformers config of a local model folder, read once through the suite's reader: a config.json
    that is not a JSON object, has impossible sizes or that transformers refuses (its field validation, an
    unknown model_type) is one ScaleclError naming the file."""
    path = os.path.join(folder, "config.json")
    check_config_sizes(read_json(path, "model config"), f"config {path}")
    try:
        config = AutoConfig.from_pretrained(str(folder), **NO_REMOTE_CODE)
    except Exception as e:  # OSError, ValueError, TypeError, huggingface_hub's StrictDataclassError ...
        if is_refusal(e):
            raise ScaleclError(refusal_line(folder)) from None
        raise ScaleclError(f"config {path} is not a config transformers can build ({type(e).__name__}: "
                           f"{(str(e).splitlines() or [''])[0][:160]})") from None
    check_config_sizes(config, f"config {path}")
    return config


def load_base_config(name_or_path: str) -> PretrainedConfig:
    """The config of a hub id or local directory, with the architecture checked before any weights load."""
    check_model_source(name_or_path)
    meta_file = os.path.join(name_or_path, "scalecl.json")
    if os.path.exists(meta_file):  # methods apply to plain models: a checkpoint of another layout is none
        meta = read_json(meta_file, "checkpoint record")
        layout = meta.get("layout", "plain")  # scalecl.training.layouts: only "plain" is a transformers folder
        if layout != "plain":
            raise ScaleclError(f"{name_or_path} is a checkpoint of layout {layout} ({meta.get('method')}), not a plain "
                               f"model: load it with scalecl.load_model, give its base model (recorded base: "
                               f"{meta.get('base_model')}), or `scalecl merge` it first where its method allows")
    if os.path.isdir(name_or_path):  # a damaged config.json: one line naming it
        try:
            config = read_config(name_or_path)
        except ScaleclError as e:
            raise ScaleclError(f"cannot load a config from {name_or_path}: {e}") from None
    else:
        before_hub_load(name_or_path)  # no network: one line at once instead of a minute of retries
        try:
            config = AutoConfig.from_pretrained(name_or_path, **NO_REMOTE_CODE)
        except Exception as e:  # OSError, ValueError, transformers' field validation: a config it cannot build
            if is_refusal(e):
                raise ScaleclError(refusal_line(name_or_path)) from None
            why = miss_reason(name_or_path) or (f"not a local checkpoint and not in the Hugging Face cache "
                                                f"({type(e).__name__})")
            raise ScaleclError(f"cannot load a config from {name_or_path}: {why}") from None
    if getattr(config, "scale", None) is not None:
        raise ScaleclError(f"{name_or_path} is a SCALE-upscaled model, not a plain model: give its base model")
    arch_of(config)
    check_config_sizes(config, f"config of {name_or_path}")
    return config


def load_base_model(name_or_path: str, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A plain pre-trained model from a hub id or a local directory."""
    load_base_config(name_or_path)
    if os.path.isdir(name_or_path):  # safetensors only, each file's header checked: nothing is unpickled
        check_weights_folder(name_or_path, "model folder")
    return load_plain_strict(name_or_path, dtype)


def _model_class(name_or_path: str) -> type:
    """AutoModelForCausalLM, or for a widened model saved with save_pretrained (config.json's `scale`) its SCALE
    class from scalecl.modeling: the code such a folder carries, taken from this package instead of run from it."""
    cfg = Path(name_or_path) / "config.json"
    if cfg.is_file():
        raw = read_json(cfg, "model config")
        if isinstance(raw.get("scale"), dict):
            from scalecl.modeling.modeling_scale import CLASSES

            return CLASSES.get(raw.get("model_type"), AutoModelForCausalLM)
    return AutoModelForCausalLM


def load_plain_strict(name_or_path: str, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """`from_pretrained` that accepts only a complete match: a weight missing from the files (transformers would
    initialise it at random) or of another shape than the config says is one error line, and transformers'
    multi-line load report is kept off stderr."""
    from transformers.utils import logging as hf_logging

    where = f"cannot load the weights of {name_or_path}"
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = _model_class(name_or_path).from_pretrained(name_or_path, dtype=dtype, use_safetensors=True,
                                                                 output_loading_info=True, **NO_REMOTE_CODE)
    except (OSError, ValueError, RuntimeError) as e:  # incl. safetensors' errors on a damaged file
        if is_refusal(e):
            raise ScaleclError(refusal_line(name_or_path)) from None
        text = str(e)
        if "ignore_mismatched_sizes" in text:
            raise ScaleclError(f"{where}: some tensors have other shapes than its config.json gives (wrong "
                               f"config.json, or weights of another model)") from None
        raise ScaleclError(f"{where} ({type(e).__name__}: {text.splitlines()[0] if text else ''}); is the "
                           f"checkpoint complete (truncated?)") from None
    except Exception as e:
        if type(e).__name__ == "SafetensorError":
            raise ScaleclError(f"{where}: {e}; the file looks truncated or damaged") from None
        raise
    finally:
        hf_logging.set_verbosity(before)
    missing = sorted(info.get("missing_keys") or [])
    mismatched = [k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys") or []]
    if missing:
        raise ScaleclError(f"{where}: {len(missing)} weight(s) its config needs are missing from the files (e.g. "
                           f"{missing[0]}); transformers would initialise them at random")
    if mismatched:
        raise ScaleclError(f"{where}: {len(mismatched)} weight(s) have other shapes than its config.json gives "
                           f"(e.g. {mismatched[0]})")
    return model.eval()


# ---------------------------------------------------------------------------------------------------------
# A base model named on the command line (`scalecl upscale` / `prepare`): --model or --random-config


class BaseModel(NamedTuple):
    """A base model before its weights load: the config (sizes are checked on it first), how to load the
    weights, and where it came from (recorded in checkpoints: a hub id, a folder or "random:<config>")."""

    config: PretrainedConfig
    load: Callable[[], PreTrainedModel]
    source: str


def resolve_base(model: str | None, random_config: str | None, seed: int = 0) -> BaseModel:
    """The base given as exactly one of `model` (hub id or directory) and `random_config` (a tiny config kind of
    `tiny_config`, e.g. "pythia", "llama" or "qwen3", or a transformers config JSON: random weights from `seed`)."""
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
    spec = read_json(path, "config file")
    if "model_type" not in spec:
        raise ScaleclError(f"config file {path} is not a JSON transformers config (no 'model_type')")
    arch_of(type("C", (), {"model_type": spec["model_type"]}))  # unsupported families fail here, by name
    check_config_sizes(spec, f"config file {path}")
    try:
        config = AutoConfig.for_model(**spec)
    except Exception as e:  # TypeError, ValueError, transformers' field validation: a config it cannot build
        raise ScaleclError(f"config file {path}: {(str(e).splitlines() or [type(e).__name__])[0]}") from None
    check_config_sizes(config, f"config file {path}")
    return config
