"""What a model folder given as `--model` is, before any weight loads, so that every command takes every folder
`load_model` loads: a plain transformers folder, a checkpoint the suite wrote (any layout, delta included), or a
SCALE model saved the transformers way (`save_pretrained`, `Trainer.save_model`: config.json's `scale`, no
scalecl.json).

`model_record` is the folder's record: its scalecl.json (verified against the fingerprints it records), or, for a
SCALE model saved the transformers way, the record its config.json amounts to (method, options, base config);
None for a plain folder. `open_base` is a base that methods apply to (`upscale`, `prepare`, `train-cpt`): a
checkpoint of the suite loads through `load_model` (verified, a delta one with its base), and one whose method
changed the structure (SCALE, LoRA) is refused in one line naming its base.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from scalecl.common.errors import ScaleclError
from scalecl.common.readers import read_json
from scalecl.methods import get_method
from scalecl.models.build import BaseModel, arch_of, check_config_sizes, resolve_base
from scalecl.training.checkpoint import META_FILE, check_model_files, check_not_step, load_model, read_meta
from scalecl.training.checkpoint_record import recorded_config
from scalecl.training.layouts import DELTA, method_layout, record_layout

SAVED_BY_TRANSFORMERS = "transformers"  # a derived record's `saved_by`: no scalecl.json, nothing to verify


def saved_scale_record(path: str | os.PathLike) -> dict[str, Any] | None:
    """For a folder without scalecl.json whose config.json holds SCALE's widening (`scale`: spec and base sizes,
    written by save_pretrained or Trainer.save_model), the record scalecl would have written: its method and
    options, layout "scale" and the base's config; None for any other folder. A `scale` entry that is not SCALE's
    is one error naming the file."""
    p = Path(path)
    cfg = p / "config.json"
    if (p / META_FILE).exists() or not cfg.is_file():
        return None
    try:
        raw = read_json(cfg, "model config")
    except ScaleclError as e:  # as models.build words it for any base
        raise ScaleclError(f"cannot load a config from {p}: {e}") from None
    scale = raw.get("scale")
    if scale is None:
        return None
    if not isinstance(scale, dict) or not isinstance(scale.get("spec"), dict) \
            or not isinstance(scale.get("base_sizes"), dict):
        raise ScaleclError(f"model config {cfg}: its `scale` entry is not SCALE's widening (spec and base_sizes)")
    from scalecl.methods.scale import ScaleMethod
    from scalecl.modeling.scale_spec import ScaleSpec

    try:
        spec = ScaleSpec.from_dict(scale["spec"]).to_dict()
        method = ScaleMethod.for_variant(spec.pop("variant"))
    except (TypeError, ValueError, ScaleclError) as e:
        raise ScaleclError(f"model config {cfg}: its `scale` spec is not SCALE's ({e})") from None
    base = {k: v for k, v in raw.items() if k not in ("scale", "auto_map", "architectures", "transformers_version")}
    return {"method": method.name, "options": spec, "layout": method.layout, "base_model": None,
            "base_config": base | scale["base_sizes"], "saved_by": SAVED_BY_TRANSFORMERS}


def model_record(path: str | os.PathLike, *, verify: bool = True) -> dict[str, Any] | None:
    """The record of a model folder, its files checked (check_model_files; `verify`: every file against its
    fingerprint): its scalecl.json, else that of a SCALE model saved the transformers way, else None (plain)."""
    meta = check_model_files(path, verify=verify)
    return meta if meta is not None else saved_scale_record(path)


def trains_as_own(meta: dict[str, Any] | None) -> bool:
    """Whether a checkpoint's method made a model that is no plain transformers model (its layout is not plain:
    SCALE's widening, LoRA's adapters; full or delta), so that it trains on only as its own method and no method
    applies to it again."""
    layout = method_layout(meta.get("method")) if meta is not None else None
    return layout is not None and not layout.plain


def recorded_base_config(meta: dict[str, Any], path: str | os.PathLike) -> PretrainedConfig:
    """The config the record's method was applied to (for a plain checkpoint without a method: its own)."""
    return recorded_config(meta, Path(path))


def built_config(meta: dict[str, Any], path: str | os.PathLike) -> PretrainedConfig:
    """The config of the model `load_model` builds from a plain-structured checkpoint (base, FFT, Freeze, LLaMA Pro;
    full or delta): its method applied to the recorded base on the meta device, no weights."""
    config = recorded_base_config(meta, path)
    if not meta.get("method"):
        return config
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(copy.deepcopy(config))
        model = get_method(meta["method"], **meta.get("options", {})).apply(skeleton, init_weights=False)
    return model.config


def _not_plain(source: str, meta: dict[str, Any]) -> ScaleclError:
    kind = f"delta {meta['method']}" if record_layout(meta) is DELTA else meta["method"]
    saved = " saved by transformers" if meta.get("saved_by") == SAVED_BY_TRANSFORMERS else ""
    base = f" (recorded base: {meta.get('base_model')})" if meta.get("base_model") else ""
    return ScaleclError(f"{source} is a {kind} model{saved}, not a plain model: a method applies to its base model"
                        f"{base}; `scalecl train-cpt --model {source} --method {meta['method']}` trains it on")


def open_base(model: str | None, random_config: str | None = None, seed: int = 0, *,
              verify: bool = True) -> BaseModel:
    """A base model that methods apply to, before its weights load (models.resolve_base), for every folder
    load_model loads: a checkpoint of the suite (plain, or a delta of Freeze or LLaMA Pro) is checked (`verify`:
    against its fingerprints) and loads through load_model; a SCALE or LoRA model (full, delta, or saved the
    transformers way) is one error naming its base."""
    folder = Path(model).expanduser() if model is not None else None
    meta = None
    if folder is not None and folder.is_dir() and random_config is None:
        check_not_step(folder)
        meta = read_meta(folder) or saved_scale_record(folder)
    if meta is None:
        return resolve_base(model, random_config, seed)
    if trains_as_own(meta):
        raise _not_plain(model, meta)
    check_model_files(folder, verify=verify)
    config = built_config(meta, folder)
    arch_of(config)
    check_config_sizes(config, f"config of {model}")
    return BaseModel(config, lambda: as_plain(load_model(folder, verify=verify)), model)


def as_plain(model: torch.nn.Module) -> torch.nn.Module:
    """A plain-structured checkpoint's model as a base like any other: every weight trainable, and no record of the
    method that built it (LLaMA Pro's base config would otherwise be taken for this model's by the next save)."""
    for attr in ("scalecl_base_config", "scalecl_meta"):
        if hasattr(model, attr):
            delattr(model, attr)
    for p in model.parameters():
        p.requires_grad_(True)
    return model
