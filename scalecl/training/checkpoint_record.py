"""A checkpoint's record, scalecl.json: reading it with its fields' types checked, the base config it records,
and whether the folder is still what was written (`record_digest`, `damage`).

The writer and reader of the checkpoints themselves are scalecl.training.checkpoint and, per layout,
scalecl.training.layouts; both read records through this module.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from scalecl.common.errors import ScaleclError
from scalecl.common.files import changed_file
from scalecl.common.readers import field, read_json

META_FILE = "scalecl.json"

# the fields of scalecl.json and their JSON types: read_meta checks every one present, so no caller meets a
# wrongly typed field (a method that is a number, options that are a list); checkpoint.check_meta adds their values
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


def recorded_config(meta: dict[str, Any], p: Path):
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
