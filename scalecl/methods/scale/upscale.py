"""Width-upscaling surgery on a Hugging Face decoder (paper Sec. 3.1, Appendix B; spec/method.md).

The widened model stays an instance of its transformers class: only leaf modules are swapped for their
widened versions and the config is updated to the widened sizes, so generation with a KV cache and lm-eval
work unchanged. Route forks the batch above the function-preserving layers with forward pre-hooks.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch
from torch import nn
from transformers import PreTrainedModel

from ...config import ScaleConfig
from ...errors import ScaleclError
from ...models import arch_of, decoder_layers, head_dim, kv_heads, set_submodule
from .layers import PathState, SplitNorm, UpEmbedding, UpHead, UpLinear

# kwargs of a decoder block whose batch dimension must follow the hidden states when Route forks
_BATCHED_KWARGS = ("attention_mask", "position_embeddings", "position_ids")


def check_sizes(config, cfg: ScaleConfig) -> tuple[int, int]:
    """Validate widths against a base config before any work; returns (new query heads, new KV heads)."""
    arch_of(config)
    hd = head_dim(config)
    if cfg.hidden_up % hd:
        raise ScaleclError(f"hidden_up={cfg.hidden_up} is not a multiple of head_dim={hd}: attention grows by whole heads")
    new_heads = cfg.hidden_up // hd
    group = config.num_attention_heads // kv_heads(config)
    if new_heads % group:
        raise ScaleclError(
            f"hidden_up={cfg.hidden_up} adds {new_heads} query heads, not a multiple of the GQA group size {group} "
            f"(use a multiple of {group * hd})"
        )
    cfg.resolved_l_fp(config.num_hidden_layers)
    return new_heads, new_heads // group


def upscale(
    model: PreTrainedModel, cfg: ScaleConfig, inplace: bool = False, init_weights: bool = True
) -> PreTrainedModel:
    """Widen `model` by cfg.hidden_up / cfg.ffn_up and set which blocks train for cfg.variant.

    The base weights are reused (frozen, never modified). With inplace=False the input model is left intact.
    init_weights=False skips the SVD/random initialisation (used when a checkpoint is loaded right after).
    """
    config = model.config
    arch = arch_of(config)
    new_heads, new_kv = check_sizes(config, cfg)
    n_layers = config.num_hidden_layers
    l_fp = cfg.resolved_l_fp(n_layers)
    if getattr(model, "scale_config", None) is not None:
        raise ScaleclError("model is already upscaled")
    base_config = config.to_dict()
    if not inplace:
        model = copy.deepcopy(model)
        config = model.config

    d, hu, hd = config.hidden_size, cfg.hidden_up, head_dim(config)
    width = {"hidden": hu, "ffn": cfg.ffn_up, "qkv": 3 * hu, "kv": new_kv * hd}
    state = PathState("route" if cfg.variant == "route" else "adapt", cfg.tau)
    for p in model.parameters():
        p.requires_grad_(False)  # every pre-trained tensor is frozen; new blocks are created trainable

    shared = set(arch.block_input) | (set(arch.parallel_input) if getattr(config, "use_parallel_residual", False) else set())
    for i, layer in enumerate(decoder_layers(model)):
        collaborative = i >= l_fp and cfg.variant != "preserve"
        for name, (group, kin, kout) in arch.linears.items():
            up = UpLinear(layer.get_submodule(name), width[kin], width[kout], state, cfg.init, init_weights)
            up.w12.requires_grad_(collaborative and group in cfg.collab)
            up.fork = cfg.variant == "route" and i >= l_fp
            up.layer = i
            up.shared_input = up.fork and i == l_fp and name in shared
            set_submodule(layer, name, up)
        for name in arch.norms:
            set_submodule(layer, name, SplitNorm(layer.get_submodule(name), d, hu))
    set_submodule(model, arch.final_norm, SplitNorm(model.get_submodule(arch.final_norm), d, hu))
    emb = UpEmbedding(model.get_submodule(arch.embed), hu)
    set_submodule(model, arch.embed, emb)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    set_submodule(model, arch.head, UpHead(model.get_submodule(arch.head), hu, state, emb.weight_up if tied else None))

    config.hidden_size = d + hu
    config.num_attention_heads += new_heads
    if hasattr(config, "num_key_value_heads"):
        config.num_key_value_heads = kv_heads(config) + new_kv
    if config.model_type == "llama":
        config.head_dim = hd
    config.intermediate_size += cfg.ffn_up

    model.scale_config = cfg
    model.scale_state = state
    model.scalecl_base_config = base_config
    model.scale_l_fp = l_fp
    state.n_groups = n_layers + 1
    body = model.get_submodule(arch.embed.rpartition(".")[0])  # the decoder stack, e.g. model.model
    body.register_forward_pre_hook(_ConstantHook(model, arch), with_kwargs=True)
    if cfg.variant == "route":
        _install_fork(model, l_fp)
    return model


class _ConstantHook:
    """Before every forward, finds how far up the original channels stay independent of training.

    On the preserve path the first d channels of every hidden state are a function of frozen tensors alone
    (Theorem 3.1), and on the adapt path the same holds below the first layer whose W12 trains. No
    trainable parameter can then receive gradient through those channels, so the widened linears skip that
    part of the backward. What is checked here, on every call, is requires_grad: the leading groups (decoder
    layers, then the final norm) whose original-channel tensors (pre-trained weights and norms, plus W12 on
    the adapt path) are all frozen, below a frozen embedding. A caller who unfreezes a pre-trained tensor,
    or passes inputs_embeds that require grad, gets the full backward.
    """

    def __init__(self, model: PreTrainedModel, arch) -> None:
        self.state: PathState = model.scale_state
        self.embed = model.get_submodule(arch.embed).weight
        self.original: list[list[nn.Parameter]] = []  # per group: tensors that feed the original channels
        self.w12: list[list[nn.Parameter]] = []
        for group in [*decoder_layers(model), model.get_submodule(arch.final_norm)]:
            new, w12 = set(), []
            for m in group.modules():
                if isinstance(m, UpLinear):
                    new |= {id(m.w21), id(m.w22), id(m.bias_up), id(m.w12)}
                    w12.append(m.w12)
                elif isinstance(m, SplitNorm):
                    new |= {id(p) for p in m.up.parameters()}
            self.original.append([p for p in group.parameters() if id(p) not in new])
            self.w12.append(w12)

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict):
        emb = kwargs.get("inputs_embeds")
        n_pres = n_adapt = 0
        if not self.embed.requires_grad and not (emb is not None and emb.requires_grad):
            for orig in self.original:
                if any(p.requires_grad for p in orig):
                    break
                n_pres += 1
            for w12 in self.w12[:n_pres]:
                if any(p.requires_grad for p in w12):
                    break
                n_adapt += 1
        self.state.const_preserve, self.state.const_adapt = n_pres, n_adapt


class _ForkHook:
    """Forward pre-hook that doubles the batch at Route's fork point: [x; x] -> preserve half, adapt half.

    The first forked module duplicates the hidden states; every forked decoder block also doubles the
    batched kwargs (mask, rotary cos/sin, positions) the model loop hands it with the original batch size.
    A class, not a closure, so that deepcopy of a model copies its hooks with it.
    """

    def __init__(self, state: PathState, duplicate: bool) -> None:
        self.state, self.duplicate = state, duplicate

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict):
        if self.state.mode != "route":
            return None
        if self.duplicate:
            h = args[0] if args else kwargs["hidden_states"]
            h = torch.cat([h, h], dim=0)
            if args:
                args = (h, *args[1:])
            else:
                kwargs["hidden_states"] = h
        n2 = (args[0] if args else kwargs["hidden_states"]).shape[0]
        for k in _BATCHED_KWARGS:
            if k in kwargs:
                kwargs[k] = _double(kwargs[k], n2 // 2)
        return args, kwargs


def _double(v, n: int):
    if isinstance(v, torch.Tensor):
        return torch.cat([v, v], dim=0) if v.dim() > 0 and v.shape[0] == n else v
    if isinstance(v, tuple):
        return tuple(_double(t, n) for t in v)
    return v


def _install_fork(model: PreTrainedModel, l_fp: int) -> None:
    """Layers below l_fp run once; the blocks from l_fp up (or the final norm if l_fp = L) run forked."""
    layers = decoder_layers(model)
    state = model.scale_state
    for i in range(l_fp, len(layers)):
        layers[i].register_forward_pre_hook(_ForkHook(state, duplicate=(i == l_fp)), with_kwargs=True)
    if l_fp == len(layers):
        norm = model.get_submodule(arch_of(model.config).final_norm)
        norm.register_forward_pre_hook(_ForkHook(state, duplicate=True), with_kwargs=True)


@contextmanager
def scale_path(model: PreTrainedModel, mode: str):
    """Run an upscaled model on one path: "preserve" (every W12 treated as 0) or "adapt" (W12 as trained)."""
    if mode not in ("preserve", "adapt"):
        raise ValueError(f"mode must be preserve or adapt, got {mode!r}")
    state: PathState = model.scale_state
    old = state.mode
    state.mode = mode
    try:
        yield model
    finally:
        state.mode = old


def routing_fractions(model: PreTrainedModel, mask: torch.Tensor | None = None) -> dict[str, float]:
    """Fraction of tokens the last Route forward sent to each path (empty before the first forward).

    mask: optional (B, T) bool of the positions to count (e.g. not padding); all positions otherwise.
    """
    routed = getattr(getattr(model, "scale_state", None), "preserve_mask", None)
    if routed is None:
        return {}
    if mask is not None and mask.shape == routed.shape:
        routed = routed[mask.to(routed.device)]
    p = routed.float().mean().item() if routed.numel() else 0.0
    return {"route_preserve": p, "route_adapt": 1.0 - p}
