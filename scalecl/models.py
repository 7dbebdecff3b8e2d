"""Build or load base models, and the per-architecture facts the methods need (module names, sizes)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from .errors import ScaleclError


@dataclass(frozen=True)
class Arch:
    """Where things live inside one Hugging Face decoder family (transformers 5.x names)."""

    layers: str  # attribute path of the ModuleList of decoder blocks
    embed: str
    final_norm: str
    head: str
    # linear name inside a block -> (group, input kind, output kind); kinds are resolved to widths by upscale
    linears: dict[str, tuple[str, str, str]]
    norms: tuple[str, ...]  # norm modules inside a block
    attn_module: str  # the module carrying layer_idx
    zero_out: tuple[str, ...]  # output projections of a block (LLaMA Pro zeroes these)
    lora_targets: tuple[str, ...]
    # linears whose input is a norm of the block input (identical in both halves at Route's first forked
    # block); parallel_input: the same, only when the block uses the parallel residual
    block_input: tuple[str, ...] = ()
    parallel_input: tuple[str, ...] = ()


ARCHS: dict[str, Arch] = {
    "gpt_neox": Arch(
        layers="gpt_neox.layers",
        embed="gpt_neox.embed_in",
        final_norm="gpt_neox.final_layer_norm",
        head="lm_head",
        linears={
            # fused per-head [q|k|v]: new heads append 3 * head_dim rows each
            "attention.query_key_value": ("attn", "hidden", "qkv"),
            "attention.dense": ("attn", "hidden", "hidden"),
            "mlp.dense_h_to_4h": ("mlp", "hidden", "ffn"),
            "mlp.dense_4h_to_h": ("mlp", "ffn", "hidden"),
        },
        norms=("input_layernorm", "post_attention_layernorm"),
        attn_module="attention",
        zero_out=("attention.dense", "mlp.dense_4h_to_h"),
        lora_targets=("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
        block_input=("attention.query_key_value",),
        parallel_input=("mlp.dense_h_to_4h",),
    ),
    "llama": Arch(
        layers="model.layers",
        embed="model.embed_tokens",
        final_norm="model.norm",
        head="lm_head",
        linears={
            "self_attn.q_proj": ("attn", "hidden", "hidden"),
            "self_attn.k_proj": ("attn", "hidden", "kv"),
            "self_attn.v_proj": ("attn", "hidden", "kv"),
            "self_attn.o_proj": ("attn", "hidden", "hidden"),
            "mlp.gate_proj": ("mlp", "hidden", "ffn"),
            "mlp.up_proj": ("mlp", "hidden", "ffn"),
            "mlp.down_proj": ("mlp", "ffn", "hidden"),
        },
        norms=("input_layernorm", "post_attention_layernorm"),
        attn_module="self_attn",
        zero_out=("self_attn.o_proj", "mlp.down_proj"),
        lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        block_input=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ),
}


def arch_of(config: PretrainedConfig) -> Arch:
    """The architecture facts for a config, or a clear error for unsupported families."""
    mt = getattr(config, "model_type", None)
    if mt not in ARCHS:
        raise ScaleclError(f"unsupported architecture {mt!r}: scalecl supports {', '.join(ARCHS)}")
    return ARCHS[mt]


def head_dim(config: PretrainedConfig) -> int:
    hd = getattr(config, "head_dim", None)
    return int(hd) if hd else config.hidden_size // config.num_attention_heads


def kv_heads(config: PretrainedConfig) -> int:
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, module)


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
    try:
        config = AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        raise ScaleclError(
            f"cannot load a config from {name_or_path}: not a local checkpoint and not in the Hugging Face "
            f"cache ({type(e).__name__})"
        ) from None
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
