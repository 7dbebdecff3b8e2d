"""Save any model the suite builds (plain, baseline, upscaled) and load it back through one function.

Layout of a checkpoint directory:
  model.safetensors  weights (shared/tied tensors stored once)
  config.json        the transformers config of the model as it runs (widened sizes for SCALE)
  scalecl.json       how it was built: method name and options, the base config, where the base came from
  tokenizer files    when a tokenizer was given
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import safetensors.torch as st
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel
from transformers.initialization import no_init_weights

from .errors import ScaleclError
from .methods import Method, get_method

FORMAT_VERSION = 1
META_FILE = "scalecl.json"


def save_model(
    model: PreTrainedModel,
    out_dir: str | os.PathLike,
    method: Method | None = None,
    base_model: str | None = None,
    tokenizer=None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint atomically (temp dir + rename): nothing half-written is left on failure."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        # methods that change the structure record the config of the model they started from
        base_config = getattr(model, "scalecl_base_config", None)
        meta = {
            "format_version": FORMAT_VERSION,
            "method": method.name if method else None,
            "options": method.options() if method else {},
            "base_model": base_model,
            "base_config": base_config or model.config.to_dict(),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            **(extra or {}),
        }
        st.save_model(model, str(tmp / "model.safetensors"))
        model.config.to_json_file(str(tmp / "config.json"))
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, default=str))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_meta(path: str | os.PathLike) -> dict[str, Any] | None:
    f = Path(path) / META_FILE
    return json.loads(f.read_text()) if f.exists() else None


def load_model(path: str | os.PathLike, dtype: torch.dtype | None = None, device: str | None = None) -> PreTrainedModel:
    """Load any checkpoint the suite wrote (or a plain transformers directory), ready to use (eval mode).

    The model is rebuilt from the recorded base config and method options, then the weights are loaded
    strictly, so every parameter name and shape must match.
    """
    p = Path(path)
    if not p.is_dir():
        raise ScaleclError(f"model path {path} does not exist or is not a directory")
    meta = read_meta(p)
    if meta is None:  # a plain transformers checkpoint
        return AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype or torch.float32).eval()
    method = get_method(meta["method"], **meta["options"]) if meta.get("method") else None
    # Every checkpoint is rebuilt the same way: the recorded base config, then the method's structure
    # (without its initialisation), then the saved weights, loaded strictly.
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(**meta["base_config"]), dtype=getattr(torch, meta.get("dtype", "float32"))
        )
    model.tie_weights()  # skeletons built without init are not tied yet
    if method is not None:
        model = method.apply(model, init_weights=False)
    missing, unexpected = st.load_model(model, str(p / "model.safetensors"), strict=False)
    if missing or unexpected:
        raise ScaleclError(
            f"checkpoint {path} does not match its recorded method: missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"
        )
    model.scalecl_meta = meta
    if dtype is not None:
        model = model.to(dtype)
    if device is not None:
        model = model.to(device)
    return model.eval()
