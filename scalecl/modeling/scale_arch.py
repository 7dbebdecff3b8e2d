"""Where things live inside the two supported Hugging Face decoder families (transformers 5.x names).

Standalone (torch + transformers only): this file is copied verbatim into every SCALE checkpoint, next to
`modeling_scale.py`, and `scalecl.base_models` imports its table from here, so there is one copy of these facts.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class Arch:
    """Module paths and roles inside one decoder family."""

    layers: str  # attribute path of the ModuleList of decoder blocks
    embed: str
    final_norm: str
    head: str
    # linear name inside a block -> (group, input kind, output kind); kinds are resolved to widths by the surgery
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


def head_dim(config) -> int:
    """Channels per attention head (never changed by widening: attention grows by whole heads)."""
    hd = getattr(config, "head_dim", None)
    return int(hd) if hd else config.hidden_size // config.num_attention_heads


def kv_heads(config) -> int:
    """Key/value heads (the query heads when the family has no grouped-query attention)."""
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    """Replace the module at a dotted path (the surgery swaps leaves, never the model class)."""
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, module)
