"""`--out` / save_model never delete or overwrite what the suite did not write, and never half-replace a checkpoint.

Folders are compared byte for byte (every path, every file's bytes) before and after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import scalecl.training.checkpoint as ckpt
import scalecl.training.layouts as layouts
from scalecl import save_model
from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.common.files import make_temporary
from scalecl.methods import get_method
from scalecl.models.build import model_from_config, tiny_config

runner = CliRunner()
UPSCALE = ["upscale", "--random-config", "llama", "--hidden-up", "32", "--ffn-up", "16", "--variant", "adapt"]
PREPARE = ["prepare", "--method", "fft", "--random-config", "gpt_neox"]


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root (hidden ones too) with its bytes (None for folders)."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def one_error_line(res) -> str:
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert "Traceback" not in res.output
    return lines[0]


@pytest.fixture
def foreign(tmp_path) -> Path:
    """A user's folder: files, a hidden file, a subfolder (no scalecl.json)."""
    d = tmp_path / "mine"
    (d / "notes").mkdir(parents=True)
    (d / "paper.tex").write_text("\\section{results}\n")
    (d / ".env").write_text("KEY=value\n")
    (d / "notes" / "todo.md").write_text("- run it\n")
    (d / "model.safetensors").write_bytes(b"not mine to replace")
    return d


@pytest.fixture(scope="module")
def lora_ckpt(tmp_path_factory) -> Path:
    """A tiny LoRA checkpoint for `merge --model`."""
    method = get_method("lora", rank=2)
    model = method.apply(model_from_config(tiny_config("gpt_neox", num_hidden_layers=1), seed=0))
    return save_model(model, tmp_path_factory.mktemp("src") / "lora", method, base_model="random:tiny")


def commands(lora_ckpt: Path) -> dict[str, list[str]]:
    return {"upscale": UPSCALE, "prepare": PREPARE, "merge": ["merge", "--model", str(lora_ckpt)]}


@pytest.mark.parametrize("cmd", ["upscale", "prepare", "merge"])
def test_foreign_folder_survives_every_command(cmd, foreign, lora_ckpt, monkeypatch):
    """--out at a user's folder, at '.' from inside it, and at an ancestor of the cwd: refused, nothing touched."""
    before, parent = tree(foreign), sorted(p.name for p in foreign.parent.iterdir())
    args = commands(lora_ckpt)[cmd]
    for overwrite in ([], ["--overwrite"]):
        assert "not empty and holds no scalecl checkpoint" in one_error_line(
            runner.invoke(app, [*args, "--out", str(foreign), *overwrite]))
    for cwd, out in ((foreign, "."), (foreign / "notes", ".."), (foreign / "notes", str(foreign.parent))):
        monkeypatch.chdir(cwd)
        assert "current folder or contains it" in one_error_line(runner.invoke(app, [*args, "--out", out, "--overwrite"]))
    assert tree(foreign) == before
    assert sorted(p.name for p in foreign.parent.iterdir()) == parent  # no temporary sibling left behind


@pytest.mark.parametrize("cmd", ["upscale", "prepare", "merge"])
def test_files_and_paths_under_files_are_refused(cmd, tmp_path, lora_ckpt):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"\x00\x01")
    args = commands(lora_ckpt)[cmd]
    assert "is a file" in one_error_line(runner.invoke(app, [*args, "--out", str(f)]))
    assert "which is a file" in one_error_line(runner.invoke(app, [*args, "--out", str(f / "sub")]))
    assert f.read_bytes() == b"\x00\x01" and sorted(p.name for p in tmp_path.iterdir()) == ["weights.bin"]


def test_existing_checkpoint_needs_overwrite(tmp_path):
    out = tmp_path / "ck"
    assert runner.invoke(app, [*UPSCALE, "--out", str(out)]).exit_code == 0
    before = tree(out)
    assert "pass --overwrite" in one_error_line(runner.invoke(app, [*UPSCALE, "--variant", "route", "--out", str(out)]))
    assert tree(out) == before
    res = runner.invoke(app, [*UPSCALE, "--variant", "route", "--out", str(out), "--overwrite"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "scalecl.json").read_text())["method"] == "scale-route"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # the old one was removed, no sibling left
    # a checkpoint holding a file the suite did not write is not replaced, even with --overwrite
    (out / "my_eval.txt").write_text("keep me")
    before = tree(out)
    assert "did not write (my_eval.txt)" in one_error_line(runner.invoke(app, [*PREPARE, "--out", str(out), "--overwrite"]))
    assert tree(out) == before


def test_empty_folder_is_filled(tmp_path):
    (tmp_path / "empty").mkdir()
    res = runner.invoke(app, [*PREPARE, "--out", str(tmp_path / "empty")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "empty" / "scalecl.json").is_file()


def _checkpoint(tmp_path: Path, name: str = "ck") -> tuple[Path, object]:
    model = model_from_config(tiny_config("llama", num_hidden_layers=1), seed=0)
    return save_model(model, tmp_path / name), model


def test_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    out, model = _checkpoint(tmp_path)
    before = tree(out)

    def half_written(m, filename, **kw):
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(layouts.st, "save_model", half_written)
    with pytest.raises(OSError, match="disk full"):
        save_model(model, out, overwrite=True)
    assert tree(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_crash_while_renaming_restores_the_previous_checkpoint(tmp_path, monkeypatch):
    out, model = _checkpoint(tmp_path)
    before = tree(out)
    real, calls = os.rename, []

    def second_rename_fails(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # the old checkpoint is aside; moving the new one in fails
            raise OSError("interrupted")
        return real(src, dst)

    monkeypatch.setattr(ckpt.os, "rename", second_rename_fails)
    with pytest.raises(OSError, match="interrupted"):
        save_model(model, out, overwrite=True)
    assert tree(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_stale_siblings_of_a_killed_save_are_cleaned_up(tmp_path):
    """A killed process leaves `.{name}.tmp-{pid}-*` (and at worst `.{name}.old-{pid}-*` with no checkpoint):
    the next save removes the first and puts the second back; a live process's siblings are left alone."""
    out, model = _checkpoint(tmp_path)
    pid = _dead_pid()
    stale = make_temporary(tmp_path, f".ck.tmp-{pid}-")  # made as save_model makes it: with the suite's mark
    (stale / "model.safetensors").write_bytes(b"partial")
    live = tmp_path / f".ck.tmp-{os.getppid()}-xyz"  # pytest's parent process is alive
    live.mkdir()
    before = tree(out)
    os.rename(out, tmp_path / f".ck.old-{pid}-def")  # killed between the two renames of a replace
    with pytest.raises(ScaleclError, match="pass overwrite=True"):  # the old checkpoint is back, so it is protected
        save_model(model, out)
    assert tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ck", live.name])


def test_library_refuses_foreign_folders(foreign):
    before = tree(foreign)
    with pytest.raises(ScaleclError, match="holds no scalecl checkpoint"):
        save_model(model_from_config(tiny_config("llama", num_hidden_layers=1)), foreign, overwrite=True)
    assert tree(foreign) == before
