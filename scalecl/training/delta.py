"""Delta checkpoints: only the tensors a method trains, plus the identity of the base they apply to.

A method that trains part of a model (Freeze, LLaMA Pro, SCALE: `Method.delta`) sorts the tensors of the model
it builds from a base into three kinds (`Split`), found by applying it to the base and looking at each tensor:

  trained    it requires grad after `apply`: stored in delta.safetensors (under the model's names)
  from_base  a tensor object of the base, kept as it is (frozen): not stored; the base provides it
  built      a frozen tensor the method makes itself (SCALE's W12 held at zero below l_fp): not stored; the
             method builds it again at load

The record (scalecl.json `delta`) names the base as it was given (hub id or folder, and the folder's absolute
path) and holds two digests (`tensor_digest`): of the from_base tensors under the base's own names (for SCALE
and LLaMA Pro every tensor of the base; for Freeze the embedding and the frozen blocks, the rest being stored),
and of the built tensors. It also records where each base tensor goes: `layer_order` (per decoder layer of the
model, the base layer it takes its frozen tensors from, or null: LLaMA Pro's inserted blocks) and a digest of
the whole name map. Loading applies the method to the base, checks all of them (a base of other weights is
refused in one line), then loads the stored tensors strictly: the model is bit-identical to the one saved.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import safetensors.torch as st
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from scalecl.common.errors import ScaleclError
from scalecl.common.readers import model_weights_header
from scalecl.common.sources import HUB_ID
from scalecl.methods import REGISTRY, Method
from scalecl.models.build import arch_of, decoder_layers

DELTA_FILE = "delta.safetensors"
# config fields that say where a model came from, how it was stored or what a forward returns, not what it computes
_BOOKKEEPING = frozenset({"transformers_version", "_name_or_path", "architectures", "dtype", "torch_dtype",
                          "_commit_hash", "auto_map", "scale", "use_cache", "output_attentions", "output_hidden_states",
                          "return_dict", "id2label", "label2id", "problem_type"})


class Split(NamedTuple):
    """The tensors of a method's model by where a delta checkpoint gets them (names as in its state dict, each
    shared tensor once)."""

    trained: tuple[str, ...]  # stored in the delta
    from_base: dict[str, str]  # model name -> the base's name: the base's tensor, unchanged
    built: tuple[str, ...]  # frozen tensors the method builds itself


def unique_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """name -> tensor (parameters and persistent buffers, as objects), a tensor shared by several names once, under
    the first."""
    out, seen = {}, set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) not in seen:
            seen.add(id(t))
            out[name] = t
    return out


def apply_split(base: PreTrainedModel, method: Method) -> tuple[PreTrainedModel, Split]:
    """`method.apply(base, init_weights=False)` (base used in place) and the Split of the model it returns."""
    held = base.state_dict(keep_vars=True)  # kept alive: no id below is reused by a new tensor
    names: dict[int, str] = {}
    for name, t in held.items():
        names.setdefault(id(t), name)
    model = method.apply(base, init_weights=False)
    trained, from_base, built = [], {}, []
    for name, t in unique_state(model).items():
        if t.requires_grad:
            trained.append(name)
        elif id(t) in names:
            from_base[name] = names[id(t)]
        else:
            built.append(name)
    del held
    return model, Split(tuple(trained), from_base, tuple(built))


def skeleton_split(method: Method, base_config: dict[str, Any], dtype: torch.dtype) -> tuple[PreTrainedModel, Split]:
    """apply_split on the meta device (no weights): the model `method` builds from a base of `base_config`."""
    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(AutoConfig.for_model(**copy.deepcopy(base_config)), dtype=dtype)
        return apply_split(base, method)


def tensor_digest(tensors: dict[str, torch.Tensor]) -> str:
    """`bytes:hash` (blake2b-128) of named tensors: each name, dtype, shape and raw bytes, in name order. Equal
    digests mean bit-identical tensors under the same names, whatever files they were read from."""
    h, size = hashlib.blake2b(digest_size=16), 0
    for name in sorted(tensors):
        t = tensors[name].detach()
        h.update(f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{list(t.shape)}\0".encode())
        data = t.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        h.update(memoryview(data))
        size += data.nbytes
    return f"{size}:{h.hexdigest()}"


def check_structure(model: PreTrainedModel, method: Method, base_config: dict[str, Any]) -> Split:
    """The model is the one `method` builds from a base of `base_config` (every tensor's name and shape, and
    which ones are shared), else one ScaleclError; its Split."""
    dtype = next(model.parameters()).dtype
    try:
        skeleton, split = skeleton_split(method, base_config, dtype)
    except ScaleclError as e:
        raise ScaleclError(f"method {method.name} does not match the model given to save_model ({e})") from None
    want = {n: tuple(t.shape) for n, t in skeleton.state_dict(keep_vars=True).items()}
    have = {n: tuple(t.shape) for n, t in model.state_dict(keep_vars=True).items()}
    if want != have or list(unique_state(skeleton)) != list(unique_state(model)):
        extra, lacks = sorted(set(have) - set(want)), sorted(set(want) - set(have))
        shape = [f"{n} is {list(have[n])} (the method makes {list(want[n])})" for n in sorted(set(want) & set(have))
                 if want[n] != have[n]]
        why = (f"the model has {_some(extra)}, which it does not make" if extra else
               f"it makes {_some(lacks)}, which the model lacks" if lacks else
               _some(shape) if shape else "the model shares other tensors than it does (tied weights)")
        raise ScaleclError(f"method {method.name} ({_options(method)}) does not match the model given to save_model: "
                           f"{why}")
    return split


def _some(items: list[str]) -> str:
    """The first two of a list, and how many more."""
    return ", ".join(items[:2]) + (f" (and {len(items) - 2} more)" if len(items) > 2 else "")


def _options(method: Method) -> str:
    return ", ".join(f"{k}={v}" for k, v in method.options().items()) or "no options"


def check_delta_method(method: Method | None, base_model: str | None) -> None:
    """A delta checkpoint needs a method that trains part of the model, and the base's name."""
    if method is None or not method.delta:
        what = f"method {method.name}" if method else "a plain model (no method)"
        able = ", ".join(name for name, cls in REGISTRY.items() if cls.delta)
        raise ScaleclError(f"{what} has no delta checkpoint (methods that have one: {able}; a LoRA checkpoint is an "
                           f"adapter already): save a full checkpoint (delta=False)")
    if not base_model:
        raise ScaleclError("a delta checkpoint records its base: pass base_model (the base's hub id or folder)")


def write_delta(model: PreTrainedModel, method: Method, split: Split, folder: Path,
                base_model: str) -> dict[str, Any]:
    """Write delta.safetensors (the tensors `method` trains: `split`, from check_structure) into `folder`; the
    record for scalecl.json."""
    extra = [n for n, p in model.named_parameters() if p.requires_grad and n not in split.trained]
    if extra:  # it may have changed: a delta would silently drop it
        raise ScaleclError(f"the model trains {extra[0]} (and {len(extra) - 1} more), which {method.name} keeps frozen: "
                           f"a delta checkpoint holds only what the method trains; save a full checkpoint "
                           f"(delta=False)")
    state = unique_state(model)
    folder.mkdir(exist_ok=True)
    st.save_file({n: state[n].detach().to("cpu").contiguous() for n in split.trained}, str(folder / DELTA_FILE),
                 metadata={"format": "pt"})
    path = Path(base_model).expanduser()
    return {
        "file": DELTA_FILE,
        "base": {"source": base_model, "path": str(path.resolve()) if path.is_dir() else None,
                 "digest": tensor_digest({b: state[m] for m, b in split.from_base.items()}),
                 "tensors": len(split.from_base)},
        "built_digest": tensor_digest({n: state[n] for n in split.built}),
        "layer_order": layer_order(model, split),
        "map_digest": map_digest(split),
        "trained": len(split.trained),
    }


def layer_order(model: PreTrainedModel, split: Split) -> list[int | None]:
    """Per decoder layer of the model: the base layer whose tensors it takes unchanged, or None (all stored)."""
    prefix = arch_of(model.config).layers + "."
    order: list[int | None] = [None] * len(decoder_layers(model))
    for m, b in split.from_base.items():
        if m.startswith(prefix) and b.startswith(prefix):
            order[int(m[len(prefix):].split(".")[0])] = int(b[len(prefix):].split(".")[0])
    return order


def map_digest(split: Split) -> str:
    """A digest of which base tensor lands where (model name -> base name, every pair)."""
    text = "\n".join(f"{m}\0{b}" for m, b in sorted(split.from_base.items()))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def check_record(rec: Any, f: Path) -> None:
    """The `delta` entry of a scalecl.json, of the right shape, or one error naming the file."""
    base = rec.get("base") if isinstance(rec, dict) else None
    order = rec.get("layer_order") if isinstance(rec, dict) else None
    ok = isinstance(base, dict) and rec.get("file") == DELTA_FILE and isinstance(rec.get("built_digest"), str) \
        and isinstance(rec.get("map_digest"), str) and isinstance(order, list) \
        and all(i is None or (isinstance(i, int) and not isinstance(i, bool)) for i in order) \
        and isinstance(base.get("source"), str) and isinstance(base.get("digest"), str) \
        and isinstance(base.get("path"), str | type(None))
    if not ok:
        raise ScaleclError(f"checkpoint record {f}: its 'delta' entry is damaged (it needs file {DELTA_FILE!r}, "
                           f"built_digest, layer_order, map_digest, and base with source, path and digest)")


def config_differences(config: dict[str, Any], recorded: dict[str, Any]) -> list[str]:
    """The fields (other than bookkeeping) in which a base's config differs from the recorded base config."""
    config = json.loads(json.dumps(config, default=str))  # as it would be recorded (integer keys become strings)
    keys = sorted((set(config) | set(recorded)) - _BOOKKEEPING)
    return [f"{k} {config.get(k)!r} (recorded {recorded.get(k)!r})" for k in keys if config.get(k) != recorded.get(k)]


def build_from_delta(p: Path, meta: dict[str, Any], method: Method, base: PreTrainedModel,
                     where: str) -> PreTrainedModel:
    """The model of delta checkpoint `p`: `method` applied to `base` (in place), its digests checked, then the
    stored tensors loaded; one ScaleclError if the base or the checkpoint does not fit (`where`: the base, named)."""
    rec = meta["delta"]
    differ = config_differences(base.config.to_dict(), meta["base_config"])
    if differ:
        raise ScaleclError(f"base {where} is not the model delta checkpoint {p} was trained on: its config differs in "
                           f"{'; '.join(differ[:3])}")
    model, split = apply_split(base, method)
    state = unique_state(model)
    got = tensor_digest({b: state[m] for m, b in split.from_base.items()})
    if got != rec["base"]["digest"]:
        why = (f"base {where} is not the model delta checkpoint {p} was trained on: the digest of the "
               f"{len(split.from_base)} tensors it takes from the base is {got}, {rec['base']['digest']} was recorded; "
               f"nothing was loaded")
        raise ScaleclError(f"{why} (give its base: base=...)", cli=f"{why} (give its base: --base)")
    if layer_order(model, split) != rec.get("layer_order") or map_digest(split) != rec.get("map_digest"):
        raise ScaleclError(f"delta checkpoint {p}: {method.name} places the base's tensors otherwise than when it was "
                           f"saved (layer order {layer_order(model, split)}, recorded {rec.get('layer_order')}); "
                           f"nothing was loaded")
    if tensor_digest({n: state[n] for n in split.built}) != rec["built_digest"]:
        raise ScaleclError(f"delta checkpoint {p}: the frozen tensors {method.name} builds itself differ from those "
                           f"recorded (a scalecl that builds the method otherwise?); nothing was loaded")
    file = p / DELTA_FILE
    header = model_weights_header(file, f"delta weights of {p}")
    stored = sorted(k for k in header if k != "__metadata__")
    if stored != sorted(split.trained):
        missing, unexpected = sorted(set(split.trained) - set(stored)), sorted(set(stored) - set(split.trained))
        raise ScaleclError(f"delta checkpoint {p} does not match its recorded method {method.name}: missing "
                           f"{missing[:3]}, unexpected {unexpected[:3]}")
    with torch.no_grad(), safe_open(str(file), framework="pt") as f:  # one tensor at a time: no second copy
        for name in split.trained:
            t, dest = f.get_tensor(name), state[name]
            if t.shape != dest.shape or t.dtype != dest.dtype:
                raise ScaleclError(f"delta checkpoint {p}: {name} is {t.dtype} {list(t.shape)}, the model's is "
                                   f"{dest.dtype} {list(dest.shape)}")
            dest.copy_(t)
    return model


def base_location(rec: dict[str, Any]) -> str | None:
    """Where the recorded base can be loaded from here: its folder (absolute, else as given), or the name as given
    when it is no folder (a hub id); None when it names nothing loadable."""
    for c in (rec.get("path"), rec.get("source")):
        if c and Path(c).expanduser().is_dir():
            return c
    source = rec.get("source") or ""
    return source if HUB_ID.match(source) and not os.path.exists(source) else None
