"""Generated bad input (hypothesis), beside the hand-written table of tests/cli/test_bad_inputs.py.

- `schema.coerce` and `config.load_preset(kind, "tiny", ["key=value"])` on generated keys (every real key of
  BioRunConfig and CptRunConfig, their per-method tables, unknown keys) and values (text, huge integers,
  floats with inf and nan, booleans, empty strings, unicode, comma lists): either a config whose value has the
  key's declared type and lies in its declared range, or one ScaleclError of one line; never another exception.
- `train-bio` / `train-cpt --set` with values that must fail: exit code 2, exactly one `error:` line on
  stderr, nothing on stdout, and neither --out, --cache nor --checkpoints created.

Examples are derandomized (the same on every run and in CI) and few enough that the file takes seconds.
"""

from __future__ import annotations

import json
import math
import tempfile
import types
import typing
import unicodedata
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.common.schema import INT64_MAX, INT64_MIN, MAX_SEED, MAX_SIZE, Raw, check_seed, coerce
from scalecl.data.biography import BioConfig
from scalecl.experiments import load_preset, sweep
from scalecl.experiments.config import BioRunConfig, CptRunConfig
from scalecl.methods import REGISTRY, method_names

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CLI_SETTINGS = settings(SETTINGS, max_examples=50)
KINDS = {"bio": BioRunConfig, "cpt": CptRunConfig}
LINE_BREAKING = ("Cc", "Zl", "Zp")


# ---------------------------------------------------------------------------------------------------------
# The keys: (dotted key, declared type, declared range) of every leaf a --set can reach


def _leaves(cls: type, where: str = "") -> list[tuple[str, Any, dict]]:
    """Every field of a config dataclass, nested sections flattened, per-method tables by method name.

    data_overrides values are typed ints here; their ranges are BioConfig's, checked when the data is built
    (before any work, by the experiment's check), not by load_preset.
    """
    hints, out = typing.get_type_hints(cls), []
    for f in fields(cls):
        hint, key = hints[f.name], f"{where}{f.name}"
        if is_dataclass(hint):
            out += _leaves(hint, f"{key}.")
        elif f.name in ("lr", "lr_scale"):
            out += [(f"{key}.{m}", float, {"gt": 0.0}) for m in method_names()]
        elif f.name == "data_overrides":
            out += [(f"{key}.{b.name}", int, {}) for b in fields(BioConfig) if b.name != "seed"]
        elif f.name == "methods":
            for m in [*method_names(), "scale"]:
                method = REGISTRY["scale-route" if m == "scale" else m]
                opts = typing.get_type_hints(method)
                out += [(f"{key}.{m}.{o.name}", opts[o.name], {}) for o in fields(method)]
        else:
            out.append((key, hint, dict(f.metadata)))
    return out


LEAVES = {kind: {key: (hint, meta) for key, hint, meta in _leaves(cls)} for kind, cls in KINDS.items()}


def _lookup(cfg: Any, key: str) -> Any:
    node = cfg
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


# ---------------------------------------------------------------------------------------------------------
# Values


EDGE_INTS = [0, -1, 1, 2**20, 2**20 + 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1,
             2**64, 10**20, 99999999999999999999, 1099511627776]
huge_ints = st.integers(min_value=-(2**100), max_value=2**100) | st.sampled_from(EDGE_INTS)
any_floats = st.floats(allow_nan=True, allow_infinity=True)
EDGE_TEXTS = ["", " ", "true", "false", "True", "none", "null", "None", "inf", "-inf", "nan", "1e30", "1e999",
              "-0", "0x10", "1_000", "1.5", " 7 ", ",", "1,2", "a,b", "svd,zero", "attn,mlp", "llama", "gpt_neox",
              "bfloat16", "cosine", "a\nb", "\u2028", "x\x85y", "\x00", "9" * 5000, "ﬁ", "١٢", "日本語"]
# what a --set value can be: any text, numbers of every size and kind, comma lists
texts = st.one_of(
    st.sampled_from(EDGE_TEXTS),
    huge_ints.map(str),
    any_floats.map(repr),
    st.text(max_size=24),
    st.lists(st.sampled_from(["svd", "zero", "rnd", "attn", "mlp", "", " "]) | huge_ints.map(str), max_size=4)
    .map(",".join),
)
# a value as TOML or a program hands it over
py_values = st.one_of(
    st.none(), st.booleans(), huge_ints, any_floats, st.text(max_size=24), texts.map(Raw),
    st.lists(huge_ints | st.text(max_size=6), max_size=3), st.dictionaries(st.text(max_size=4), huge_ints, max_size=2),
)
unknown_keys = st.one_of(
    st.text(max_size=20).filter(lambda k: "=" not in k),
    st.sampled_from(["nope", "stage1.nope", "train.nope", "model", "stage1", "methods.nope.x", "methods.lora",
                     "methods.lora.nope", "lr.nope", "lr_scale.nope", "data_overrides.seed", "model..hidden",
                     ".seed", "seed.", "seed.x", "methods.scale.tau.x", "a\nb", "stage1.\u2028"]),
)
HINTS = [int, float, bool, str, int | None, float | None, tuple[str, ...], tuple[str, str]]


# ---------------------------------------------------------------------------------------------------------
# What an accepted value must be


def _one_line(message: str) -> bool:
    return bool(message.strip()) and len(message.splitlines()) == 1


def _assert_typed(value: Any, hint: Any, key: str) -> None:
    """`value` has the declared type: ints are ints (never bools) within int64, floats are finite floats, text is
    one line; optional types also take None."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            assert type(None) in args, key
            return
        inner = [a for a in args if a is not type(None)]
        assert any(_is_typed(value, a) for a in inner), (key, value)
        return
    if origin is tuple:
        assert isinstance(value, tuple), (key, value)
        for v in value:
            _assert_typed(v, args[0], key)
        return
    if hint is Any:
        return
    assert _is_typed(value, hint), (key, hint, value)


def _is_typed(value: Any, hint: Any) -> bool:
    if hint is int:
        return type(value) is int and INT64_MIN <= value <= INT64_MAX
    if hint is float:
        return type(value) is float and math.isfinite(value)
    if hint is bool:
        return type(value) is bool
    if hint is str:
        return type(value) is str and not any(unicodedata.category(c) in LINE_BREAKING for c in value)
    return isinstance(value, hint)


def _assert_in_range(value: Any, meta: dict, key: str) -> None:
    if value is None:
        return
    if "choices" in meta:
        assert value in meta["choices"], (key, value)
    for op, ok in (("ge", value >= meta.get("ge", value)), ("gt", "gt" not in meta or value > meta["gt"]),
                   ("le", value <= meta.get("le", value)), ("lt", "lt" not in meta or value < meta["lt"])):
        assert ok, (key, op, meta, value)


# ---------------------------------------------------------------------------------------------------------
# (a) the schema and the presets


@SETTINGS
@given(value=py_values, hint=st.sampled_from(HINTS))
def test_coerce_types_a_value_or_says_why_in_one_line(value, hint):
    try:
        out = coerce(value, hint, "config key k")
    except ScaleclError as e:
        assert _one_line(str(e)), str(e)
    else:
        _assert_typed(out, hint, "k")


@SETTINGS
@given(kind=st.sampled_from(sorted(KINDS)), data=st.data())
def test_load_preset_real_keys(kind, data):
    key = data.draw(st.sampled_from(sorted(LEAVES[kind])), label="key")
    value = data.draw(texts, label="value")
    _check_set(kind, key, value)


@SETTINGS
@given(kind=st.sampled_from(sorted(KINDS)), key=unknown_keys, value=texts)
def test_load_preset_unknown_keys(kind, key, value):
    _check_set(kind, key, value)


def _check_set(kind: str, key: str, value: str) -> None:
    """load_preset with one --set: a config whose value is typed and in range, or one ScaleclError line."""
    try:
        cfg = load_preset(kind, "tiny", [f"{key}={value}"])
    except ScaleclError as e:
        assert _one_line(str(e)), (key, value, str(e))
        return
    parts = [p.strip() for p in key.strip().split(".")]
    hint, meta = LEAVES[kind][".".join(parts)]  # accepted: a real key, typed and in range
    got = _lookup(cfg, ".".join(parts))
    _assert_typed(got, hint, key)
    _assert_in_range(got, meta, key)
    if parts[-1] in ("rank", "hidden_up", "ffn_up", "n", "k"):  # method sizes: config-free bounds
        assert 0 <= got <= MAX_SIZE, (key, got)


@pytest.mark.parametrize("key, value, phrase", [
    ("seed", "99999999999999999999", "64-bit"),
    ("seed", str(MAX_SEED + 1), "<= 4294967295 (2**32 - 1)"),
    ("stage1.steps", str(2**63), "64-bit"),
    ("model.hidden", "1099511627776", "<= 1048576 (2**20)"),
    ("methods.lora.rank", str(2**62), "1..1048576 (2**20)"),
    ("methods.scale.hidden_up", "1099511627776", "1..1048576 (2**20)"),
    ("stage3.lr", "inf", "expects a number"),
    ("stage3.lr", "nan", "expects a number"),
    ("tokenizer", "a\nb", "one line"),
])
def test_representable_ranges(key, value, phrase):
    with pytest.raises(ScaleclError) as e:
        load_preset("bio", "tiny", [f"{key}={value}"])
    assert phrase in str(e.value) and _one_line(str(e.value)), str(e.value)


def test_check_seed():
    assert check_seed(0) == 0 and check_seed(MAX_SEED) == MAX_SEED
    for bad in (-1, MAX_SEED + 1, 99999999999999999999, True, 1.0):
        with pytest.raises(ScaleclError, match=r"--seed must be an integer in 0\.\.4294967295 \(2\*\*32 - 1\)"):
            check_seed(bad)


@pytest.mark.parametrize("args, phrase", [
    (["upscale", "--random-config", "llama", "--hidden-up", "1099511627776"], "hidden_up must be an integer in 1.."),
    (["upscale", "--random-config", "llama", "--hidden-up", "65536"], "at most 2**31"),
    (["prepare", "--method", "lora", "--random-config", "llama", "--set", f"rank={2**62}"], "lora rank must be"),
    (["prepare", "--method", "lora", "--random-config", "llama", "--set", "rank=17"], "exceeds 16"),
    (["prepare", "--method", "freeze", "--random-config", "llama", "--set", f"k={2**40}"], "freeze k must be"),
    (["upscale", "--random-config", "llama", "--hidden-up", "32", "--seed", "99999999999999999999"], "--seed must be"),
    (["prepare", "--method", "fft", "--random-config", "llama", "--seed", str(2**32)], "--seed must be"),
])
def test_cli_numbers_out_of_range(args, phrase, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, [*args, "--out", "out"])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), (res.output, res.exception)
    assert phrase in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []


def test_large_but_representable_values_pass():
    cfg = load_preset("bio", "tiny", [f"seed={MAX_SEED}", "stage3.lr=1e30"])  # divergence is caught in training
    assert cfg.seed == MAX_SEED and cfg.stage3.lr == 1e30


# ---------------------------------------------------------------------------------------------------------
# (b) the command line: values that must fail, so nothing trains


def _not_int(text: str) -> bool:
    try:
        int(text.strip())
    except ValueError:
        return True
    return False


def _not_float(text: str) -> bool:
    try:
        return not math.isfinite(float(text.strip()))
    except ValueError:
        return True


def _bad_value(kind: str, key: str) -> st.SearchStrategy[str]:
    """Values the key's declared type or range refuses."""
    hint, meta = LEAVES[kind][key]
    if "choices" in meta:
        return st.text(max_size=12).filter(lambda t: t.strip() not in meta["choices"])
    if hint is bool:
        return st.text(max_size=8).filter(lambda t: t.strip().lower() not in ("true", "false"))
    if hint is int:
        low = max(meta.get("ge", INT64_MIN), meta.get("gt", INT64_MIN - 1) + 1)
        high = min(meta.get("le", INT64_MAX), meta.get("lt", INT64_MAX + 1) - 1)
        outside = st.integers(min_value=high + 1, max_value=2**80) | st.integers(min_value=-(2**80), max_value=low - 1)
        return outside.map(str) | st.text(max_size=12).filter(_not_int)
    if hint is float:
        finite = {"allow_nan": False, "allow_infinity": False}
        outside = [st.floats(max_value=meta["gt"], **finite)] if "gt" in meta else []
        outside += [st.floats(max_value=meta["ge"], exclude_max=True, **finite)] if "ge" in meta else []
        outside += [st.floats(min_value=meta["le"], exclude_min=True, **finite)] if "le" in meta else []
        outside += [st.floats(min_value=meta["lt"], **finite)] if "lt" in meta else []
        not_numbers = st.sampled_from(["inf", "-inf", "nan", "1e999", "-1e999", "", "x", "1,2"])
        return st.one_of(not_numbers, st.text(max_size=12).filter(_not_float), *[o.map(repr) for o in outside])
    raise AssertionError(f"no bad values for {key}")


def _refusable(kind: str) -> list[str]:
    """Keys whose declared type or range refuses values (free text keys accept nearly anything)."""
    return sorted(k for k, (hint, meta) in LEAVES[kind].items()
                  if not k.startswith("methods.") and (hint in (int, float, bool) or "choices" in meta))


def _cli_case(kind: str) -> st.SearchStrategy[tuple[str, str]]:
    real = st.sampled_from(_refusable(kind)).flatmap(lambda k: st.tuples(st.just(k), _bad_value(kind, k)))
    sizes = st.tuples(st.sampled_from(["methods.lora.rank", "methods.scale.hidden_up", "methods.scale.ffn_up",
                                       "methods.llama-pro.n", "methods.freeze.k"]),
                      st.integers(min_value=MAX_SIZE + 1, max_value=2**100).map(str))
    unknown = st.tuples(st.sampled_from(["nope", "stage1.nope", "train.nope", "methods.nope.rank", "lr.nope"]), texts)
    return st.one_of(real, real, real, sizes, unknown)  # mostly real keys


def _stop_after(check):
    """The sweep's checks (which write nothing), then a stop instead of training."""

    def checked_then_stopped(*args, **kwargs):
        check(*args, **kwargs)
        raise AssertionError("the bad value passed every check")

    return checked_then_stopped


@pytest.mark.parametrize("kind", ["bio", "cpt"])
@CLI_SETTINGS
@given(data=st.data())
def test_cli_bad_set_values(kind, data, tmp_path, monkeypatch):
    key, value = data.draw(_cli_case(kind), label="--set")
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    monkeypatch.chdir(root)
    monkeypatch.setattr(sweep, "check", _stop_after(sweep.check))  # a value that passes fails fast, untrained
    dirs = {flag: root / flag.strip("-") for flag in ("--out", "--cache", "--checkpoints")}
    args = [f"train-{kind}", "--preset", "tiny", "--method", "fft", "--set", f"{key}={value}"]
    for flag, path in dirs.items():
        args += [flag, str(path)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, (args, res.exit_code, res.output, res.exception)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), (args, res.stderr)
    assert not res.stdout.strip(), (args, res.stdout)
    assert list(root.iterdir()) == [], (args, list(root.iterdir()))


# ---------------------------------------------------------------------------------------------------------
# malformed files: whatever bytes a file the suite reads holds, the reader returns its content or raises one
# one-line ScaleclError naming the file (issue 19, item 7)

FILES = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])

_json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                         max_size=3), max_leaves=8)


def _one_line_error_naming(exc: Exception, path: Path) -> None:
    from scalecl.common.errors import ScaleclError

    assert isinstance(exc, ScaleclError), repr(exc)
    assert len(str(exc).splitlines()) == 1 and str(path) in str(exc)


@FILES
@given(data=st.one_of(st.binary(max_size=64), _json_values.map(lambda v: json.dumps(v).encode()),
                      st.text(max_size=40).map(str.encode)))
def test_any_bytes_as_a_json_file(tmp_path, data):
    from scalecl.common.readers import read_json

    path = tmp_path / "scalecl.json"
    path.write_bytes(data)
    try:
        doc = read_json(path, "checkpoint metadata")
    except Exception as e:  # noqa: BLE001  (the property: only ScaleclError, one line, naming the file)
        _one_line_error_naming(e, path)
    else:
        assert isinstance(doc, dict)


@FILES
@given(header=st.one_of(st.binary(max_size=48), _json_values.map(lambda v: json.dumps(v).encode())),
       length=st.one_of(st.none(), st.integers(0, 2**64 - 1)), tail=st.binary(max_size=32))
def test_any_bytes_as_a_safetensors_file(tmp_path, header, length, tail):
    import struct

    from scalecl.common.readers import safetensors_header

    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + tail)
    try:
        parsed = safetensors_header(path)
    except Exception as e:  # noqa: BLE001
        _one_line_error_naming(e, path)
    else:
        assert isinstance(parsed, dict)
