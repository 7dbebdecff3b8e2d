"""Checkpoint layouts: how a method's model is written into a folder and loaded back (scalecl.json `layout`).

A method names the layout of its full checkpoint (`Method.layout`); `save_model(..., delta=True)` writes the
delta layout instead. scalecl.training.checkpoint asks the layout what to write, which weight file to check and
how to load, and never compares a method's name. Every layout also loads with plain transformers / peft /
lm-eval, or refuses loudly; none loads as a model of the wrong function.

plain (base models, fft, freeze, llama-pro): a standard transformers folder.
  model.safetensors  weights (shared/tied tensors stored once)
  config.json        the model's transformers config (LLaMA Pro: the deeper layer count)
scale (scale-preserve/adapt/route): a transformers folder with remote code.
  model.safetensors  weights
  config.json        the widened config (widened sizes, its family's model_type) plus `auto_map` and `scale`
                     (spec, base sizes)
  modeling_scale.py, scale_surgery.py, scale_spec.py, scale_layers.py, scale_arch.py
                     scalecl's own SCALE model code (scalecl/modeling), copied verbatim: it needs only torch and
                     transformers, so `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` works
                     without scalecl; without trust_remote_code transformers raises (size mismatch)
delta (save_model(..., delta=True); Freeze, LLaMA Pro, SCALE): only what the method trains (training/delta.py).
  delta.safetensors  the tensors the method trains, under the model's names
  scalecl.json       also `delta`: the base as given (source) and its absolute folder (path), the digest of the
                     base tensors the model takes unchanged, the digest of the frozen tensors the method builds
                     no config.json and no model.safetensors: transformers' from_pretrained(dir) raises
lora: peft's own format.
  adapter_config.json, adapter_model.safetensors, README.md   written by peft's save_pretrained; the config's
                     base_model_name_or_path is the base's hub id or absolute folder
  config.json        the base's config (what the model runs at: AutoConfig and max-length lookups work)
  base/              the base model (plain layout) when it is not on disk elsewhere (e.g. a random-init base)
every layout:
  scalecl.json       how it was built: method and options, the base config, the base's source, the files written
                     (`files`: the top-level names; `written`: every file's path and fingerprint, size and hash;
                     `record_digest`: the sha256 of the rest of scalecl.json, so an edited value is found too)
  tokenizer files    when a tokenizer was given (LoRA: also in base/)

A new layout is one class here and one entry of LAYOUTS; the method that writes it names it in `Method.layout`.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import safetensors.torch as st
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel
from transformers.initialization import no_init_weights

from scalecl.common.errors import ScaleclError
from scalecl.common.readers import field
from scalecl.common.remote_code import NO_REMOTE_CODE, is_refusal, refusal_line
from scalecl.common.sources import HUB_ID
from scalecl.methods import REGISTRY, Method
from scalecl.training.checkpoint_record import read_meta, recorded_config
from scalecl.training.delta import DELTA_FILE, Split, base_location, build_from_delta, write_delta
from scalecl.training.delta import check_record as check_delta_record

LORA_BASE_DIR = "base"
# how a layout loads a base folder: scalecl.training.checkpoint.load_model (path, dtype=..., verify=...)
OpenFolder = Callable[..., PreTrainedModel]


class Saving(NamedTuple):
    """What a layout's writer takes besides the model and the folder it writes into."""

    out: Path  # where the checkpoint will be once in place
    method: Method | None
    split: Split | None  # the method's tensors by kind (delta.check_structure), when checked
    base_model: str | None  # where the base came from (hub id, folder or a description)
    tokenizer: Any


class Layout:
    """One checkpoint layout: how a model is written into a folder and loaded back, and how the folder's
    record and weights are checked. The defaults are the plain layout's."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "plain"  # how save_model's errors name a model of this layout
    weights: ClassVar[str] = "model.safetensors"  # the weight file whose header check_model_files reads
    weights_what: ClassVar[str] = "weights of checkpoint"
    plain: ClassVar[bool] = True  # its model is a plain transformers model, a base any method applies to
    checks_structure: ClassVar[bool] = True  # save_model checks the model against the method's skeleton
    takes_base: ClassVar[bool] = False  # load_model(..., base=...) gives the base it loads onto

    def owns(self, model: torch.nn.Module) -> bool:
        """Whether a model in memory has this layout's structure (a layout a method's structure needs)."""
        return False

    def base_config(self, model: torch.nn.Module) -> dict[str, Any]:
        """The config a model of this layout is rebuilt from when no method recorded one: its own."""
        return model.config.to_dict()

    def check_record(self, meta: dict[str, Any], f: Path) -> None:
        """The record's layout is its method's (method_layout), or one error naming the scalecl.json `f`."""
        method = meta.get("method")
        expected = (method_layout(method) or PLAIN).name
        if self.name != expected:
            raise ScaleclError(f"checkpoint record {f}: layout {self.name!r} does not match its method {method!r} "
                               f"(which writes {expected!r}); the record was edited or damaged")

    def write(self, model: PreTrainedModel, folder: Path, saving: Saving) -> dict[str, Any]:
        """Write the model's files into `folder`; the fields this layout adds to scalecl.json."""
        raise NotImplementedError

    def load(self, p: Path, meta: dict[str, Any], method: Method | None, base,
             open_folder: OpenFolder) -> PreTrainedModel:
        """The model of checkpoint `p` (its files and record checked): `base` is what load_model was given."""
        raise NotImplementedError

    def stored_base(self, p: Path) -> Path | None:
        """The folder inside checkpoint `p` where it stores its base, if the layout has one."""
        return None


class PlainLayout(Layout):
    """A transformers folder: the model's config and weights."""

    name: ClassVar[str] = "plain"

    def write(self, model: PreTrainedModel, folder: Path, saving: Saving) -> dict[str, Any]:
        write_plain(model, folder)
        return {}

    def load(self, p: Path, meta: dict[str, Any], method: Method | None, base,
             open_folder: OpenFolder) -> PreTrainedModel:
        """Rebuilt as every full checkpoint is: the recorded base config, then the method's structure (without its
        initialisation), then the saved weights, loaded strictly."""
        with no_init_weights():
            model = AutoModelForCausalLM.from_config(recorded_config(meta, p), dtype=getattr(torch, meta.get("dtype", "float32")))
        model.tie_weights()  # skeletons built without init are not tied yet
        if method is not None:
            model = method.apply(model, init_weights=False)
        try:
            missing, unexpected = st.load_model(model, str(p / "model.safetensors"), strict=False)
        except RuntimeError as e:  # a tensor of the wrong shape
            raise ScaleclError(f"checkpoint {p} does not match its recorded method ({str(e).splitlines()[0]})"
                               ) from None
        if missing or unexpected:
            raise ScaleclError(
                f"checkpoint {p} does not match its recorded method: missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"
            )
        return model


class ScaleLayout(PlainLayout):
    """A widened model: the plain layout's weights with SCALE's config and model code (remote code)."""

    name: ClassVar[str] = "scale"
    kind: ClassVar[str] = "SCALE"
    plain: ClassVar[bool] = False

    def owns(self, model: torch.nn.Module) -> bool:
        return getattr(model, "scale_spec", None) is not None

    def base_config(self, model: torch.nn.Module) -> dict[str, Any]:
        """A widened model loaded through remote code: its config with the widening undone."""
        d = {k: v for k, v in model.config.to_dict().items() if k not in ("scale", "auto_map", "architectures")}
        d.update(model.scale_base_sizes)
        return d

    def write(self, model: PreTrainedModel, folder: Path, saving: Saving) -> dict[str, Any]:
        """Weights, the remote-code config and the standalone model code (copied verbatim)."""
        from scalecl import modeling
        from scalecl.modeling.modeling_scale import remote_config

        st.save_model(model, str(folder / "model.safetensors"))
        remote_config(model).to_json_file(str(folder / "config.json"), use_diff=False)
        src = Path(modeling.__file__).parent
        for name in modeling.REMOTE_CODE_FILES:
            shutil.copyfile(src / name, folder / name)
        return {}


class LoraLayout(Layout):
    """peft's adapter files, the base's config, and the base itself in base/ unless it is a hub id or a folder."""

    name: ClassVar[str] = "lora"
    kind: ClassVar[str] = "LoRA"
    weights: ClassVar[str] = "adapter_model.safetensors"
    weights_what: ClassVar[str] = "adapter weights of"
    plain: ClassVar[bool] = False
    checks_structure: ClassVar[bool] = False  # a peft model: its adapter is checked against the options at load

    def owns(self, model: torch.nn.Module) -> bool:
        from peft import PeftModel

        return isinstance(model, PeftModel)

    def base_config(self, model: torch.nn.Module) -> dict[str, Any]:
        return model.get_base_model().config.to_dict()

    def write(self, model, folder: Path, saving: Saving) -> dict[str, Any]:
        return {"lora_base": _write_lora(model, folder, saving.out, saving.base_model, saving.tokenizer)}

    def load(self, p: Path, meta: dict[str, Any], method: Method | None, base,
             open_folder: OpenFolder) -> PreTrainedModel:
        return _load_lora(p, meta, method, open_folder)

    def stored_base(self, p: Path) -> Path | None:
        return p / LORA_BASE_DIR


class DeltaLayout(Layout):
    """Only the tensors the method trains, and the identity of the base they apply to (scalecl.training.delta)."""

    name: ClassVar[str] = "delta"
    weights: ClassVar[str] = DELTA_FILE
    weights_what: ClassVar[str] = "delta weights of"
    plain: ClassVar[bool] = False
    takes_base: ClassVar[bool] = True

    def check_record(self, meta: dict[str, Any], f: Path) -> None:
        method = meta.get("method")
        if method not in REGISTRY or not REGISTRY[method].delta:
            raise ScaleclError(f"checkpoint record {f}: a delta checkpoint of method {method!r}, which has none; the "
                               f"record was edited or damaged")
        check_delta_record(meta.get("delta"), f)
        field(meta, "base_model", str, f, "checkpoint record")

    def write(self, model: PreTrainedModel, folder: Path, saving: Saving) -> dict[str, Any]:
        return {"delta": write_delta(model, saving.method, saving.split, folder, saving.base_model)}

    def load(self, p: Path, meta: dict[str, Any], method: Method | None, base,
             open_folder: OpenFolder) -> PreTrainedModel:
        return _load_delta(p, meta, method, base, open_folder)


PLAIN, SCALE, LORA, DELTA = PlainLayout(), ScaleLayout(), LoraLayout(), DeltaLayout()
LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (PLAIN, SCALE, LORA, DELTA)}


def method_layout(name: str | None) -> Layout | None:
    """The layout of a method's full checkpoint (no method: plain), or None for a name no method registers."""
    if name is None:
        return PLAIN
    cls = REGISTRY.get(name)
    return None if cls is None else LAYOUTS[cls.layout]


def layout_of_model(model: torch.nn.Module) -> Layout:
    """The layout a model in memory is written in: the one that owns its structure, else plain."""
    return next((layout for layout in LAYOUTS.values() if layout.owns(model)), PLAIN)


def record_layout(meta: dict[str, Any]) -> Layout | None:
    """The layout a checkpoint record names (an older record names none: plain), None for an unknown name."""
    return LAYOUTS.get(meta.get("layout", PLAIN.name))


def stored_base(p: Path, meta: dict[str, Any]) -> Path | None:
    """The folder inside checkpoint `p` where its layout stores its base (LoRA's base/), if any."""
    layout = record_layout(meta)
    return None if layout is None else layout.stored_base(p)


# ---------------------------------------------------------------------------------------------------------
# Writing and loading


def write_plain(model: PreTrainedModel, folder: Path) -> None:
    folder.mkdir(exist_ok=True)
    st.save_model(model, str(folder / "model.safetensors"))
    model.config.to_json_file(str(folder / "config.json"))


def _lora_base_source(base_model: str | None, out: Path) -> str | None:
    """The LoRA base as peft should record it (hub id or absolute folder), or None if it must be stored."""
    if not base_model:
        return None
    p = Path(base_model).expanduser()
    if p.is_dir():
        real = p.resolve()
        if real == out.resolve() or out.resolve() in real.parents:
            return None  # replaced by this very save
        meta = read_meta(real)
        layout = method_layout(meta.get("method")) if meta is not None else PLAIN
        plain = (real / "config.json").is_file() and layout is not None and layout.plain
        return str(real) if plain else None
    if HUB_ID.match(base_model) and not p.exists():
        return base_model
    return None


def _plain_base_of(model) -> PreTrainedModel:
    """The LoRA model's base as a plain transformers model sharing its tensors (the LoRA layers left out)."""
    inner = model.get_base_model()
    config = AutoConfig.for_model(**model.scalecl_base_config) if getattr(model, "scalecl_base_config", None) \
        else copy.deepcopy(inner.config)
    sd = {k.replace(".base_layer.", "."): v for k, v in inner.state_dict().items() if ".lora_" not in k}
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=next(model.parameters()).dtype)
    plain.load_state_dict(sd, strict=True, assign=True)
    return plain


def _write_lora(model, folder: Path, out: Path, base_model: str | None, tokenizer) -> str:
    """peft's adapter files; the base itself into base/ unless it is a hub id or a plain folder. Returns the base."""
    source = _lora_base_source(base_model, out)
    if source is None:
        write_plain(_plain_base_of(model), folder / LORA_BASE_DIR)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(folder / LORA_BASE_DIR))
        source = str(out / LORA_BASE_DIR)  # where it will be once the checkpoint is in place
    cfg = model.peft_config["default"]
    saved = cfg.base_model_name_or_path, cfg.init_lora_weights
    try:  # a fresh build from this config starts at the base function; the weights overwrite it anyway
        cfg.base_model_name_or_path, cfg.init_lora_weights = source, True
        model.save_pretrained(str(folder), save_embedding_layers=False)
    finally:
        cfg.base_model_name_or_path, cfg.init_lora_weights = saved
    # the base's config, so that config readers (max length, sizes) work; plain from_pretrained(dir) then
    # looks for base weights beside the adapter and raises, instead of fetching the recorded base
    model.get_base_model().config.to_json_file(str(folder / "config.json"))
    return source


def _load_delta(p: Path, meta: dict[str, Any], method: Method, base, open_folder: OpenFolder) -> PreTrainedModel:
    """The base (given, else the recorded one) with the method applied, checked, and the stored tensors loaded."""
    dtype = getattr(torch, meta.get("dtype", "float32"))
    if isinstance(base, PreTrainedModel):
        return build_from_delta(p, meta, method, base.to(dtype), "(the model given)")
    rec = meta["delta"]["base"]
    source = str(base) if base is not None else base_location(rec)
    if source is None:
        raise ScaleclError(f"delta checkpoint {p} needs its base, {rec['source']!r}, which is neither a folder here nor "
                           f"a hub id; give it with base=... (a folder, hub id or model)",
                           cli=f"delta checkpoint {p} needs its base, {rec['source']!r}, which is neither a folder "
                           f"here nor a hub id; give it with --base")
    if Path(source).expanduser().is_dir():
        # its weights are checked below, tensor by tensor, against the recorded digest: no file pass first
        model = open_folder(Path(source).expanduser(), dtype=dtype, verify=False)
    else:
        from scalecl.models.build import load_base_model

        model = load_base_model(source, dtype)
    return build_from_delta(p, meta, method, model, source)


def _load_lora(p: Path, meta: dict[str, Any], method: Method, open_folder: OpenFolder) -> PreTrainedModel:
    """Base model, LoRA re-applied from the recorded options, adapter weights loaded strictly."""
    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict

    source = str(p / LORA_BASE_DIR) if (p / LORA_BASE_DIR).is_dir() else meta.get("lora_base")
    if not source:
        raise ScaleclError(f"LoRA checkpoint {p} records no base model")
    dtype = getattr(torch, meta.get("dtype", "float32"))
    if Path(source).is_dir():
        base = open_folder(source, dtype=dtype)
    else:
        try:
            from scalecl.common.hub import before_hub_load

            before_hub_load(source)  # no network: one line at once instead of a minute of retries
            base = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **NO_REMOTE_CODE)
        except (OSError, ValueError) as e:
            if is_refusal(e):
                raise ScaleclError(refusal_line(source, "base model")) from None
            raise ScaleclError(f"cannot load the base {source} of LoRA checkpoint {p} ({type(e).__name__})") from None
    want = {k: meta["base_config"].get(k) for k in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers")}
    got = {k: getattr(base.config, k, None) for k in want}
    if got != want:
        raise ScaleclError(f"base {source} of LoRA checkpoint {p} is not the model it was trained on: {got} vs {want}")
    model = method.apply(base, init_weights=False)
    sd = st.load_file(str(p / "adapter_model.safetensors"))
    expected = set(get_peft_model_state_dict(model, save_embedding_layers=False))
    if set(sd) != expected:
        raise ScaleclError(f"LoRA checkpoint {p} does not match its recorded options: missing "
                           f"{sorted(expected - set(sd))[:3]}, unexpected {sorted(set(sd) - expected)[:3]}")
    set_peft_model_state_dict(model, sd)
    return model
