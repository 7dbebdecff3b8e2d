"""Save any model the suite builds (plain, baseline, upscaled) and load it back through one function.

Every checkpoint also loads with plain transformers / peft / lm-eval, or refuses loudly; none loads as a
model of the wrong function. Layouts (`layout` in scalecl.json):

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

Writing never deletes anything the suite did not write. A folder that is not empty and holds no scalecl.json
is refused; an existing checkpoint is replaced only with overwrite=True, and only if every file in it is one
its scalecl.json records with the fingerprint it still has (scalecl.common.files: a name alone proves nothing; a
checkpoint written before fingerprints were recorded is replaced only if it holds no more than weights,
config, scalecl.json and the SCALE model code). Everything is written to a hidden temporary sibling `.{name}.tmp-{pid}-{random}` and renamed
into place when complete; a replaced checkpoint is first renamed to `.{name}.old-{pid}-{random}` and removed
after the new one is in place. A crash leaves the old or the new checkpoint plus at most such a sibling, which
the next save to the same place removes (or, if the crash fell between the two renames, renames back).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

import safetensors.torch as st
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel
from transformers.initialization import no_init_weights

from scalecl.common.errors import ScaleclError
from scalecl.common.files import (
    changed_file,
    check_path_length,
    check_writable_dir,
    fingerprints,
    is_marked_temporary,
    large_digests,
    make_temporary,
    os_errors_named,
    unmark,
    unowned_entries,
)
from scalecl.common.locks import locked
from scalecl.common.readers import check_weights_folder, field, model_weights_header, read_json
from scalecl.common.remote_code import NO_REMOTE_CODE, is_refusal, refusal_line
from scalecl.methods import REGISTRY, Method, get_method
from scalecl.training.delta import (
    DELTA_FILE,
    base_location,
    build_from_delta,
    check_delta_method,
    check_record,
    check_structure,
    write_delta,
)

FORMAT_VERSION = 3  # what this scalecl reads; it writes 2, and 3 for a delta checkpoint (older ones refuse those)
_WRITTEN_VERSION = 2
META_FILE = "scalecl.json"
LORA_BASE_DIR = "base"
_DTYPES = ("float32", "float16", "bfloat16", "float64")
_PLAIN_METHODS = (None, "fft", "freeze", "llama-pro")


# ---------------------------------------------------------------------------------------------------------
# Where a checkpoint may be written


def check_checkpoint_dest(out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Refuse, in one line and before any work, an output folder whose writing could lose the user's data.

    Refused: the current folder or one of its ancestors, a file, a path under a file, a symbolic link to
    nothing or to a file, a non-empty folder that is not a scalecl checkpoint, a cached stage (a checkpoint whose
    record holds `stage`, in a cache that later runs read), and an existing checkpoint unless overwrite=True (and
    then still if it holds files the suite did not write). An empty folder is
    filled. A symbolic link to a folder means that folder, as for every `--out` of the suite (the link
    itself is never replaced). Stale temporary siblings of earlier crashed saves are cleaned up here.
    """
    out = Path(out_dir).expanduser()
    check_path_length(out, "output folder")  # first: stat() itself fails on too long a name
    if out.is_symlink():
        if not out.exists():
            raise ScaleclError(f"output folder {out_dir} is a symbolic link to nothing ({os.readlink(out)}); give a "
                               f"folder")
        if not out.is_dir():
            raise ScaleclError(f"output folder {out_dir} is a symbolic link to a file, not a folder")
        out = Path(os.path.realpath(out))  # the folder it names: written there, the link left as it is
    where = Path(os.path.abspath(out))
    real, cwd = where.resolve(), Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        raise ScaleclError(f"output folder {out_dir} is the current folder or contains it: give a new or empty folder")
    for parent in real.parents:
        if parent.exists() and not parent.is_dir():
            raise ScaleclError(f"output folder {out_dir} lies under {parent}, which is a file")
    if out.exists() and not out.is_dir():
        raise ScaleclError(f"output folder {out_dir} is a file")
    _clean_stale_siblings(where)
    if out.is_dir() and any(out.iterdir()):
        why = ""
        try:
            meta = read_meta(out) if not (out / META_FILE).is_symlink() else None
        except ScaleclError as e:  # an unreadable scalecl.json: not something to replace blindly
            meta, why = None, f" ({e})"
        if meta is None:
            raise ScaleclError(f"output folder {out_dir} is not empty and holds no scalecl checkpoint{why}; nothing "
                               f"was written (give a new or empty folder)")
        if "stage" in meta:  # a cached stage (train-cpt's base, train-bio's stages): every later run reads it
            raise ScaleclError(f"output folder {out_dir} is a cache entry (a cached stage, which later runs read "
                               f"as it is); writing there would replace it for them: give a folder outside the cache")
        if not overwrite:
            held = f"output folder {out_dir} holds a scalecl checkpoint"
            raise ScaleclError(f"{held}; pass overwrite=True to replace it", cli=f"{held}; pass --overwrite to replace it")
        foreign = _foreign_entries(out, meta)
        if foreign and not isinstance(meta.get("written"), dict):
            raise ScaleclError(f"output folder {out_dir} holds a checkpoint of an older scalecl that records no "
                               f"file fingerprints, so its files cannot be proven the suite's; remove the folder "
                               f"yourself or choose another")
        if foreign:
            raise ScaleclError(f"output folder {out_dir} holds files scalecl did not write ({', '.join(foreign[:3])}); "
                               f"move them away to replace the checkpoint")
    # last (a refused folder of the user's is not even touched by the trial): read-only, no permission, /sys
    check_writable_dir(out, "output folder", replaces=True)
    return where


def _foreign_entries(folder: Path, meta: dict[str, Any]) -> list[str]:
    """Top-level entries of a checkpoint folder that the suite cannot prove it wrote (scalecl.common.files)."""
    written = meta.get("written")
    if isinstance(written, dict):
        return unowned_entries(folder, written, allow=(META_FILE,))
    # an older checkpoint records no fingerprints: a name alone proves nothing (a user's own weights beside an
    # old scalecl.json carry the same names), so none of its files counts as the suite's
    return sorted(p.name for p in folder.iterdir() if p.name != META_FILE) or [META_FILE]


def _sibling_re(out: Path) -> re.Pattern:
    return re.compile(rf"\.{re.escape(out.name)}\.(tmp|old)-(\d+)-\w+")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # left behind by an earlier save of this very process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clean_stale_siblings(out: Path) -> None:
    """Remove `.{name}.tmp-*` / `.{name}.old-*` left by a crashed save; restore an `.old` whose replacement never
    landed. Only what the suite provably wrote: a `.tmp` folder holding its mark (scalecl.common.files.make_temporary),
    an `.old` folder that is a whole suite checkpoint (its scalecl.json proves every file); a user's folder
    named so stays."""
    if not out.parent.is_dir():
        return
    pattern = _sibling_re(out)
    for p in sorted(out.parent.iterdir()):
        m = pattern.fullmatch(p.name)
        if not m or not p.is_dir() or p.is_symlink() or _pid_alive(int(m[2])) or not _stale_is_ours(p, m[1]):
            continue
        if m[1] == "old" and not out.exists():
            os.rename(p, out)  # the crash fell between moving the old checkpoint aside and moving the new one in
        else:
            shutil.rmtree(p, ignore_errors=True)


def _stale_is_ours(p: Path, kind: str) -> bool:
    """Whether a stale sibling is the suite's: a marked temporary, or an old checkpoint its scalecl.json proves."""
    if kind == "tmp":
        return is_marked_temporary(p)
    try:
        meta = read_meta(p)
    except ScaleclError:
        return False
    return isinstance(meta, dict) and isinstance(meta.get("written"), dict) and not _foreign_entries(p, meta)


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished temporary folder to `out`, moving an existing checkpoint aside first."""
    if out.is_dir() and any(out.iterdir()):  # an existing checkpoint (check_checkpoint_dest cleared it)
        old = out.parent / f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        os.replace(tmp, out)  # onto a missing or empty folder
    except OSError:
        if not out.is_dir() or any(out.iterdir()):
            raise
        out.rmdir()
        os.replace(tmp, out)


# ---------------------------------------------------------------------------------------------------------
# Saving


def save_model(
    model: PreTrainedModel,
    out_dir: str | os.PathLike,
    method: Method | None = None,
    base_model: str | None = None,
    tokenizer=None,
    extra: dict[str, Any] | None = None,
    *,
    overwrite: bool = False,
    delta: bool = False,
) -> Path:
    """Write a checkpoint atomically (temp sibling + rename); nothing the suite did not write is ever touched.

    method: what built the model (None: inferred for SCALE and LoRA models, else a plain model); a method given
    must be the one that built the model (the same tensors, names and shapes), else one ScaleclError.
    base_model: where the base came from (hub id, folder or a description such as "random:llama"); a LoRA
    checkpoint records it for peft, and stores the base itself when it is not a hub id or plain folder.
    overwrite: replace an existing checkpoint of the suite at out_dir (never anything else).
    delta: store only the tensors the method trains (Freeze, LLaMA Pro, SCALE), with the base's identity
    (base_model, required, and a digest of its weights); load_model rebuilds the model from that base.
    """
    check_checkpoint_dest(out_dir, overwrite)  # first: a path that cannot be a folder takes no lock either
    with locked(out_dir, wait=False, what=f"checkpoint folder {out_dir}"), os_errors_named(Path(out_dir)):  # one writer
        return _save_model(model, out_dir, method, base_model, tokenizer, extra, overwrite, delta)


def _save_model(model: PreTrainedModel, out_dir: str | os.PathLike, method: Method | None, base_model: str | None,
                tokenizer, extra: dict[str, Any] | None, overwrite: bool, delta: bool) -> Path:
    out = check_checkpoint_dest(out_dir, overwrite)
    method = _resolve_method(model, method)
    layout = "scale" if getattr(model, "scale_spec", None) is not None else "lora" if _is_peft(model) else "plain"
    base_config = _base_config_of(model, method)
    split = check_structure(model, method, base_config) if method is not None and layout != "lora" else None
    if delta:
        check_delta_method(method, base_model)
        layout = "delta"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temporary(out.parent, f".{out.name}.tmp-{os.getpid()}-")  # marked: the suite's, if left by a kill
    try:
        meta: dict[str, Any] = {
            "format_version": FORMAT_VERSION if delta else _WRITTEN_VERSION,
            "method": method.name if method else None,
            "options": method.options() if method else {},
            "layout": layout,
            "base_model": base_model,
            "base_config": base_config,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            **(extra or {}),
        }
        if layout == "delta":
            meta["delta"] = write_delta(model, method, split, tmp, base_model)
        elif layout == "scale":
            _write_scale(model, tmp)
        elif layout == "lora":
            meta["lora_base"] = _write_lora(model, tmp, out, base_model, tokenizer)
        else:
            _write_plain(model, tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        unmark(tmp)  # complete: from here on its files are the checkpoint's (a kill now leaves an unmarked folder)
        meta["files"] = sorted({p.name for p in tmp.iterdir()} | {META_FILE})
        meta["written"] = fingerprints(tmp)  # what a later overwrite may replace: these files, unchanged
        meta["digests"] = large_digests(tmp)  # with the fingerprints: what reading verifies, every byte
        meta["record_digest"] = record_digest(meta)  # the record itself: an edited option or size is found too
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, default=str))
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _is_peft(model) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def _resolve_method(model, method: Method | None) -> Method | None:
    """The method that built `model`: checked against the model when given, inferred for SCALE and LoRA."""
    from scalecl.methods.scale import ScaleMethod

    is_scale, is_lora = getattr(model, "scale_spec", None) is not None, _is_peft(model)
    if method is None:
        if is_scale:  # the options asked for (scalecl's upscale), else the widening as built (remote code)
            cfg = (getattr(model, "scale_config", None) or model.scale_spec).to_dict()
            return get_method(f"scale-{cfg.pop('variant')}", **cfg)
        if is_lora:
            c = model.peft_config["default"]
            return get_method("lora", rank=c.r, alpha=c.lora_alpha, dropout=c.lora_dropout)
        return None
    if isinstance(method, ScaleMethod) != is_scale or (method.name == "lora") != is_lora:
        raise ScaleclError(f"method {method.name} does not match the model given to save_model "
                           f"({'SCALE' if is_scale else 'LoRA' if is_lora else 'plain'} model)")
    if is_scale:
        _check_scale_method(model, method)
    return method


# what a SCALE checkpoint's structure and forward depend on (init and embed_init only decide the first weights)
_SCALE_BUILT = ("variant", "hidden_up", "ffn_up", "l_fp", "collab", "tau", "router")


def _check_scale_method(model, method) -> None:
    """A SCALE method given to save_model must describe the widening the model has (else the checkpoint would
    rebuild another model at load)."""
    from scalecl.methods.scale.upscale import to_spec

    want = to_spec(method.config, model.config.num_hidden_layers).to_dict()
    have = model.scale_spec.to_dict()
    differ = [f"{k} {want[k]!r} (the model has {have[k]!r})" for k in _SCALE_BUILT if want[k] != have[k]]
    if differ:
        raise ScaleclError(f"method {method.name} does not match the model given to save_model: {', '.join(differ)}")


def _base_config_of(model, method: Method | None) -> dict[str, Any]:
    """The config the checkpoint is rebuilt from: the one the method started from, else the model's own."""
    base = getattr(model, "scalecl_base_config", None)
    if method is not None and base:
        return base
    if getattr(model, "scale_spec", None) is not None:  # loaded through remote code: undo the widening
        d = {k: v for k, v in model.config.to_dict().items() if k not in ("scale", "auto_map", "architectures")}
        d.update(model.scale_base_sizes)
        return d
    return (model.get_base_model() if _is_peft(model) else model).config.to_dict()


def _write_plain(model: PreTrainedModel, folder: Path) -> None:
    folder.mkdir(exist_ok=True)
    st.save_model(model, str(folder / "model.safetensors"))
    model.config.to_json_file(str(folder / "config.json"))


def _write_scale(model: PreTrainedModel, folder: Path) -> None:
    """Weights, the remote-code config and the standalone model code (copied verbatim)."""
    from scalecl import modeling
    from scalecl.modeling.modeling_scale import remote_config

    st.save_model(model, str(folder / "model.safetensors"))
    remote_config(model).to_json_file(str(folder / "config.json"), use_diff=False)
    src = Path(modeling.__file__).parent
    for name in modeling.REMOTE_CODE_FILES:
        shutil.copyfile(src / name, folder / name)


def _lora_base_source(base_model: str | None, out: Path) -> str | None:
    """The LoRA base as peft should record it (hub id or absolute folder), or None if it must be stored."""
    from scalecl.models.build import _HUB_ID

    if not base_model:
        return None
    p = Path(base_model).expanduser()
    if p.is_dir():
        real = p.resolve()
        if real == out.resolve() or out.resolve() in real.parents:
            return None  # replaced by this very save
        meta = read_meta(real)
        plain = (real / "config.json").is_file() and (meta is None or meta.get("method") in _PLAIN_METHODS)
        return str(real) if plain else None
    if _HUB_ID.match(base_model) and not p.exists():
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
        _write_plain(_plain_base_of(model), folder / LORA_BASE_DIR)
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


# ---------------------------------------------------------------------------------------------------------
# Loading


# the fields of scalecl.json and their JSON types: read_meta checks every one present, so no caller meets a
# wrongly typed field (a method that is a number, options that are a list); _check_meta adds their values
_META_TYPES: dict[str, type | tuple] = {
    "format_version": int, "method": (str, type(None)), "options": dict, "layout": str, "dtype": str,
    "base_model": (str, type(None)), "base_config": dict, "files": list, "written": dict, "digests": dict,
    "lora_base": str, "delta": dict,
    "stage": dict, "merged_from": str, "merged_method": (str, type(None)), "merged_options": dict,
    "train_seq_len": int,  # the tokens per sequence it was trained at (train-cpt): eval-ppl's default length
    "record_digest": str,  # sha256 of the rest of the record (record_digest): find_damage() finds an edited value
}


def read_meta(path: str | os.PathLike) -> dict[str, Any] | None:
    """The scalecl.json of a checkpoint folder, or None for a folder the suite did not write; a scalecl.json
    that is not a JSON object, or whose fields (_META_TYPES) are of the wrong JSON type, is one ScaleclError
    naming it."""
    f = Path(path) / META_FILE
    if not (f.exists() or f.is_symlink()):
        return None
    meta = read_json(f, "checkpoint record")
    for key, kind in _META_TYPES.items():
        field(meta, key, kind, f, "checkpoint record", None)
    return meta


def _check_meta(meta: dict[str, Any], p: Path) -> None:
    """The fields load_model uses, of the right values (read_meta checked their types), or one error naming
    the scalecl.json."""
    f, what = p / META_FILE, "checkpoint record"
    version = meta.get("format_version", 1)
    if not 1 <= version <= FORMAT_VERSION:
        raise ScaleclError(f"{what} {f}: format version {version} is not one this scalecl reads (1..{FORMAT_VERSION}); "
                           f"was it written by a newer scalecl?")
    layout = meta.get("layout", "plain")
    if layout not in ("plain", "scale", "lora", "delta"):
        raise ScaleclError(f"{what} {f}: unknown layout {meta['layout']!r}")
    method = meta.get("method")
    expected = "scale" if str(method).startswith("scale-") else "lora" if method == "lora" else "plain"
    if layout == "delta":
        if method not in REGISTRY or not REGISTRY[method].delta:
            raise ScaleclError(f"{what} {f}: a delta checkpoint of method {method!r}, which has none; the record was "
                               f"edited or damaged")
        check_record(meta.get("delta"), f)
        field(meta, "base_model", str, f, what)
    elif layout != expected:
        raise ScaleclError(f"{what} {f}: layout {layout!r} does not match its method {method!r} (which writes "
                           f"{expected!r}); the record was edited or damaged")
    if meta.get("dtype", "float32") not in _DTYPES:
        raise ScaleclError(f"{what} {f}: unknown dtype {meta['dtype']!r} (one of {', '.join(_DTYPES)})")
    field(meta, "base_config", dict, f, what)


def _base_config(meta: dict[str, Any], p: Path):
    """The recorded base config as a transformers config, its sizes checked, or one error naming the file."""
    from scalecl.models.build import check_config_sizes

    where = f"checkpoint record {p / META_FILE}"
    check_config_sizes(meta["base_config"], where)
    try:
        config = AutoConfig.for_model(**meta["base_config"])
    except Exception as e:  # ValueError, TypeError, transformers' field validation: not a config it can build
        raise ScaleclError(f"{where}: its base_config is not a transformers config ({str(e).splitlines()[0]})") from None
    check_config_sizes(config, where)
    return config


def record_digest(meta: dict[str, Any]) -> str:
    """The sha256 of a scalecl.json's content without its own `record_digest`: its JSON as read back, keys sorted."""
    body = json.loads(json.dumps({k: v for k, v in meta.items() if k != "record_digest"}, default=str))
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def find_damage(path: str | os.PathLike, meta: dict[str, Any] | None = None) -> str | None:
    """How a checkpoint the suite wrote differs from what it wrote (its scalecl.json edited, checked against the
    digest of its content it records; a file changed, truncated or gone, checked against the fingerprints and
    digests it records), or None when intact. A folder without a record, or a checkpoint of an older scalecl that
    records no fingerprints (or no digest of its record), has nothing (more) to verify."""
    p = Path(path)
    meta = read_meta(p) if meta is None else meta
    if meta is None:
        return None
    recorded = meta.get("record_digest")
    if recorded is not None and recorded != record_digest(meta):
        return (f"{p / META_FILE} differs from what was written (a value in it was changed: the digest of its "
                f"content it records does not match)")
    written = meta.get("written")
    return changed_file(p, written, meta.get("digests"), skip=(META_FILE,)) if isinstance(written, dict) else None


STEP_RECORD = "scalecl-checkpoint.json"  # a training checkpoint's record (training/run.py: CKPT_MANIFEST)


def check_not_step(p: Path) -> None:
    """A training checkpoint (a run's step folder: its record, training state and the model in `model/`) given
    as a model folder: one line naming the model inside it."""
    if (p / STEP_RECORD).is_file() and (p / "model" / META_FILE).is_file():
        raise ScaleclError(f"{p} is a training checkpoint (its model, optimizer and data state): its model is "
                           f"{p / 'model'}; give that folder")


def check_model_files(path: str | os.PathLike, *, verify: bool = True) -> dict[str, Any] | None:
    """Check a model folder's record and weight files (headers only, nothing loaded); its scalecl.json or None.

    A damaged scalecl.json, an empty or truncated safetensors file, a folder with only pickled weights: one
    ScaleclError naming the file, before any weights load (and before anything could be unpickled). With
    `verify`, a checkpoint the suite wrote is read only if every file it records is still what was written
    (`damage`); False where the caller has just verified it (a training checkpoint's own record)."""
    from scalecl.models.build import read_config

    p = Path(path)
    if not p.is_dir():
        raise ScaleclError(f"model path {path} does not exist or is not a directory")
    check_not_step(p)
    meta = read_meta(p)
    how = find_damage(p, meta) if verify and meta is not None else None
    if how is not None:
        raise ScaleclError(f"checkpoint {p} is damaged: {how} (verified against the fingerprints recorded when it "
                           f"was written); nothing was loaded: restore the file or write the checkpoint again")
    if meta is None or (p / "config.json").exists():  # what transformers reads, parsed as it will be
        read_config(p)
    if meta is None:
        check_weights_folder(p, "model folder")
        return None
    _check_meta(meta, p)
    _base_config(meta, p)
    if meta.get("layout") == "lora":
        model_weights_header(p / "adapter_model.safetensors", f"adapter weights of {p}")
    elif meta.get("layout") == "delta":
        model_weights_header(p / DELTA_FILE, f"delta weights of {p}")
    else:
        model_weights_header(p / "model.safetensors", f"weights of checkpoint {p}")
    return meta


def load_model(path: str | os.PathLike, dtype: torch.dtype | None = None, device: str | None = None, *,
               verify: bool = True, base: str | os.PathLike | PreTrainedModel | None = None) -> PreTrainedModel:
    """Load any checkpoint the suite wrote (or a plain transformers directory), ready to use (eval mode).

    A checkpoint the suite wrote is verified first: every file it records must still be what was written
    (size and content hash), else one error naming the file (`verify=False`: the caller has just verified
    it). The model is rebuilt from the recorded base config and method options, then the weights are loaded
    strictly, so every parameter name and shape must match. A LoRA checkpoint in peft's format loads its
    base (base/, else the recorded folder or hub id) and then the adapter weights. A delta checkpoint loads
    its base (`base`: a folder, hub id or model, which is then used in place; else the recorded one), refuses
    one whose weights' digest is not the recorded one, and loads the trained tensors on top.
    """
    p = Path(path)
    meta = check_model_files(p, verify=verify)
    if base is not None and (meta or {}).get("layout") != "delta":
        raise ScaleclError(f"checkpoint {p} is not a delta checkpoint: it takes no base (base=...)",
                           cli=f"checkpoint {p} is not a delta checkpoint: it takes no --base")
    if meta is None:  # a plain transformers checkpoint (safetensors only: checked above)
        return _load_plain(p, dtype)
    method = get_method(meta["method"], **meta.get("options", {})) if meta.get("method") else None
    if meta.get("layout") == "lora":
        model = _load_lora(p, meta, method)
    elif meta.get("layout") == "delta":
        model = _load_delta(p, meta, method, base)
    else:
        # Every checkpoint is rebuilt the same way: the recorded base config, then the method's structure
        # (without its initialisation), then the saved weights, loaded strictly.
        with no_init_weights():
            model = AutoModelForCausalLM.from_config(_base_config(meta, p), dtype=getattr(torch, meta.get("dtype", "float32")))
        model.tie_weights()  # skeletons built without init are not tied yet
        if method is not None:
            model = method.apply(model, init_weights=False)
        try:
            missing, unexpected = st.load_model(model, str(p / "model.safetensors"), strict=False)
        except RuntimeError as e:  # a tensor of the wrong shape
            raise ScaleclError(f"checkpoint {path} does not match its recorded method ({str(e).splitlines()[0]})"
                               ) from None
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


def _load_plain(p: Path, dtype: torch.dtype | None) -> PreTrainedModel:
    """A plain transformers folder (its weights already checked), or one error naming it."""
    from scalecl.models.build import load_plain_strict

    try:
        return load_plain_strict(str(p), dtype or torch.float32)
    except (TypeError, KeyError) as e:
        raise ScaleclError(f"cannot load the model in {p} ({type(e).__name__}: "
                           f"{(str(e).splitlines() or [''])[0][:160]})") from None


def _load_delta(p: Path, meta: dict[str, Any], method: Method, base) -> PreTrainedModel:
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
        model = load_model(Path(source).expanduser(), dtype=dtype, verify=False)
    else:
        from scalecl.models.build import load_base_model

        model = load_base_model(source, dtype)
    return build_from_delta(p, meta, method, model, source)


def _load_lora(p: Path, meta: dict[str, Any], method: Method) -> PreTrainedModel:
    """Base model, LoRA re-applied from the recorded options, adapter weights loaded strictly."""
    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict

    source = str(p / LORA_BASE_DIR) if (p / LORA_BASE_DIR).is_dir() else meta.get("lora_base")
    if not source:
        raise ScaleclError(f"LoRA checkpoint {p} records no base model")
    dtype = getattr(torch, meta.get("dtype", "float32"))
    if Path(source).is_dir():
        base = load_model(source, dtype=dtype)
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
