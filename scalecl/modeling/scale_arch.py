"""Where things live inside the supported Hugging Face decoder families (transformers 5.x names).

Standalone (torch + transformers only): this file is copied verbatim into every SCALE checkpoint, next to
`modeling_scale.py`, and `scalecl.models.build` imports its table from here, so there is one copy of these facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn


@dataclass(frozen=True)
class Arch:
    """Module paths and roles inside one decoder family: what cannot be derived from the config or module types.

    Derived elsewhere, not stated here: head_dim, query and key/value heads (the config), biases (a linear's own
    bias), the embedding's scale (Gemma's scaled embedding module), tied embeddings, sliding windows and logit
    soft-capping (the config: widening changes none of them).
    """

    layers: str  # attribute path of the ModuleList of decoder blocks
    embed: str
    final_norm: str
    head: str
    # linear name inside a block -> (group, input kind, output kind); kinds are resolved to widths by the surgery:
    # "hidden" (residual stream), "q" (query heads x head_dim), "kv" (key/value heads x head_dim), "ffn", "qkv"
    # (GPT-NeoX's per-head fused [q|k|v]: new heads append). "a+b+c": an output fused block by block (Phi-3's
    # [q|k|v] and [gate|up]): each block grows at its own end, so the model's slicing finds its parts
    linears: dict[str, tuple[str, str, str]]
    norms: tuple[str, ...]  # norm modules over the residual stream inside a block (pre- and post-norms)
    attn_module: str  # the module carrying layer_idx
    zero_out: tuple[str, ...]  # output projections of a block (LLaMA Pro zeroes these)
    lora_targets: tuple[str, ...]
    # linears whose input is a norm of the block input (identical in both halves at Route's first forked
    # block); parallel_input: the same, only when the block uses the parallel residual
    block_input: tuple[str, ...] = ()
    parallel_input: tuple[str, ...] = ()
    # query/key norms inside attention: name -> (kind "q" or "kv", axis). axis None: one norm over all heads
    # together (OLMo 2), split at the base heads' width so the base heads keep their statistics; an int: the heads
    # axis of a per-head norm (weight over head_dim, shared by the heads: Qwen3 -2, Gemma 3 -3), whose new heads
    # get their own gain
    head_norms: dict[str, tuple[str, int | None]] = field(default_factory=dict)


# Llama's attention and gated MLP, shared by the families that copied it (Mistral, Qwen2/3, OLMo 2, Gemma 2/3)
_LLAMA_LINEARS = {
    "self_attn.q_proj": ("attn", "hidden", "q"),
    "self_attn.k_proj": ("attn", "hidden", "kv"),
    "self_attn.v_proj": ("attn", "hidden", "kv"),
    "self_attn.o_proj": ("attn", "q", "hidden"),
    "mlp.gate_proj": ("mlp", "hidden", "ffn"),
    "mlp.up_proj": ("mlp", "hidden", "ffn"),
    "mlp.down_proj": ("mlp", "ffn", "hidden"),
}
_PRE_NORMS = ("input_layernorm", "post_attention_layernorm")
_GEMMA_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def _llama_like(norms: tuple[str, ...] = _PRE_NORMS, head_norms: dict | None = None) -> Arch:
    return Arch(
        layers="model.layers", embed="model.embed_tokens", final_norm="model.norm", head="lm_head",
        linears=_LLAMA_LINEARS, norms=norms, attn_module="self_attn", zero_out=("self_attn.o_proj", "mlp.down_proj"),
        lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        block_input=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), head_norms=head_norms or {},
    )


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
    "llama": _llama_like(),
    "mistral": _llama_like(),
    "qwen2": _llama_like(),  # q/k/v biases: each widened linear keeps its bias and adds one for its new rows
    "qwen3": _llama_like(head_norms={"self_attn.q_norm": ("q", -2), "self_attn.k_norm": ("kv", -2)}),
    "phi3": Arch(
        layers="model.layers", embed="model.embed_tokens", final_norm="model.norm", head="lm_head",
        linears={
            "self_attn.qkv_proj": ("attn", "hidden", "q+kv+kv"),
            "self_attn.o_proj": ("attn", "q", "hidden"),
            "mlp.gate_up_proj": ("mlp", "hidden", "ffn+ffn"),
            "mlp.down_proj": ("mlp", "ffn", "hidden"),
        },
        norms=_PRE_NORMS, attn_module="self_attn", zero_out=("self_attn.o_proj", "mlp.down_proj"),
        lora_targets=("qkv_proj", "o_proj", "gate_up_proj", "down_proj"), block_input=("self_attn.qkv_proj",),
    ),
    # post-norms only: attention reads the block input itself (still identical in both halves at the fork)
    "olmo2": _llama_like(norms=("post_attention_layernorm", "post_feedforward_layernorm"),
                         head_norms={"self_attn.q_norm": ("q", None), "self_attn.k_norm": ("kv", None)}),
    "gemma2": _llama_like(norms=_GEMMA_NORMS),
    "gemma3_text": _llama_like(norms=_GEMMA_NORMS,
                               head_norms={"self_attn.q_norm": ("q", -3), "self_attn.k_norm": ("kv", -3)}),
}

# families people ask for that are refused, with the reason (one line each)
REFUSED: dict[str, str] = {
    "gemma3": "the multimodal Gemma 3 (vision tower, image tokens) is not supported; widen its text model "
              "(model_type gemma3_text, Gemma3ForCausalLM, e.g. google/gemma-3-1b-pt)",
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
