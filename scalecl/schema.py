"""The typed schema engine: dataclass fields with ranges, values typed from TOML or the command line.

Every config of the suite is a dataclass. A field declares its type (the annotation) and, with `opt`, its
valid range or choices. `merge` applies a nested dict of overrides (a preset file, `--set` pairs) to an
instance: unknown keys, wrong types and values out of range are one clear ScaleclError before any work.
This module knows no experiment: scalecl.config declares the experiments' sections on top of it, and
methods type their options with `coerce`.
"""

from __future__ import annotations

import hashlib
import json
import math
import types
import typing
from dataclasses import asdict, field, fields, is_dataclass
from typing import Any

from .errors import ScaleclError


class Raw(str):
    """A value typed on the command line (--set key=value): still text, converted by the key's declared type."""


def opt(default: Any = None, *, factory: Any = None, ge: float | None = None, gt: float | None = None,
        le: float | None = None, lt: float | None = None, choices: tuple | None = None) -> Any:
    """A dataclass field with its valid range or choices (checked by check_config)."""
    meta = {k: v for k, v in dict(ge=ge, gt=gt, le=le, lt=lt, choices=choices).items() if v is not None}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _type_name(hint: Any) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, str(hint))


def coerce(value: Any, hint: Any, key: str) -> Any:
    """`value` as the declared type `hint`: command-line text (Raw) is parsed, typed TOML values are checked.

    key names the value in the error ("config key stage1.steps expects an integer, got 'x'").

    bool is never taken for an int (true is not 1 step), and None only where the type allows it.
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None or (isinstance(value, Raw) and value.strip().lower() in ("none", "null")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return coerce(value, inner[0], key)
        for a in inner:
            try:
                return coerce(value, a, key)
            except ScaleclError:
                pass
        raise ScaleclError(f"{key} expects {' or '.join(_type_name(a) for a in inner)}, got {value!r}")
    if origin is tuple:
        items = [v for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ScaleclError(f"{key} expects a list, got {value!r}")
        item_type = args[0] if args else Any
        return tuple(coerce(Raw(v.strip()) if isinstance(value, Raw) else v, item_type, key) for v in items)
    if hint is Any:
        return value  # typed later by its owner (method options: Method.coerce_options)
    text = value.strip() if isinstance(value, Raw) else None
    if hint is bool:
        if text is not None and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if isinstance(value, bool):
            return value
    elif hint is int:
        if text is not None:
            try:
                return int(text)
            except ValueError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if text is not None:
            try:
                v = float(text)
                if math.isfinite(v):
                    return v
            except ValueError:
                pass
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return str(value)
    else:
        raise TypeError(f"unsupported config type {hint!r} for {key}")
    raise ScaleclError(f"{key} expects {_type_name(hint)}, got {value!r}")


def _check_range(value: Any, meta: dict, key: str) -> None:
    if value is None:
        return
    if "choices" in meta and value not in meta["choices"]:
        raise ScaleclError(f"config key {key} must be one of {', '.join(map(str, meta['choices']))}, got {value!r}")
    for op, test, word in (("ge", lambda a, b: a >= b, ">="), ("gt", lambda a, b: a > b, ">"),
                           ("le", lambda a, b: a <= b, "<="), ("lt", lambda a, b: a < b, "<")):
        if op in meta and not test(value, meta[op]):
            raise ScaleclError(f"config key {key} must be {word} {meta[op]:g}, got {value!r}")


def merge(obj: Any, updates: dict[str, Any], where: str) -> Any:
    """Apply a nested dict of overrides to a dataclass instance: unknown keys, wrong types and bad ranges raise."""
    hints = typing.get_type_hints(type(obj))
    names = {f.name: f for f in fields(obj)}
    for k, v in updates.items():
        if k not in names:
            raise ScaleclError(f"unknown config key {where}{k}; known: {', '.join(names)}")
        cur, hint = getattr(obj, k), hints[k]
        if is_dataclass(cur):
            if not isinstance(v, dict):
                raise ScaleclError(f"config key {where}{k} is a section, not a value")
            merge(cur, v, f"{where}{k}.")
        elif typing.get_origin(hint) is dict:
            if not isinstance(v, dict):
                raise ScaleclError(f"config key {where}{k} is a table, not a value")
            setattr(obj, k, _update_table(cur, v, typing.get_args(hint)[1], f"{where}{k}."))
        else:
            value = coerce(v, hint, f"config key {where}{k}")
            _check_range(value, names[k].metadata, f"{where}{k}")
            setattr(obj, k, value)
    return obj


def _update_table(cur: dict, updates: dict, value_hint: Any, where: str) -> dict:
    """A per-name table (lr.<method>, methods.<method>.<option>): values typed by the table's value type."""
    out = dict(cur)
    for k, v in updates.items():
        if typing.get_origin(value_hint) is dict:
            if not isinstance(v, dict):
                raise ScaleclError(f"config key {where}{k} is a table, not a value")
            out[k] = _update_table(out.get(k, {}), v, typing.get_args(value_hint)[1], f"{where}{k}.")
        else:
            out[k] = coerce(v, value_hint, f"config key {where}{k}")
    return out


def check_config(obj: Any, where: str = "") -> None:
    """Ranges of every field (presets included) and each section's own cross-field check()."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if is_dataclass(value):
            check_config(value, f"{where}{f.name}.")
        else:
            _check_range(value, f.metadata, f"{where}{f.name}")
    if hasattr(obj, "check"):
        obj.check(where)


def parse_scalar(text: str) -> Any:
    """A command-line value: none/null -> None, true/false -> bool, then int, float, else the string."""
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text.strip()


def parse_value(text: str) -> Any:
    """A --set value of untyped options: a scalar, or a comma list of scalars."""
    if "," in text:
        return [parse_scalar(t) for t in text.split(",") if t]
    return parse_scalar(text)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """["stage1.steps=100", "methods.scale.hidden_up=64"] -> nested dict of Raw texts (typed when merged)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ScaleclError(f"--set expects key=value, got {item!r}")
        node = out
        *parents, leaf = [p.strip() for p in key.strip().split(".")]
        if not all(parents) or not leaf:
            raise ScaleclError(f"--set key {key!r} has an empty part")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ScaleclError(f"--set {item!r}: {p} was given a value before")
        node[leaf] = Raw(val.strip())
    return out


def config_hash(*parts: Any, n: int = 10) -> str:
    """Stable short hash of JSON-able parts (dataclasses are converted)."""
    blob = json.dumps([asdict(p) if is_dataclass(p) else p for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:n]
