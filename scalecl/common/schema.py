"""The typed schema engine: dataclass fields with ranges, values typed from TOML or the command line.

Every config of the suite is a dataclass. A field declares its type (the annotation) and, with `opt`, its
valid range or choices. `merge` applies a nested dict of overrides (a preset file, `--set` pairs) to an
instance: unknown keys, wrong types and values out of range are one clear ScaleclError before any work.
This module knows no experiment: scalecl.experiments.config declares the experiments' sections on top of it, and
methods type their options with `coerce`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import types
import typing
import unicodedata
from dataclasses import asdict, field, fields, is_dataclass
from typing import Any

from scalecl.common.errors import ScaleclError

# Representable ranges, checked before any work (before any work):
# - every integer of a config fits a signed 64-bit integer (torch and numpy hold sizes and steps in int64);
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# - a seed lies in 0..2**32 - 1, the range of a 32-bit seed (numpy's legacy seeding, most tools): torch takes
#   up to 2**64 - 1, but the suite adds offsets to a seed (seed + 3) and a sum past 2**64 - 1 overflows;
MAX_SEED = 2**32 - 1
# - no model size (a width, heads, layers, a vocabulary, a context, a LoRA rank, SCALE's added widths) exceeds
#   2**20 = 1,048,576: over 50x the hidden width of the largest published decoders (16,384 to 18,432), and a
#   square matrix of that side alone would hold 2**40 elements (4 TiB in float32).
MAX_SIZE = 2**20
# - no model has more than 1,024 decoder layers: 8x the deepest published decoders (126 to 128 layers),
#   and the memory estimate builds the model on the meta device, whose Python objects grow with the layers
#   (a million layers took minutes and gigabytes before any refusal)
MAX_LAYERS = 1024
# - no step count or step interval (a stage's steps and warm-up, evaluation, checkpoint and sync intervals)
#   exceeds 10**9: about 30,000 times the longest run here (the paper's 80,000 steps of stage 1), and what
#   a schedule of them builds stays small;
MAX_STEPS = 10**9
# - no document count (a corpus slice's skip and take) exceeds 10**12, over 50 times the documents of the
#   largest public web corpora, so that skip + take still fits a 64-bit integer.
MAX_DOCS = 10**12
# - no CPU thread count (compute.threads) exceeds max(256, 4 x this machine's cores): each thread is an OS thread
#   with its own stack, and a typo (100000) would start threads until the OS refuses one, a traceback from
#   inside torch. More threads than cores only wait for a core, so a few times the cores is all that is ever
#   useful; but a run made at n threads is reproduced only at n threads (the count splits float sums,
#   numerics_key), so a machine may need more threads than it has cores: 256 is more than the cores of any
#   single CPU sold (192), and 512 threads were measured to start and run a matrix product on a 2-core machine.
MAX_THREADS = max(256, 4 * (os.cpu_count() or 1))


class Raw(str):
    """A value typed on the command line (--set key=value): still text, converted by the key's declared type."""


def opt(default: Any = None, *, factory: Any = None, ge: float | None = None, gt: float | None = None,
        le: float | None = None, lt: float | None = None, choices: tuple | None = None) -> Any:
    """A dataclass field with its valid range or choices (checked by check_config)."""
    meta = {k: v for k, v in dict(ge=ge, gt=gt, le=le, lt=lt, choices=choices).items() if v is not None}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def show_bound(b: float) -> str:
    """A range bound as the error shows it: ints in full, with their power of two when they are one
    (1048576 (2**20), 4294967295 (2**32 - 1)); floats compactly (1e-08)."""
    if isinstance(b, int):
        for off, tail in ((0, ""), (1, " - 1")):
            n = b + off
            if n >= 2**16 and n & (n - 1) == 0:
                return f"{b} (2**{n.bit_length() - 1}{tail})"
        return str(b)
    return f"{b:g}"


def show_value(value: Any, limit: int = 60) -> str:
    """repr of a value for a one-line error: control characters escaped, long values shortened."""
    try:
        r = repr(value)
    except ValueError:  # an int of more digits than Python converts to text (4,300)
        return f"an integer of {value.bit_length():,} bits"
    return r if len(r) <= limit else f"{r[: limit - 15]}...{r[-10:]} ({len(str(value)):,} characters)"


def show_text(text: str, limit: int = 60) -> str:
    """Text as an error shows it: as it is when it is short and printable, else as show_value does."""
    return text if text.isprintable() and len(text) <= limit else show_value(text, limit)


def int_span(text: str, key: str, limit: int, unit: str = "values") -> range | None:
    """An integer range 'a..b' (both ends included) as a `range`, or None when `text` is not a range. Its length
    is checked against `limit` before anything is expanded: 0..100000000000 is one error, not a list of 10**11
    integers that fills the memory first."""
    lo, dots, hi = text.partition("..")
    if not dots:
        return None
    try:
        first, last = int(lo), int(hi)
    except ValueError:  # not integers, or more digits than Python converts (4,300)
        raise ScaleclError(f"{key} must be integers or a range a..b of integers, got {show_text(text)}") from None
    n = last - first + 1
    if n < 1:
        raise ScaleclError(f"{key} {show_text(text)} is an empty range: a..b needs a <= b")
    if n > limit:
        raise ScaleclError(f"{key} {show_text(text)}: {n:,} {unit}, more than the {limit:,} {unit} allowed")
    return range(first, last + 1)


def check_int64(value: int, key: str) -> int:
    """`value` if it fits a signed 64-bit integer, else one ScaleclError naming `key`."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise ScaleclError(f"{key} is {show_value(value)}, outside the 64-bit integer range "
                           f"-2**63..2**63 - 1")
    return value


def check_seed(seed: int, key: str = "--seed") -> int:
    """`seed` if every generator the suite seeds accepts it (0..MAX_SEED), else one ScaleclError."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ScaleclError(f"{key} must be an integer in 0..{show_bound(MAX_SEED)}, got {show_value(seed)}")
    return seed


def run_stream_seed(base: int, run: int) -> int:
    """The seed of a run's own random draws (data order, new blocks) from its base and run seeds.

    Run seed 0 is the base seed itself, which is what every run used before run seeds existed (so their names
    and numbers stay); any other run seed mixes both through SHA-256 into 0..MAX_SEED - 3 (stages add small
    offsets to it).
    """
    if run == 0:
        return base
    return int.from_bytes(hashlib.sha256(f"scalecl-run-seed:{base}:{run}".encode()).digest()[:8]) % (MAX_SEED - 3)


def seed_tag(base: int, run: int) -> str:
    """The seeds as they appear in a run's name: '' for base seed 0 and run seed 0 (names as they always
    were), else 's<base>-r<run>-'."""
    return f"s{base}-r{run}-" if base or run else ""


def seed_key(run: int) -> list[dict[str, int]]:
    """The run seed as an extra part of a run's hash: nothing for 0, so names made before run seeds stay."""
    return [{"run_seed": run}] if run else []


# The numerics every committed run was made with: a CPU, one intra-op thread. Runs on it keep the names they
# always had; any other device or CPU thread count enters a run's name and every stage cache key.
LEGACY_NUMERICS = {"device": "cpu", "cpu_threads": 1}


def numerics_key(numerics: dict[str, Any]) -> list[dict[str, Any]]:
    """What the machine contributes to a run's numbers, as an extra part of its hash: nothing for one CPU
    thread (names made before this key existed stay), else {"numerics": ...}. The thread count splits float
    sums differently (matrix products, reductions), so runs at 1 and 2 threads differ in the last bits and
    then, through training, in their results; a GPU computes other sums again."""
    return [] if numerics == LEGACY_NUMERICS else [{"numerics": numerics}]


def numerics_tag(numerics: dict[str, Any]) -> str:
    """The numerics as a short phrase for messages: 'CPU, 2 threads', 'cuda'."""
    products = f", SCALE products {numerics['scale_products']}" if numerics.get("scale_products") else ""
    if numerics.get("device") == "cpu":
        n = numerics.get("cpu_threads")
        bf16 = ", bf16 autocast" if numerics.get("autocast") == "bfloat16" else ""
        return f"CPU, {n} thread{'s' if n != 1 else ''}{bf16}{products}"
    return f"{numerics.get('device')}{products}"


_LINE_BREAKING = ("Cc", "Zl", "Zp")  # control characters and line/paragraph separators (str.splitlines splits)


def check_text(value: str, key: str) -> str:
    """`value` if it is one line of text (no control character or line separator), else one ScaleclError."""
    bad = next((c for c in value if unicodedata.category(c) in _LINE_BREAKING), None)
    if bad is not None:
        raise ScaleclError(f"{key} must be one line of text without control characters, got {show_value(value)} "
                           f"(contains {bad!r})")
    return value


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
        raise ScaleclError(f"{key} expects {' or '.join(_type_name(a) for a in inner)}, got {show_value(value)}")
    if origin is tuple:
        items = split_items(value, key) if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ScaleclError(f"{key} expects a list, got {show_value(value)}")
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
                return check_int64(int(text), key)
            except ValueError:  # not an integer, or more digits than Python converts (4,300)
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            return check_int64(value, key)
    elif hint is float:
        v = _finite_float(text if text is not None else value)
        if v is not None:
            return v
    elif hint is str:
        if isinstance(value, str):
            return check_text(str(value), key)
    else:
        raise TypeError(f"unsupported config type {hint!r} for {key}")
    raise ScaleclError(f"{key} expects {_type_name(hint)}, got {show_value(value)}")


def _finite_float(value: Any) -> float | None:
    """A finite float from text or a number (not a bool); None for anything else, inf, nan or an int too
    large for a float."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    try:
        v = float(value)
    except (ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


def check_range(value: Any, meta: dict, label: str) -> None:
    """`value` within the choices and bounds `meta` declares (opt's ge, gt, le, lt, choices), else one
    ScaleclError naming `label` ("config key stage1.steps", "SCALECL_PEAK_TFLOPS"); None passes."""
    if value is None:
        return
    if "choices" in meta and value not in meta["choices"]:
        raise ScaleclError(f"{label} must be one of {', '.join(map(str, meta['choices']))}, got {show_value(value)}")
    if isinstance(value, int) and not isinstance(value, bool):
        check_int64(value, label)
    for op, test, word in (("ge", lambda a, b: a >= b, ">="), ("gt", lambda a, b: a > b, ">"),
                           ("le", lambda a, b: a <= b, "<="), ("lt", lambda a, b: a < b, "<")):
        if op in meta and not test(value, meta[op]):
            raise ScaleclError(f"{label} must be {word} {show_bound(meta[op])}, got {show_value(value)}")


def _check_range(value: Any, meta: dict, key: str) -> None:
    check_range(value, meta, f"config key {key}")


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
            if isinstance(v, Raw) and not v.strip() and names[k].default not in ("", ()):
                # `--set key=` gives no value: refused, unless the key's own default is the empty text
                raise ScaleclError(f"config key {where}{k} is empty: give a value")
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


def split_items(text: str, what: str) -> list[str]:
    """A comma-separated list, each item stripped; an empty item ('a,,b', 'a,' or ',a') is one error naming
    `what`, never dropped: like an empty value, it is never "not given"."""
    items = [t.strip() for t in text.split(",")]
    if any(not t for t in items):
        raise ScaleclError(f"{what} {show_text(text)} has an empty item; separate the items by single commas")
    return items


def parse_value(text: str) -> Any:
    """A --set value of untyped options: a scalar, or a comma list of scalars."""
    if "," in text:
        return [parse_scalar(t) for t in split_items(text, "a --set list")]
    return parse_scalar(text)


def overlay(updates: dict[str, Any], inputs: dict[str, Any], where: str = "") -> dict[str, Any]:
    """`updates` (parsed --set overrides) with `inputs` (a command's own flags, already typed, nested as the
    config) added; a key both give is refused (the command line names the flag first; this is the guard)."""
    out = dict(updates)
    for k, v in inputs.items():
        if k in out and isinstance(out[k], dict) and isinstance(v, dict):
            out[k] = overlay(out[k], v, f"{where}{k}.")
        elif k in out:
            raise ScaleclError(f"{where}{k} is given twice (an option and --set {where}{k}=...); give it once")
        else:
            out[k] = v
    return out


def parse_sets(items: list[str]) -> dict[str, Any]:
    """["stage1.steps=100", "methods.scale.hidden_up=64"] -> nested dict of Raw texts (typed when merged)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ScaleclError(f"--set expects key=value, got {show_value(item)}")
        check_text(key, "--set key")  # a key is named in errors: one line
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


def without(config: dict[str, Any], paths: typing.Iterable[str]) -> dict[str, Any]:
    """A config (nested dicts, as asdict gives it) without the keys at `paths` ('checkpoint', 'eval.never_tokens');
    the config itself is left as it was."""
    out = dict(config)
    for path in paths:
        *parents, key = path.split(".")
        d = out
        for k in parents:
            if not isinstance(d.get(k), dict):
                break
            d[k] = d = dict(d[k])
        else:
            d.pop(key, None)
    return out


def config_hash(*parts: Any, n: int = 10) -> str:
    """Stable short hash of JSON-able parts (dataclasses are converted)."""
    blob = json.dumps([asdict(p) if is_dataclass(p) else p for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


def named_dict(config: dict[str, Any], not_named: typing.Iterable[str], when_set: typing.Mapping[str, Any]) -> dict[str, Any]:
    """`config` without the `not_named` keys and without each key of `when_set` that holds its default there."""
    def value(path: str) -> Any:
        d: Any = config
        for k in path.split("."):
            if not isinstance(d, dict) or k not in d:
                return None
            d = d[k]
        return d

    return without(config, [*not_named, *(k for k, default in when_set.items() if value(k) == default)])
