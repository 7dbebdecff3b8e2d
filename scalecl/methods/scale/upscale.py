"""`upscale`: validate a ScaleConfig against a model, then run the standalone surgery (scalecl.modeling).

The surgery itself (widened layers, split norms, embedding/head, Route's fork hooks and router) lives in
`scalecl.modeling`, which imports nothing from scalecl because it is also copied into every checkpoint.
This module adds what a user meets: one-line `ScaleclError`s before any work, and the scalecl records
(`model.scale_config`, `model.scalecl_base_config`) that checkpoints are rebuilt from.

A widened model carries two records: `model.scale_spec` (a ScaleSpec, set by the surgery: the widening as
built, l_fp resolved; present on every SCALE model, also one loaded through remote code) and
`model.scale_config` (a ScaleConfig, set here: the options as asked for, l_fp possibly None).
"""

from __future__ import annotations

import copy

from torch import nn
from transformers import PreTrainedModel

from scalecl.common.errors import ScaleclError
from scalecl.common.schema import MAX_SIZE
from scalecl.methods.scale.config import ScaleConfig
from scalecl.modeling.modeling_scale import make_saveable
from scalecl.modeling.scale_surgery import ScaleSpec, new_heads, widen, widened_sizes
from scalecl.models.build import arch_of, head_dim, kv_heads

# The most elements one widened matrix may hold: 2**31 (8 GiB in float32). The largest matrix of the paper's
# biggest setting (Llama-3.2-1B's 128,256 x 2,304 embedding after +256 hidden) holds 0.14 x 2**31. A larger one
# is far outside what the suite is built for (one process holds the model, its gradients and AdamW's two
# moments: 32 GiB for that one matrix), and its elements are past 32-bit indices.
MAX_MATRIX = 2**31


def check_sizes(config, cfg: ScaleConfig) -> tuple[int, int]:
    """Validate widths against a base config before any work; returns (new query heads, new KV heads)."""
    arch_of(config)
    hidden = config.hidden_size + cfg.hidden_up
    ffn = (getattr(config, "intermediate_size", None) or 0) + cfg.ffn_up
    rows = max(getattr(config, "vocab_size", None) or 0, ffn, hidden)  # embedding/head, FFN, attention
    if rows * hidden > MAX_MATRIX:
        raise ScaleclError(
            f"hidden_up={cfg.hidden_up}, ffn_up={cfg.ffn_up} would make a {rows:,} x {hidden:,} matrix of "
            f"{rows * hidden:,} elements; the suite allows at most 2**31 ({MAX_MATRIX:,}, 8 GiB in float32) per matrix"
        )
    hd = head_dim(config)
    if cfg.hidden_up % hd:
        raise ScaleclError(f"hidden_up={cfg.hidden_up} is not a multiple of head_dim={hd}: attention grows by whole heads")
    heads = cfg.hidden_up // hd
    group = config.num_attention_heads // kv_heads(config)
    if heads % group:
        raise ScaleclError(
            f"hidden_up={cfg.hidden_up} adds {heads} query heads, not a multiple of the GQA group size {group} "
            f"(use a multiple of {group * hd})"
        )
    if cfg.embed_init != "zero" and getattr(config, "tie_word_embeddings", False):
        raise ScaleclError(
            f"embed_init={cfg.embed_init} needs untied embeddings: with tied ones the head's new columns are the "
            f"embedding's, and non-zero ones would change the base model's logits (use embed_init=zero)"
        )
    cfg.resolved_l_fp(config.num_hidden_layers)
    check_widened_config(config, cfg.hidden_up, cfg.ffn_up, group * hd)
    return new_heads(config, cfg.hidden_up)


def widened_config_refusal(config, hidden_up: int, ffn_up: int) -> str | None:
    """Why transformers refuses the config of the widened model (its own validators), or None if it builds."""
    d = config.to_dict()
    for k in ("model_type", "transformers_version", "auto_map", "architectures"):
        d.pop(k, None)
    d.update(widened_sizes(config, hidden_up, ffn_up))
    try:
        type(config)(**d)
    except Exception as e:  # huggingface_hub's StrictDataclassClassValidationError, ValueError ...
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        return lines[-1] if lines else type(e).__name__
    return None


def check_widened_config(config, hidden_up: int, ffn_up: int, unit: int) -> None:
    """The widened config must be one transformers builds, or a checkpoint could not be loaded: Llama, Gemma 2 and
    Gemma 3 require hidden_size % num_attention_heads == 0 even with an explicit head_dim. One line naming the
    hidden_up values (multiples of `unit`, whole GQA groups of heads) that work for this model."""
    why = widened_config_refusal(config, hidden_up, ffn_up)
    if why is None:
        return
    ok = [k * unit for k in range(1, 257) if k * unit <= MAX_SIZE and widened_config_refusal(config, k * unit, ffn_up)
          is None][:4]
    hint = f"hidden_up values that work for this model: {', '.join(map(str, ok))}" if ok else \
        f"no multiple of {unit} up to {256 * unit} works for this model"
    raise ScaleclError(f"hidden_up={hidden_up} gives a widened {config.model_type} config that transformers refuses "
                       f"({why}); {hint}")


def check_modules(model: PreTrainedModel, arch) -> None:
    """The modules the surgery replaces are of the kinds whose forward it reproduces exactly; anything else (a
    peft or quantised linear, an embedding with its own forward) is one ScaleclError, never widened approximately."""
    emb = model.get_submodule(arch.embed)
    if type(emb) is not nn.Embedding and not (isinstance(emb, nn.Embedding) and hasattr(emb, "scalar_embed_scale")):
        raise ScaleclError(f"cannot widen {arch.embed}: a {type(emb).__name__}, not a plain or scaled nn.Embedding")
    if type(model.get_submodule(arch.head)) is not nn.Linear:
        raise ScaleclError(f"cannot widen {arch.head}: a {type(model.get_submodule(arch.head)).__name__}, not nn.Linear")
    norms = [(arch.final_norm, model.get_submodule(arch.final_norm))]
    for layer in model.get_submodule(arch.layers):
        for name in arch.linears:
            kind = type(layer.get_submodule(name))
            if kind is not nn.Linear:
                raise ScaleclError(f"cannot widen {name}: a {kind.__name__}, not nn.Linear (a model adapted by another "
                                   f"method or quantised is not a base SCALE can widen exactly)")
        norms += [(name, layer.get_submodule(name)) for name in (*arch.norms, *arch.head_norms)]
    for name, norm in norms:
        if not (isinstance(norm, nn.LayerNorm) or type(norm).__name__.endswith("RMSNorm")):
            raise ScaleclError(f"cannot widen {name}: a {type(norm).__name__}, not a LayerNorm or RMSNorm")


def to_spec(cfg: ScaleConfig, num_layers: int) -> ScaleSpec:
    """The plain structure the standalone surgery takes (l_fp resolved for a model of num_layers layers)."""
    d = cfg.to_dict()
    d["l_fp"] = cfg.resolved_l_fp(num_layers)
    return ScaleSpec.from_dict(d)


def upscale(
    model: PreTrainedModel, cfg: ScaleConfig, inplace: bool = False, init_weights: bool = True
) -> PreTrainedModel:
    """Widen `model` by cfg.hidden_up / cfg.ffn_up and set which blocks train for cfg.variant.

    The base weights are reused (frozen, never modified). With inplace=False the input model is left intact.
    init_weights=False skips the SVD/random initialisation (used when a checkpoint is loaded right after).
    """
    config = model.config
    arch = arch_of(config)
    check_sizes(config, cfg)
    spec = to_spec(cfg, config.num_hidden_layers)
    if getattr(model, "scale_spec", None) is not None:
        raise ScaleclError("model is already upscaled")
    check_modules(model, arch)
    base_config = config.to_dict()
    if not inplace:
        model = copy.deepcopy(model)
    widen(model, spec, arch, init_weights)
    make_saveable(model)  # save_pretrained / Trainer.save_model write a checkpoint transformers loads
    model.scale_config = cfg
    model.scalecl_base_config = base_config
    return model
