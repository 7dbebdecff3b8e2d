"""Load a SCALE checkpoint with plain transformers: `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`.

A SCALE checkpoint's config.json is the widened model's own config (the base's model_type, e.g. "llama", widened
sizes, so any code reading the config sees the model as it runs) plus an `auto_map` naming the model class
below and a `scale` entry: the widening (`spec`, a ScaleSpec as a dict) and the base model's sizes
(`base_sizes`). The model class builds the transformers model of the base sizes, widens it with the same
surgery scalecl uses (`scale_surgery.widen`), and lets transformers load the weights. Loading is strict: a
missing, unexpected or mis-shaped tensor is an error, never a random initialisation.

Without trust_remote_code transformers builds its own class at the widened sizes, finds tensors of other
shapes and names, and raises (size mismatch), so a SCALE checkpoint never loads as a random or partial model.

Standalone (torch + transformers only): scalecl copies this file and the files it imports into every
SCALE checkpoint.
"""

from __future__ import annotations

from typing import Any

from transformers import (
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    GPTNeoXForCausalLM,
    LlamaForCausalLM,
    MistralForCausalLM,
    Olmo2ForCausalLM,
    Phi3ForCausalLM,
    PretrainedConfig,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)

from .scale_arch import ARCHS
from .scale_surgery import ScaleSpec, widen


class _ScaleModel:
    """Mixin over a transformers CausalLM class: build the base shape, widen it, load strictly."""

    base_arch: str = ""  # key of ARCHS

    def __init__(self, config: PretrainedConfig, *args: Any, **kwargs: Any) -> None:
        scale = getattr(config, "scale", None)
        if not isinstance(scale, dict) or "spec" not in scale or "base_sizes" not in scale:
            raise ValueError("not a SCALE config: config.scale must hold the widening (spec) and the base sizes")
        spec = ScaleSpec.from_dict(scale["spec"])
        wide = {k: getattr(config, k) for k in scale["base_sizes"]}
        for k, v in scale["base_sizes"].items():  # build the base shape, then widen it as scalecl does
            setattr(config, k, v)
        super().__init__(config, *args, **kwargs)
        arch = ARCHS[self.base_arch]
        # on the meta device (from_pretrained) the weights come from the checkpoint; otherwise (from_config)
        # the new blocks get SCALE's own initialisation from the base weights
        init = self.get_input_embeddings().weight.device.type != "meta"
        widen(self, spec, arch, init_weights=init)
        got = {k: getattr(config, k) for k in wide}
        if got != wide:
            raise ValueError(f"SCALE config inconsistent: widening the base sizes gives {got}, config.json says {wide}")
        if getattr(config, "tie_word_embeddings", False):  # the new columns are shared too
            self._tied_weights_keys = {**(type(self)._tied_weights_keys or {}),
                                       f"{arch.head}.weight_up": f"{arch.embed}.weight_up"}
        self._scale_trainable = frozenset(n for n, p in self.named_parameters() if p.requires_grad)
        self.post_init()  # tied-weight mapping of the widened model; ties what the config ties

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any):
        """transformers' from_pretrained, made strict, with requires_grad set as SCALE trains (frozen base)."""
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        bad = {k: sorted(map(str, v))[:5] for k, v in info.items() if k != "error_msgs" and v}
        if bad or info.get("error_msgs"):
            raise ValueError(f"SCALE checkpoint does not match its config.json: {bad} {info.get('error_msgs') or ''}")
        for name, p in model.named_parameters():
            p.requires_grad_(name in model._scale_trainable)
        return (model, info) if want_info else model


def _scale_class(name: str, base: type, arch: str) -> type:
    """The SCALE class of one family: the mixin over its transformers CausalLM class."""
    doc = f"A width-upscaled {base.__name__} (SCALE); the variant and sizes come from config.scale."
    return type(name, (_ScaleModel, base), {"base_arch": arch, "__doc__": doc, "__module__": __name__})


ScaleLlamaForCausalLM = _scale_class("ScaleLlamaForCausalLM", LlamaForCausalLM, "llama")
ScaleGPTNeoXForCausalLM = _scale_class("ScaleGPTNeoXForCausalLM", GPTNeoXForCausalLM, "gpt_neox")
ScaleMistralForCausalLM = _scale_class("ScaleMistralForCausalLM", MistralForCausalLM, "mistral")
ScaleQwen2ForCausalLM = _scale_class("ScaleQwen2ForCausalLM", Qwen2ForCausalLM, "qwen2")
ScaleQwen3ForCausalLM = _scale_class("ScaleQwen3ForCausalLM", Qwen3ForCausalLM, "qwen3")
ScalePhi3ForCausalLM = _scale_class("ScalePhi3ForCausalLM", Phi3ForCausalLM, "phi3")
ScaleOlmo2ForCausalLM = _scale_class("ScaleOlmo2ForCausalLM", Olmo2ForCausalLM, "olmo2")
ScaleGemma2ForCausalLM = _scale_class("ScaleGemma2ForCausalLM", Gemma2ForCausalLM, "gemma2")
ScaleGemma3ForCausalLM = _scale_class("ScaleGemma3ForCausalLM", Gemma3ForCausalLM, "gemma3_text")

# model_type -> the class its checkpoints name in auto_map (one per family of scale_arch.ARCHS)
CLASSES: dict[str, type] = {c.base_arch: c for c in (
    ScaleLlamaForCausalLM, ScaleGPTNeoXForCausalLM, ScaleMistralForCausalLM, ScaleQwen2ForCausalLM,
    ScaleQwen3ForCausalLM, ScalePhi3ForCausalLM, ScaleOlmo2ForCausalLM, ScaleGemma2ForCausalLM, ScaleGemma3ForCausalLM)}


def remote_config(model) -> PretrainedConfig:
    """The config.json of a model widened by `scale_surgery.widen`, for loading with trust_remote_code."""
    model_cls = CLASSES[model.config.model_type]
    d = model.config.to_dict()
    for k in ("model_type", "transformers_version", "auto_map", "architectures"):
        d.pop(k, None)
    d["scale"] = {"spec": model.scale_spec.to_dict(), "base_sizes": dict(model.scale_base_sizes)}
    config = type(model.config)(**d)
    config.architectures = [model_cls.__name__]
    config.auto_map = {"AutoModelForCausalLM": f"modeling_scale.{model_cls.__name__}"}
    return config


def make_saveable(model) -> None:
    """Make a model widened by `scale_surgery.widen` an instance of its family's SCALE class (the same
    transformers class underneath) with the SCALE entries in its config, so that `save_pretrained` (and so
    `Trainer.save_model` and `push_to_hub`) writes config.json with `auto_map` and `scale` plus this file and the
    files it imports: a checkpoint that loads with `from_pretrained(dir, trust_remote_code=True)`."""
    cls = CLASSES[model.config.model_type]
    if not isinstance(model, cls):
        model.__class__ = cls  # no __init__ runs: only the class's save and load behaviour is added
    remote = remote_config(model)
    model.config.scale, model.config.architectures = remote.scale, remote.architectures
    cls.register_for_auto_class("AutoModelForCausalLM")  # save_pretrained copies the model code beside it
