"""Width-upscaling surgery on a Hugging Face decoder (paper Sec. 3.1, Appendix B; spec/method.md).

The widened model stays an instance of its transformers class: only leaf modules are swapped for their
widened versions and the config is updated to the widened sizes, so generation with a KV cache and lm-eval
work unchanged. Route forks the batch above the function-preserving layers with forward pre-hooks.

Standalone (torch + transformers only): copied verbatim into every SCALE checkpoint. It takes a plain
`ScaleSpec` and checks nothing a user could get wrong: `scalecl.methods.scale.ScaleConfig` and
`scalecl.methods.scale.upscale` validate first and convert.

`ScaleSpec`, the one declaration of SCALE's options (names, types, defaults, choices and meanings), lives in
`scale_spec` (no torch, so the command line's help needs none) and is re-exported here.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from typing import NamedTuple

import torch
from torch import nn

from .scale_arch import Arch, head_dim, kv_heads, set_submodule
from .scale_layers import HeadSplitNorm, PathState, SplitNorm, UpEmbedding, UpHead, UpLinear, products_setting
from .scale_spec import (  # noqa: F401  (re-exported: SCALE's options are declared in scale_spec)
    COLLAB_MODULES,
    EMBED_INITS,
    INITS,
    ROUTERS,
    VARIANTS,
    ScaleSpec,
    resolve_l_fp,
)

# kwargs of a decoder block whose batch dimension must follow the hidden states when Route forks
_BATCHED_KWARGS = ("attention_mask", "position_embeddings", "position_ids")
# config fields the widening changes (checkpoints record their base values to rebuild the base shape)
SIZE_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")


def new_heads(config, hidden_up: int) -> tuple[int, int]:
    """(new query heads, new KV heads) that hidden_up adds to a base config (whole heads, whole GQA groups)."""
    heads = hidden_up // head_dim(config)
    return heads, heads // (config.num_attention_heads // kv_heads(config))


def widened_sizes(config, hidden_up: int, ffn_up: int) -> dict[str, int]:
    """The config fields a widening changes, with their widened values (head_dim kept where the config has it,
    so nothing re-derives it from the widened sizes)."""
    n_new, new_kv = new_heads(config, hidden_up)
    sizes = {"hidden_size": config.hidden_size + hidden_up, "num_attention_heads": config.num_attention_heads + n_new,
             "intermediate_size": config.intermediate_size + ffn_up}
    if hasattr(config, "num_key_value_heads"):
        sizes["num_key_value_heads"] = kv_heads(config) + new_kv
    if hasattr(config, "head_dim"):
        sizes["head_dim"] = head_dim(config)
    return sizes


class _Plan(NamedTuple):
    """What every decoder block of one widening needs: the spec, the family, the widths and the shared state."""

    spec: ScaleSpec
    arch: Arch
    base: dict[str, int]  # width kind -> the base's width ("hidden", "q", "kv", "ffn", "qkv")
    new: dict[str, int]  # width kind -> the channels the widening adds
    head_dim: int
    state: PathState
    shared: frozenset[str]  # linears reading a norm of the block input (Route's first forked block)
    init_weights: bool


def _widths(config, spec: ScaleSpec) -> tuple[dict[str, int], dict[str, int]]:
    """(base widths, added widths) per width kind; attention grows by whole heads (whole GQA groups)."""
    hd, heads, kv = head_dim(config), config.num_attention_heads, kv_heads(config)
    n_new, new_kv = new_heads(config, spec.hidden_up)
    base = {"hidden": config.hidden_size, "ffn": config.intermediate_size, "q": heads * hd, "kv": kv * hd,
            "qkv": 3 * heads * hd}
    new = {"hidden": spec.hidden_up, "ffn": spec.ffn_up, "q": n_new * hd, "kv": new_kv * hd, "qkv": 3 * spec.hidden_up}
    return base, new


def _widen_block(layer: nn.Module, i: int, plan: _Plan) -> None:
    """Swap one decoder block's linears and norms for their widened versions, trainability set for layer i."""
    spec, arch = plan.spec, plan.arch
    collaborative = i >= spec.l_fp and spec.variant != "preserve"
    for name, (group, kin, kout) in arch.linears.items():
        parts = kout.split("+")  # an output fused block by block grows each block at its own end
        out_up = sum(plan.new[k] for k in parts)
        up = UpLinear(layer.get_submodule(name), plan.new[kin], out_up, plan.state, spec.init, plan.init_weights)
        if len(parts) > 1:
            up.segments = tuple((plan.base[k], plan.new[k]) for k in parts)
        up.w12.requires_grad_(collaborative and group in spec.collab)
        up.fork = spec.variant == "route" and i >= spec.l_fp
        up.layer = i
        up.shared_input = up.fork and i == spec.l_fp and name in plan.shared
        set_submodule(layer, name, up)
    attn = layer.get_submodule(arch.attn_module)
    for attr, kind in (("num_heads", "q"), ("num_attention_heads", "q"), ("num_key_value_heads", "kv")):
        if isinstance(getattr(attn, attr, None), int):  # head counts the module keeps (Phi-3 slices its qkv by them)
            setattr(attn, attr, getattr(attn, attr) + plan.new[kind] // plan.head_dim)
    d, hu = plan.base["hidden"], plan.new["hidden"]
    for name in arch.norms:
        set_submodule(layer, name, SplitNorm(layer.get_submodule(name), d, hu))
    for name, (kind, axis) in arch.head_norms.items():
        norm = layer.get_submodule(name)
        split = SplitNorm(norm, plan.base[kind], plan.new[kind]) if axis is None else \
            HeadSplitNorm(norm, plan.base[kind] // plan.head_dim, axis)
        set_submodule(layer, name, split)


def widen(model: nn.Module, spec: ScaleSpec, arch: Arch, init_weights: bool = True) -> nn.Module:
    """Widen `model` in place by spec.hidden_up / spec.ffn_up and set which blocks train for spec.variant.

    The base weights are reused (frozen, never modified). init_weights=False skips the SVD/random
    initialisation (used when a checkpoint is loaded right after). Sizes are assumed valid; an l_fp of None
    is resolved (resolve_l_fp) and the model records the resolved spec (model.scale_spec).
    """
    config = model.config
    n_layers = config.num_hidden_layers
    l_fp = resolve_l_fp(spec.variant, spec.l_fp, n_layers)
    spec = replace(spec, l_fp=l_fp)  # what the model records: always the resolved number
    d, hu, hd = config.hidden_size, spec.hidden_up, head_dim(config)
    base, new = _widths(config, spec)
    # SCALECL_SCALE_PRODUCTS is read here, once per model: the layers' forward reads the shared state
    mode = "route" if spec.variant == "route" else "adapt"
    state = PathState(mode, spec.tau, spec.router, products_setting())
    for p in model.parameters():
        p.requires_grad_(False)  # every pre-trained tensor is frozen; new blocks are created trainable

    shared = set(arch.block_input) | (set(arch.parallel_input) if getattr(config, "use_parallel_residual", False) else set())
    plan = _Plan(spec, arch, base, new, hd, state, frozenset(shared), init_weights)
    for i, layer in enumerate(model.get_submodule(arch.layers)):
        _widen_block(layer, i, plan)
    set_submodule(model, arch.final_norm, SplitNorm(model.get_submodule(arch.final_norm), d, hu))
    std = getattr(config, "initializer_range", None) or 0.02
    emb = UpEmbedding(model.get_submodule(arch.embed), hu, spec.embed_init, std, init_weights)
    set_submodule(model, arch.embed, emb)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    set_submodule(model, arch.head, UpHead(model.get_submodule(arch.head), hu, state, emb.weight_up if tied else None))

    base_sizes = {k: getattr(config, k) for k in SIZE_KEYS if hasattr(config, k)}
    for k, v in widened_sizes(config, hu, spec.ffn_up).items():
        setattr(config, k, v)

    model.scale_spec = spec  # the widening as built (scalecl's upscale adds model.scale_config: the options)
    model.scale_base_sizes = base_sizes  # what a checkpoint's config.json records to rebuild the base shape
    model.scale_state = state
    model.scale_l_fp = l_fp
    state.n_groups = n_layers + 1
    body = model.get_submodule(arch.embed.rpartition(".")[0])  # the decoder stack, e.g. model.model
    body.register_forward_pre_hook(_ConstantHook(model, arch), with_kwargs=True)
    if spec.variant == "route":
        _install_fork(model, arch, l_fp)
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

    Tensors are held as (module, attribute name) and looked up on every call, so the hook follows a
    parameter that is replaced (transformers' from_pretrained swaps every parameter of a model built on the
    meta device), not just one that is modified.
    """

    def __init__(self, model: nn.Module, arch: Arch) -> None:
        self.state: PathState = model.scale_state
        self.embed = (model.get_submodule(arch.embed), "weight")
        self.original: list[list[tuple[nn.Module, str]]] = []  # per group: tensors that feed the original channels
        self.w12: list[list[tuple[nn.Module, str]]] = []
        for group in [*model.get_submodule(arch.layers), model.get_submodule(arch.final_norm)]:
            new, w12, orig = set(), [], []
            for m in group.modules():
                if isinstance(m, UpLinear):
                    new |= {(id(m), n) for n in ("w21", "w22", "bias_up", "w12")}
                    w12.append((m, "w12"))
                elif isinstance(m, SplitNorm):
                    new |= {(id(u), n) for u in m.up.modules() for n, _ in u.named_parameters(recurse=False)}
            for m in group.modules():
                orig += [(m, n) for n, _ in m.named_parameters(recurse=False) if (id(m), n) not in new]
            self.original.append(orig)
            self.w12.append(w12)

    @staticmethod
    def _trains(refs: list[tuple[nn.Module, str]]) -> bool:
        return any(m._parameters[n].requires_grad for m, n in refs)  # (module, name): follows replacements

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict):
        emb = kwargs.get("inputs_embeds")
        n_pres = n_adapt = 0
        if not self._trains([self.embed]) and not (emb is not None and emb.requires_grad):
            for orig in self.original:
                if self._trains(orig):
                    break
                n_pres += 1
            for w12 in self.w12[:n_pres]:
                if self._trains(w12):
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


def _install_fork(model: nn.Module, arch: Arch, l_fp: int) -> None:
    """Layers below l_fp run once; the blocks from l_fp up (or the final norm if l_fp = L) run forked."""
    layers = model.get_submodule(arch.layers)
    state = model.scale_state
    for i in range(l_fp, len(layers)):
        layers[i].register_forward_pre_hook(_ForkHook(state, duplicate=(i == l_fp)), with_kwargs=True)
    if l_fp == len(layers):
        norm = model.get_submodule(arch.final_norm)
        norm.register_forward_pre_hook(_ForkHook(state, duplicate=True), with_kwargs=True)


@contextmanager
def scale_path(model: nn.Module, mode: str):
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


def routing_fractions(model: nn.Module, mask: torch.Tensor | None = None) -> dict[str, float]:
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
