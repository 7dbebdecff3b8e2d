"""Save any model the suite builds (plain, baseline, upscaled) and load it back through one function.

What a checkpoint folder holds depends on its layout (`layout` in scalecl.json: plain, scale, lora or delta),
which the method that built the model names (`Method.layout`); scalecl.training.layouts describes each one and
writes and loads it. This module does what is the same for every layout: where a checkpoint may be written, the
atomic write with its record (scalecl.json, scalecl.training.checkpoint_record), and the checks before loading.

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

import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from scalecl.common.errors import ScaleclError
from scalecl.common.files import (
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
from scalecl.common.readers import check_weights_folder, field, model_weights_header
from scalecl.methods import Method, get_method
from scalecl.methods.base import method_of_model
from scalecl.training.checkpoint_record import (
    META_FILE,
    find_damage,
    read_meta,
    record_digest,
    recorded_config,
)
from scalecl.training.delta import check_delta_method, check_structure
from scalecl.training.layouts import DELTA, LAYOUTS, Layout, Saving, layout_of_model, record_layout

__all__ = ["FORMAT_VERSION", "META_FILE", "STEP_RECORD", "check_checkpoint_dest", "check_model_files",
           "check_not_step", "find_damage", "load_model", "read_meta", "record_digest", "save_model"]

FORMAT_VERSION = 3  # what this scalecl reads; it writes 2, and 3 for a delta checkpoint (older ones refuse those)
_WRITTEN_VERSION = 2
_DTYPES = ("float32", "float16", "bfloat16", "float64")


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
    layout = layout_of_model(model)
    method = _resolve_method(model, method, layout)
    base_config = _base_config_of(model, method, layout)
    split = check_structure(model, method, base_config) if method is not None and layout.checks_structure else None
    if delta:
        check_delta_method(method, base_model)
        layout = DELTA
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temporary(out.parent, f".{out.name}.tmp-{os.getpid()}-")  # marked: the suite's, if left by a kill
    try:
        meta: dict[str, Any] = {
            "format_version": FORMAT_VERSION if delta else _WRITTEN_VERSION,
            "method": method.name if method else None,
            "options": method.options() if method else {},
            "layout": layout.name,
            "base_model": base_model,
            "base_config": base_config,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            **(extra or {}),
        }
        meta.update(layout.write(model, tmp, Saving(out, method, split, base_model, tokenizer)))
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


def _resolve_method(model, method: Method | None, layout: Layout) -> Method | None:
    """The method that built `model`: checked against the model when given (its layout, Method.check_model),
    else as the model shows it (Method.from_model; None: a plain model)."""
    if method is None:
        return method_of_model(model)
    if LAYOUTS.get(method.layout) is not layout:
        raise ScaleclError(f"method {method.name} does not match the model given to save_model ({layout.kind} model)")
    method.check_model(model)
    return method


def _base_config_of(model, method: Method | None, layout: Layout) -> dict[str, Any]:
    """The config the checkpoint is rebuilt from: the one the method started from, else the model's own."""
    base = getattr(model, "scalecl_base_config", None)
    if method is not None and base:
        return base
    return layout.base_config(model)


# ---------------------------------------------------------------------------------------------------------
# Loading


def _check_meta(meta: dict[str, Any], p: Path) -> None:
    """The fields load_model uses, of the right values (read_meta checked their types), or one error naming
    the scalecl.json; the layout checks its own (Layout.check_record)."""
    f, what = p / META_FILE, "checkpoint record"
    version = meta.get("format_version", 1)
    if not 1 <= version <= FORMAT_VERSION:
        raise ScaleclError(f"{what} {f}: format version {version} is not one this scalecl reads (1..{FORMAT_VERSION}); "
                           f"was it written by a newer scalecl?")
    layout = record_layout(meta)
    if layout is None:
        raise ScaleclError(f"{what} {f}: unknown layout {meta['layout']!r}")
    layout.check_record(meta, f)
    if meta.get("dtype", "float32") not in _DTYPES:
        raise ScaleclError(f"{what} {f}: unknown dtype {meta['dtype']!r} (one of {', '.join(_DTYPES)})")
    field(meta, "base_config", dict, f, what)


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
    recorded_config(meta, p)
    layout = record_layout(meta)
    model_weights_header(p / layout.weights, f"{layout.weights_what} {p}")
    return meta


def load_model(path: str | os.PathLike, dtype: torch.dtype | None = None, device: str | None = None, *,
               verify: bool = True, base: str | os.PathLike | PreTrainedModel | None = None) -> PreTrainedModel:
    """Load any checkpoint the suite wrote (or a plain transformers directory), ready to use (eval mode).

    A checkpoint the suite wrote is verified first: every file it records must still be what was written
    (size and content hash), else one error naming the file (`verify=False`: the caller has just verified
    it). Its layout then loads it (scalecl.training.layouts): a full checkpoint is rebuilt from the recorded
    base config and method options, then the weights are loaded strictly, so every parameter name and shape
    must match. A LoRA checkpoint in peft's format loads its base (base/, else the recorded folder or hub id)
    and then the adapter weights. A delta checkpoint loads its base (`base`: a folder, hub id or model, which
    is then used in place; else the recorded one), refuses one whose weights' digest is not the recorded one,
    and loads the trained tensors on top.
    """
    p = Path(path)
    meta = check_model_files(p, verify=verify)
    layout = record_layout(meta) if meta is not None else None
    if base is not None and not (layout is not None and layout.takes_base):
        raise ScaleclError(f"checkpoint {p} is not a delta checkpoint: it takes no base (base=...)",
                           cli=f"checkpoint {p} is not a delta checkpoint: it takes no --base")
    if meta is None:  # a plain transformers checkpoint (safetensors only: checked above)
        return _load_plain(p, dtype)
    method = get_method(meta["method"], **meta.get("options", {})) if meta.get("method") else None
    model = layout.load(p, meta, method, base, load_model)
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
