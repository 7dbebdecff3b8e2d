"""Build a checkpoint from a base (`scalecl prepare`, `scalecl upscale`) and export one as a plain transformers
model (`scalecl merge`), through the writer and reader of scalecl.training.checkpoint. Each holds the lock of
its output folder from the check to the write (scalecl.common.locks)."""

from __future__ import annotations

import copy
import os
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from scalecl.common.errors import ScaleclError
from scalecl.common.locks import locked
from scalecl.methods import REGISTRY, Method, get_method
from scalecl.training.checkpoint import check_checkpoint_dest, load_model, read_meta, save_model
from scalecl.training.layouts import DELTA, record_layout


class Prepared(NamedTuple):
    """What `prepare_checkpoint` wrote: the folder, the model and its base (for a parameter table)."""

    path: Path
    model: PreTrainedModel
    source: str  # where the base came from, as the checkpoint records it
    base_total: Counter  # the base's parameters per kind (summary.param_counts)


def prepare_checkpoint(
    method: Method, out_dir: str | os.PathLike, model: str | None = None, random_config: str | None = None,
    *, seed: int = 0, overwrite: bool = False,
) -> Prepared:
    """Apply `method` to a base and write the checkpoint ready to train (`scalecl prepare`; `scalecl upscale`
    is this with a SCALE method).

    The base is exactly one of `model` (hub id or folder, any plain model load_model loads: model_source.open_base)
    and `random_config` (models.resolve_base). The
    destination is checked first, then every size on the base's config, all before the weights load; `seed`
    seeds random bases and random initialisation.
    """
    from scalecl.models.summary import param_counts
    from scalecl.training.model_source import open_base

    check_checkpoint_dest(out_dir, overwrite)  # first: a path that cannot be a folder takes no lock either
    with locked(out_dir, wait=False, what=f"checkpoint folder {out_dir}"):  # from the check to the write
        check_checkpoint_dest(out_dir, overwrite)
        base = open_base(model, random_config, seed)  # a checkpoint of the suite: verified, loaded by load_model
        method.check(base.config)
        _check_memory(base.config, method)  # before any weight is allocated
        weights = base.load()
        base_total, _ = param_counts(weights)
        torch.manual_seed(seed)
        prepared = method.apply(weights)
        path = save_model(prepared, out_dir, method, base_model=base.source, overwrite=overwrite)
    return Prepared(path, prepared, base.source, base_total)


def _check_memory(config, method: Method) -> None:
    """Refuse, in one line and before anything is allocated, a model whose float32 weights after `method`
    (counted on the meta device), with the estimate's margin, pass the memory the OS can give
    (SCALECL_MEMORY_CHECK=0: no check)."""
    from scalecl.common.environment import env
    from scalecl.compute.machine import MEMORY_MARGIN, available_memory

    available = available_memory()
    if available is None or not env("SCALECL_MEMORY_CHECK"):
        return
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(copy.deepcopy(config))
    need = 4 * sum(p.numel() for p in method.apply(skeleton, init_weights=False).parameters())
    if need * MEMORY_MARGIN > available:
        raise ScaleclError(f"the {method.name} model holds {need / 2**30:,.1f} GiB of float32 weights (with a "
                           f"{round(100 * (MEMORY_MARGIN - 1))}% margin {need * MEMORY_MARGIN / 2**30:,.1f} GiB), "
                           f"more than the {available / 2**30:,.1f} GiB available; nothing was loaded "
                           f"(SCALECL_MEMORY_CHECK=0 tries anyway)")


# ---------------------------------------------------------------------------------------------------------
# Export as a plain transformers model


def merge_model(path: str | os.PathLike, out_dir: str | os.PathLike, *, base: str | os.PathLike | None = None,
                overwrite: bool = False) -> Path:
    """Write a checkpoint as one that needs nothing else: LoRA merged into its base and other plain methods copied
    (a plain transformers model), a delta checkpoint merged with its base (`base`, else the recorded one) into
    the full checkpoint of its method (what save_model writes without delta=True).

    A full SCALE checkpoint cannot be folded into the base's shape (split norms, new heads): refused, since it
    already loads with `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`.
    """
    p = Path(path)
    if not p.is_dir():
        raise ScaleclError(f"model path {path} does not exist or is not a directory")
    from scalecl.training.model_source import saved_scale_record

    meta = read_meta(p) or saved_scale_record(p) or {}  # a SCALE model saved by transformers is refused as SCALE
    name, delta = meta.get("method"), record_layout(meta) is DELTA
    if name in REGISTRY and not delta:
        REGISTRY[name].check_merge()  # SCALE's widened model has no plain form
    if base is not None and not delta:
        raise ScaleclError(f"checkpoint {path} is not a delta checkpoint: it takes no base (base=...)",
                           cli=f"checkpoint {path} is not a delta checkpoint: it takes no --base")
    check_checkpoint_dest(out_dir, overwrite)  # first: a path that cannot be a folder takes no lock either
    with locked(out_dir, wait=False, what=f"checkpoint folder {out_dir}"):  # from the check to the write
        out = check_checkpoint_dest(out_dir, overwrite)
        model = load_model(p, base=base)
        method = get_method(name, **meta.get("options", {})) if name else None
        if method is not None and not delta:
            model = method.merge(model)  # LoRA: the adapters folded into the base's weights
        bad = [n for n, t in model.state_dict().items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if bad:  # an export is a model others will load as sound: refuse rather than copy NaN or inf onward
            raise ScaleclError(f"checkpoint {path} holds non-finite weights ({len(bad)} tensor(s), e.g. {bad[0]}); "
                               f"nothing was written")
        tokenizer = _checkpoint_tokenizer(p)
        if delta:  # the full checkpoint of its method, from the base it was checked against
            return save_model(model, out, method, base_model=meta.get("base_model"), tokenizer=tokenizer,
                              extra={"merged_from": str(p.resolve())}, overwrite=overwrite)
        source = {"merged_from": str(p.resolve()), "merged_method": name, "merged_options": meta.get("options", {})}
        if isinstance(meta.get("train_seq_len"), int):  # the merged model was trained at it too
            source["train_seq_len"] = meta["train_seq_len"]
        return save_model(model, out, None, base_model=meta.get("base_model"), tokenizer=tokenizer, extra=source,
                          overwrite=overwrite)


def _checkpoint_tokenizer(p: Path):
    """The tokenizer saved in a checkpoint folder, if any."""
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    from scalecl.common.remote_code import NO_REMOTE_CODE, is_refusal, refusal_line

    try:
        return AutoTokenizer.from_pretrained(str(p), **NO_REMOTE_CODE)
    except ValueError as e:
        if is_refusal(e):
            raise ScaleclError(refusal_line(p, "tokenizer")) from None
        raise
