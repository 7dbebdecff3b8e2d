"""One reader for every file the suite reads: each failure is one ScaleclError naming the file.

Missing, unreadable (a folder, no permission), not UTF-8, invalid JSON, the wrong top-level type, a
truncated or empty safetensors file, a tensor of an unknown dtype: the caller gets one line that says which
file and what is wrong with it, never a traceback from json, safetensors or torch. A folder that holds only
pickled weights (`pytorch_model.bin`) is refused before anything could unpickle it.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

from scalecl.common.errors import ScaleclError

# safetensors dtypes and their sizes in bytes (sub-byte float types are packed; their sizes are rounded up)
SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
                      "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
                      "C64": 8, "F4": 1, "F6_E2M3": 1, "F6_E3M2": 1}
_SUB_BYTE_BITS = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}  # packed: bits per element
_MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header
PICKLED_WEIGHTS = ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack", "model.ckpt.index")


def _first_line(e: BaseException) -> str:
    text = getattr(e, "strerror", None) or str(e)
    return (text.splitlines() or [type(e).__name__])[0][:160]


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """The text of a file, or one error: missing, a folder, unreadable, not UTF-8."""
    p = Path(path)
    if not p.exists():
        raise ScaleclError(f"{what} {p} does not exist")
    if p.is_dir():
        raise ScaleclError(f"{what} {p} is a folder, not a file")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ScaleclError(f"{what} {p} is not UTF-8 text") from None
    except OSError as e:
        raise ScaleclError(f"{what} {p} cannot be read ({_first_line(e)})") from None


def parse_json(text: str, path: str | os.PathLike, what: str = "file", expect: type | None = dict) -> Any:
    """JSON text read from `path`, of the `expect` top-level type (None: any)."""
    try:
        doc = json.loads(text)
    except ValueError as e:  # JSONDecodeError, and numbers too large to convert
        raise ScaleclError(f"{what} {path} is not a JSON file (invalid JSON: {_first_line(e)})") from None
    except RecursionError:
        raise ScaleclError(f"{what} {path} is nested too deeply to read") from None
    if expect is not None and not isinstance(doc, expect):
        raise ScaleclError(f"{what} {path} holds a JSON {_json_type(doc)}, expected a JSON {_json_type(expect())}")
    return doc


def _json_type(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number")


def read_json(path: str | os.PathLike, what: str = "file", expect: type | None = dict) -> Any:
    """A JSON file whose top level is `expect` (dict by default; None: anything), or one error naming it."""
    return parse_json(read_text(path, what), path, what, expect)


def read_jsonl(path: str | os.PathLike, what: str = "log") -> list[dict]:
    """A JSON-lines file of objects (blank lines skipped), or one error naming the file and the line."""
    rows = []
    for i, line in enumerate(read_text(path, what).splitlines(), 1):
        if line.strip():
            rows.append(parse_json(line, f"{path} (line {i})", what, dict))
    return rows


def field(doc: dict, key: str, kind: type | tuple, path: str | os.PathLike, what: str = "file",
          default: Any = ...) -> Any:
    """doc[key] of type `kind` (a missing key: `default` if given), or one error naming the file and key."""
    if key not in doc:
        if default is not ...:
            return default
        raise ScaleclError(f"{what} {path} has no {key!r}")
    v = doc[key]
    if not isinstance(v, kind) or (isinstance(v, bool) and bool not in _tuple(kind)):
        names = " or ".join(_json_type(k()) if k is not type(None) else "null" for k in _tuple(kind))
        raise ScaleclError(f"{what} {path}: {key!r} is a JSON {_json_type(v)}, expected {names}")
    return v


def _tuple(kind: type | tuple) -> tuple:
    return kind if isinstance(kind, tuple) else (kind,)


def safetensors_header(path: str | os.PathLike, what: str = "weights") -> dict[str, Any]:
    """The header of a safetensors file, checked against the file: every tensor of a known dtype, its bytes
    as many as its shape needs and inside the file. An empty, truncated or damaged file is one error."""
    p = Path(path)
    if not p.is_file():
        raise ScaleclError(f"{what} {p} does not exist" if not p.exists() else f"{what} {p} is not a file")
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            raw = f.read(n) if n is not None and n <= min(_MAX_HEADER, size - 8) else None
    except OSError as e:
        raise ScaleclError(f"{what} {p} cannot be read ({_first_line(e)})") from None
    if size == 0:
        raise ScaleclError(f"{what} {p} is empty (0 bytes): the checkpoint is incomplete")
    if raw is None:
        raise ScaleclError(f"{what} {p} is truncated or not a safetensors file (bad header length)")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ScaleclError(f"{what} {p} is damaged or not a safetensors file (unreadable header)") from None
    if not isinstance(header, dict):
        raise ScaleclError(f"{what} {p} is damaged (its header is not a JSON object)")
    _check_tensors(header, size - 8 - len(raw), p, what)
    return header


FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # what a model's weights may be: the suite trains in these


def model_weights_header(path: str | os.PathLike, what: str = "weights") -> dict[str, Any]:
    """safetensors_header for a model's weights: every tensor also of a floating dtype (an integer or 8-bit
    tensor where a weight belongs would be cast silently on load: a quantized or foreign file)."""
    header = safetensors_header(path, what)
    for name, t in header.items():
        if name != "__metadata__" and t["dtype"] not in FLOAT_DTYPES:
            raise ScaleclError(f"{what} {path}: tensor {name!r} is {t['dtype']}, not a floating-point weight "
                               f"({', '.join(FLOAT_DTYPES)}); quantized or integer weights are not supported")
    return header


def _is_count(v: Any) -> bool:
    """A non-negative JSON integer (not a boolean): what safetensors reads as usize."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _check_tensors(header: dict, data_bytes: int, p: Path, what: str) -> None:
    """Refuse what the safetensors library refuses, with one line naming the file: a `__metadata__` that is
    not an object of strings, a tensor without a known dtype, non-negative integer shape and two offsets, bytes
    that do not match its shape, and offsets that leave gaps, overlap or do not cover the data exactly."""
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise ScaleclError(f"{what} {p} is damaged (its __metadata__ is not an object of strings)")
    spans = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(t, dict) or not {"dtype", "shape", "data_offsets"} <= set(t):
            raise ScaleclError(f"{what} {p} is damaged (tensor {name!r} has no dtype, shape and offsets)")
        dtype, shape, offsets = t["dtype"], t["shape"], t["data_offsets"]
        if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
            raise ScaleclError(f"{what} {p}: tensor {name!r} has an unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and all(_is_count(s) for s in shape)
                and isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
            raise ScaleclError(f"{what} {p} is damaged (tensor {name!r} has a bad shape or offsets)")
        start, end = offsets
        if end > data_bytes:
            raise ScaleclError(f"{what} {p} is truncated: tensor {name!r} ends at byte {end:,} of {data_bytes:,}")
        bits = math.prod(shape) * _SUB_BYTE_BITS.get(dtype, 8 * SAFETENSORS_DTYPES[dtype])
        if start > end or bits % 8 or end - start != bits // 8:
            raise ScaleclError(f"{what} {p} is damaged (tensor {name!r}: its bytes do not match its shape)")
        spans.append((start, end, name))
    covered = 0
    for start, end, name in sorted(spans):
        if start != covered:
            raise ScaleclError(f"{what} {p} is damaged (tensor {name!r} overlaps another or leaves a gap)")
        covered = end
    if covered != data_bytes:
        raise ScaleclError(f"{what} {p} is damaged ({data_bytes - covered:,} bytes after its last tensor)")


def check_weights_folder(folder: str | os.PathLike, what: str = "checkpoint") -> list[Path]:
    """The safetensors weight files of a model folder (model.safetensors or the shards its index names), each
    checked; a folder with only pickled weights (pytorch_model.bin) or none is refused, nothing unpickled."""
    d = Path(folder)
    index = d / "model.safetensors.index.json"
    if (d / "model.safetensors").exists():
        files = [d / "model.safetensors"]
    elif index.exists():
        weight_map = field(read_json(index, "weights index"), "weight_map", dict, index, "weights index")
        if not all(isinstance(v, str) and "/" not in v and v not in ("", ".", "..") for v in weight_map.values()):
            raise ScaleclError(f"weights index {index} names a shard outside its folder")
        files = [d / name for name in sorted(set(weight_map.values()))]
    else:
        pickled = [n for n in PICKLED_WEIGHTS if (d / n).exists()] + sorted(
            p.name for p in d.glob("pytorch_model-*.bin"))
        if pickled:
            raise ScaleclError(f"{what} {d} holds only {pickled[0]} (pickled weights, which scalecl never loads: "
                               f"unpickling can run code); convert it to model.safetensors")
        raise ScaleclError(f"{what} {d} holds no model.safetensors")
    for f in files:
        model_weights_header(f, f"weights of {what}")
    return files
