"""The SCALECL_* environment variables: one declared table, every value checked when any command starts.

A bad value is one `error:` line naming the variable and exit code 2 before anything runs (SCALECL_PEAK_TFLOPS=nan
wrote `"mfu": NaN` into result.json; SCALECL_PROGRESS_EVERY=abc was a traceback once training began). The code
reads no SCALECL_ variable but through the table, the docs list the same variables, and SCALE's standalone model
code accepts the same SCALECL_SCALE_PRODUCTS values.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.common.environment import VARIABLES, check_environment, env
from scalecl.common.errors import ScaleclError

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

BAD = [
    ("SCALECL_PROGRESS_EVERY", "abc", "expects a number"),
    ("SCALECL_PROGRESS_EVERY", "-1", "must be >= 0"),
    ("SCALECL_PEAK_TFLOPS", "nan", "expects a number"),
    ("SCALECL_PEAK_TFLOPS", "inf", "expects a number"),
    ("SCALECL_PEAK_TFLOPS", "-1", "must be > 0"),
    ("SCALECL_PEAK_TFLOPS", "0", "must be > 0"),
    ("SCALECL_PEAK_TFLOPS", "989e12", "must be <= 100000"),  # FLOP/s, not TFLOP/s
    ("SCALECL_PEAK_TFLOPS", "", "is empty"),
    ("SCALECL_MEMORY_CHECK", "no", "must be 0 or 1"),
    ("SCALECL_TUNE_MALLOC", "2", "must be 0 or 1"),
    ("SCALECL_CPU_DEFAULTS", "off", "must be 0 or 1"),
    ("SCALECL_SCALE_PRODUCTS", "fused", "must be one of blocks, concat"),
    ("SCALECL_CRASH_AT", "final-model-written:0", "must have the form <point>[:n]"),
    ("SCALECL_MEMORY_CHEK", "0", "unknown environment variable SCALECL_MEMORY_CHEK"),
]


def one_error(res) -> str:
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), (res.output, res.exception)
    return lines[0]


@pytest.mark.parametrize("name, value, phrase", BAD)
def test_a_bad_value_is_one_error_naming_the_variable(name, value, phrase, tmp_path):
    line = one_error(runner.invoke(app, ["plot", "--results", str(tmp_path), "--out", str(tmp_path / "f")],
                                   env={name: value}))
    assert name in line and phrase in line, line
    assert list(tmp_path.iterdir()) == []


def _required_args(cmd) -> list[str]:
    """Placeholder values for a command's required options and arguments, so that it reaches its body."""
    args = []
    for p in cmd.params:
        if p.required:
            args += [p.opts[0], "x"] if p.param_type_name == "option" else ["x"]
    return args


@pytest.mark.parametrize("command", sorted(typer.main.get_command(app).commands))
def test_every_command_checks_the_environment_before_it_starts(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = typer.main.get_command(app).commands[command]
    line = one_error(runner.invoke(app, [command, *_required_args(cmd)], env={"SCALECL_PEAK_TFLOPS": "nan"}))
    assert "SCALECL_PEAK_TFLOPS" in line
    assert list(tmp_path.iterdir()) == []


def test_values_are_typed_and_unset_ones_take_their_default():
    assert env("SCALECL_PEAK_TFLOPS", {}) is None and env("SCALECL_PEAK_TFLOPS", {"SCALECL_PEAK_TFLOPS": "312"}) == 312.0
    assert env("SCALECL_PROGRESS_EVERY", {}) == 30.0 and env("SCALECL_PROGRESS_EVERY", {"SCALECL_PROGRESS_EVERY": "0"}) == 0
    assert [env("SCALECL_MEMORY_CHECK", {"SCALECL_MEMORY_CHECK": v}) for v in ("0", "1", "false", "TRUE")] == [
        False, True, False, True]
    assert env("SCALECL_SCALE_PRODUCTS", {}) == "blocks"
    assert env("SCALECL_CRASH_AT", {"SCALECL_CRASH_AT": "checkpoint-renamed:2"}) == "checkpoint-renamed:2"
    check_environment({"PATH": "/bin", "SCALECL_TUNE_MALLOC": "0"})
    with pytest.raises(ScaleclError, match="SCALECL_TUNE_MALLOC"):
        check_environment({"SCALECL_TUNE_MALLOC": "yes"})


def _sources() -> list[Path]:
    """The code: the package, the launcher and the benchmarks (not benchmarks/results, records of runs whose logs
    may quote a variable a run was refused for)."""
    bench = ROOT / "benchmarks"
    return [*sorted((ROOT / "scalecl").rglob("*.py")), ROOT / "scalecl_launch.py",
            *sorted(p for p in bench.rglob("*") if p.relative_to(bench).parts[0] != "results")]


def test_every_variable_the_code_names_is_declared_and_read_through_the_table():
    named, direct = set(), []
    read = re.compile(r"""environ(?:\.get)?\s*[(\[]\s*["']SCALECL_""")
    for f in _sources():
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        named |= set(re.findall(r"SCALECL_[A-Z0-9_]*[A-Z0-9]", text))
        standalone = f.parent.name == "modeling"  # shipped inside checkpoints: imports nothing of the suite
        if f.suffix == ".py" and read.search(text) and f.name != "environment.py" and not standalone:
            direct.append(str(f.relative_to(ROOT)))
    assert sorted(named - set(VARIABLES)) == [] and direct == []


def test_the_standalone_model_code_accepts_the_same_products():
    from scalecl.modeling.scale_layers import PRODUCTS

    assert VARIABLES["SCALECL_SCALE_PRODUCTS"].limits["choices"] == PRODUCTS


def test_the_docs_list_the_same_variables():
    text = (ROOT / "docs" / "install.md").read_text()
    listed = set(re.findall(r"^\| `(SCALECL_[A-Z0-9_]+)", text, re.MULTILINE))
    assert listed == {v.name for v in VARIABLES.values() if v.user}
