"""The SCALECL_* environment variables: one declared table (name, type, range, meaning), read in one place.

A value is typed and range-checked as a `--set` value is (scalecl.common.schema: `coerce`, `check_range`), and
every `scalecl` command checks every variable before it starts (scalecl.cli.errors.user_errors): a bad value is
one `error:` line naming the variable, never a traceback deep inside a run, nor a number computed from it. An
empty value is refused (unset the variable instead), and so is an unknown SCALECL_ name (a misspelt variable
would otherwise be ignored without a word). Code reads a variable only through `env(name)`. The one exception is
SCALE's standalone model code (scalecl.modeling, shipped inside checkpoints, so it imports nothing of the
suite): it reads SCALECL_SCALE_PRODUCTS itself, with the same two choices (a test keeps them equal).

Nothing here imports torch: the entry module (scalecl_launch) reads SCALECL_CPU_DEFAULTS before torch loads.
docs/install.md lists the same table for users (a test keeps the two equal).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scalecl.common.errors import ScaleclError
from scalecl.common.schema import Raw, check_range, coerce, show_value

PREFIX = "SCALECL_"
_SWITCH = {"0": False, "1": True, "false": False, "true": True}


@dataclass(frozen=True)
class Variable:
    """One environment variable: its type (bool is a switch: 0 or 1, also false or true), its value when unset,
    what it does, and its range as scalecl.common.schema.opt declares one (ge, gt, le, lt, choices)."""

    name: str
    type: type
    default: Any
    meaning: str
    limits: dict[str, Any] = field(default_factory=dict)
    form: tuple[str, str] | None = None  # a str value: (a regular expression it matches whole, how errors show it)
    user: bool = True  # False: for the test suite or a script, not listed for users


def _var(name: str, type_: type, default: Any, meaning: str, *, form: tuple[str, str] | None = None,
         user: bool = True, **limits: Any) -> Variable:
    return Variable(name, type_, default, meaning, limits, form, user)


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    _var("SCALECL_PROGRESS_EVERY", float, 30.0, "seconds between progress lines when output is not a terminal "
         "(0: at every update)", ge=0.0),
    # in TFLOP/s: the largest dense peak of any accelerator is a few thousand; more than 10**5 is a value given
    # in GFLOP/s or FLOP/s by mistake, which would record an MFU 10**3 or 10**12 times too small
    _var("SCALECL_PEAK_TFLOPS", float, None, "the device's dense peak in TFLOP/s (more than 0, at most 10**5), for "
         "MFU where the suite does not know it", gt=0.0, le=1e5),
    _var("SCALECL_MEMORY_CHECK", bool, True, "0 skips the memory check before training"),
    _var("SCALECL_SCALE_PRODUCTS", str, "blocks", "how SCALE's widened linears form their products: blocks "
         "(default) or concat (one matrix product)", choices=("blocks", "concat")),
    _var("SCALECL_COMPILE_MIN_STEPS", int, 2000, "compute.compile=auto compiles the whole model on CUDA for a run of "
         "at least this many steps", ge=1),
    _var("SCALECL_TUNE_MALLOC", bool, True, "0 leaves glibc's allocator settings alone"),
    _var("SCALECL_CPU_DEFAULTS", bool, True, "0: do not set OMP_WAIT_POLICY"),
    _var("SCALECL_CRASH_AT", str, None, "tests: SIGKILL the process at a named point, <point>[:n] (the n-th time)",
         form=(r"[a-z0-9-]+(:[1-9][0-9]{0,8})?", "<point>[:n]"), user=False),
)}


def parse(var: Variable, text: str) -> Any:
    """The typed value of `text` for `var`, or one ScaleclError naming the variable."""
    if not text.strip():
        raise ScaleclError(f"{var.name} is empty: give it a value or unset it")
    if var.type is bool:
        value = _SWITCH.get(text.strip().lower())
        if value is None:
            raise ScaleclError(f"{var.name} must be 0 or 1, got {show_value(text)}")
        return value
    value = coerce(Raw(text), var.type, var.name)
    check_range(value, var.limits, var.name)
    if var.form is not None and not re.fullmatch(var.form[0], value):
        raise ScaleclError(f"{var.name} must have the form {var.form[1]}, got {show_value(text)}")
    return value


def env(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The typed value of the declared variable `name` (its default when unset); a bad value is one ScaleclError."""
    var = VARIABLES[name]  # an undeclared name is a bug: declare it above
    text = (os.environ if environ is None else environ).get(name)
    return var.default if text is None else parse(var, text)


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Every SCALECL_ variable that is set: declared, and its value of its type and in its range."""
    environ = os.environ if environ is None else environ
    for name in sorted(environ):
        if name.startswith(PREFIX) and name not in VARIABLES:
            raise ScaleclError(f"unknown environment variable {name}; known: {', '.join(VARIABLES)}")
        if name in VARIABLES:
            parse(VARIABLES[name], environ[name])


# ---------------------------------------------------------------------------------------------------------
# CPU thread defaults: OMP_WAIT_POLICY=PASSIVE (an idle OpenMP thread sleeps at once instead of spinning ~3 ms,
# so it does not take a core another process, or the other rank of a run, needs). OpenMP reads it once, when
# torch loads; `import scalecl` (scalecl/__init__.py) and the `scalecl` command (scalecl_launch) set it first.

CPU_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # a user setting any of these has chosen how OpenMP waits
APPLIED: dict[str, str] = {}  # what this process set (provenance: scalecl.compute.machine.cpu_thread_settings)


def cpu_thread_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ`: the defaults it does not already decide; none if opted out (or if
    SCALECL_CPU_DEFAULTS is not 0 or 1: the command then refuses it with one line when it starts)."""
    try:
        if not env("SCALECL_CPU_DEFAULTS", environ):
            return {}
    except ScaleclError:
        return {}
    return {} if any(v in environ for v in WAIT_VARS) else dict(CPU_DEFAULTS)


def apply_cpu_defaults(torch_loaded: bool) -> str | None:
    """Set the CPU thread defaults in this process's environment before torch loads (recorded in APPLIED); when
    torch is loaded already, set nothing and return the one-line warning that says how to get them."""
    wanted = cpu_thread_defaults(os.environ)
    if not wanted:
        return None
    if torch_loaded:
        setting = " ".join(f"{k}={v}" for k, v in wanted.items())
        return (f"scalecl: torch was imported before scalecl, too late for scalecl's CPU default {setting}: idle "
                f"OpenMP threads spin, which on a shared CPU made upscale() 8x slower; import scalecl before torch, "
                f"or run with {setting} set (SCALECL_CPU_DEFAULTS=0 turns this note off)")
    os.environ.update(wanted)
    APPLIED.update(wanted)
    return None

