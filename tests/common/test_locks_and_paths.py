"""One lock rule for every folder the suite writes, and one path rule for every `--out`.

A second writer of a folder stops with one line and exit 1 (plot, upscale/prepare/merge, a run's results
folder even with other --checkpoints) or waits and then writes beside the first (eval-ppl, eval-harness),
so a manifest never loses an entry. A symbolic link given as --out means the folder it names, for every
command; cache keys do not depend on how --cache is spelled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.common.errors import Busy
from scalecl.common.locks import lock_path, locked
from scalecl.experiments.base import adopt_entry, path_key
from tests.common.test_damaged_files import fake_bio_run, one_error

runner = CliRunner()
HOLD = ("import sys, time; from filelock import FileLock; l = FileLock(sys.argv[1]); l.acquire(); "
        "print('held', flush=True); time.sleep(float(sys.argv[2]))")
UPSCALE = ["upscale", "--random-config", "llama", "--hidden-up", "32", "--ffn-up", "16"]
TINY = ["train-cpt", "--preset", "tiny", "--method", "fft", "--checkpoints", "ck"]


class held:
    """Another process holding the lock of `target` for `seconds`."""

    def __init__(self, target: Path, seconds: float = 30.0) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", HOLD, str(lock_path(target)), str(seconds)],
                                  stdout=subprocess.PIPE, text=True)
        assert self.p.stdout.readline().strip() == "held"

    def __enter__(self) -> held:
        return self

    def __exit__(self, *exc) -> None:
        self.p.kill()
        self.p.wait()


def busy_line(res) -> str:
    line = one_error(res, code=1)
    assert "is being written by another process" in line, line
    return line


def test_a_lock_is_reentrant_in_its_process_and_found_however_the_path_is_spelled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    os.symlink("out", tmp_path / "alias")
    assert lock_path(Path("out")) == lock_path(tmp_path / "out") == lock_path(Path("alias")) == \
        lock_path(Path("./out/../out"))
    with locked(Path("out"), wait=False, what="outer"), locked(tmp_path / "alias", wait=False, what="inner"):
        assert lock_path(Path("out")).exists()
    assert not lock_path(Path("out")).exists()  # released once, by the outer block


def test_a_second_plot_into_one_folder_stops_with_one_line(tmp_path):
    fake_bio_run(tmp_path / "results")
    out = tmp_path / "figs"
    with held(out):
        busy_line(runner.invoke(app, ["plot", "--results", str(tmp_path / "results"), "--out", str(out)]))
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("args", [UPSCALE, ["prepare", "--method", "lora", "--random-config", "llama"]])
def test_a_second_writer_of_a_checkpoint_folder_stops_with_one_line(tmp_path, args):
    out = tmp_path / "ck"
    with held(out):
        busy_line(runner.invoke(app, [*args, "--out", str(out)]))
    assert not out.exists()
    assert runner.invoke(app, [*args, "--out", str(out)]).exit_code == 0  # free again: written


def test_a_run_folder_is_locked_whatever_checkpoints_folder_is_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, [*TINY, "--out", "first", "--cache", "cache"]).exit_code == 0
    (run,) = Path("first").glob("tiny-fft-*")
    (run / "result.json").rename(run / "kept.json")  # unfinished again: a second process would train it
    with held(Path("out") / run.name):
        res = runner.invoke(app, [*TINY, "--out", "out", "--cache", "cache", "--checkpoints", "other"])
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.exit_code == 1 and len(lines) == 1 and "is being written by another process" in lines[0], res.output
    assert not list(Path("out").glob("*/result.json"))


def test_eval_ppl_waits_for_the_folder_and_both_records_are_kept(tmp_path, monkeypatch):
    from scalecl.experiments.eval_ppl import write_record

    out = tmp_path / "ppl"
    out.mkdir()
    write_record(out / "a.json", {"ppl": 1.0})
    with held(out, 1.5):
        t = time.perf_counter()
        write_record(out / "b.json", {"ppl": 2.0})  # waits for the other writer, then adds its record
        assert time.perf_counter() - t > 1.0
    manifest = json.loads((out / ".scalecl-eval-ppl-files.json").read_text())
    assert set(manifest["files"]) == {"a.json", "b.json"}


def test_a_symlinked_out_is_the_folder_it_names_for_every_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("ck", "runs", "figs"):
        Path(f"real-{name}").mkdir()
        os.symlink(f"real-{name}", name)
    assert runner.invoke(app, [*UPSCALE, "--out", "ck"]).exit_code == 0
    assert Path("ck").is_symlink() and (Path("real-ck") / "scalecl.json").is_file()
    assert runner.invoke(app, [*UPSCALE, "--out", "ck", "--overwrite"]).exit_code == 0
    assert Path("ck").is_symlink() and (Path("real-ck") / "scalecl.json").is_file()
    # (checkpoints elsewhere: inside the checkpoint `ck` now is, nothing is written)
    assert runner.invoke(app, [*TINY, "--out", "runs", "--cache", "cache", "--checkpoints", "k2"]).exit_code == 0
    assert Path("runs").is_symlink() and list(Path("real-runs").glob("*/result.json"))
    assert "lies inside" in one_error(runner.invoke(app, [*TINY, "--out", "runs2", "--cache", "cache"]))
    os.symlink(tmp_path / "nothing", "gone")
    for args in ([*UPSCALE, "--out", "gone"], [*TINY, "--out", "gone", "--cache", "cache"]):
        assert "symbolic link to nothing" in one_error(runner.invoke(app, args))


def test_cache_keys_do_not_depend_on_how_the_cache_is_spelled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.symlink("cache", "alias")
    outputs = [runner.invoke(app, [*TINY, "--out", f"out{i}", "--cache", cache]).output
               for i, cache in enumerate(("cache", str(tmp_path / "cache"), "alias", "./cache"))]
    assert ["pre-train base" in o for o in outputs] == [True, False, False, False]
    assert len(list(Path("cache/cpt").glob("base-*"))) == 1
    assert path_key("cache/cpt/x", Path("cache")) == "cache/cpt/x"  # what the default spelling always gave
    Path("cache/cpt/x").mkdir()
    assert path_key(str(tmp_path / "cache/cpt/x"), tmp_path / "cache") == path_key("alias/cpt/x", Path("alias")) \
        == "cache/cpt/x"
    assert path_key("org/model", Path("cache")) == "org/model"  # not a path here: a hub id, as given


def test_an_entry_under_an_older_spelling_key_is_renamed_once_and_said(tmp_path):
    old, new = tmp_path / "stage1-old", tmp_path / "stage1-new"
    old.mkdir()
    (old / "model.safetensors").write_text("w")
    said = []
    adopt_entry(old, new, said.append)
    assert not old.exists() and (new / "model.safetensors").read_text() == "w" and "renamed" in said[0]
    old.mkdir()
    adopt_entry(old, new, said.append)  # the new key's entry is there: nothing moves
    assert old.is_dir() and len(said) == 1


def test_busy_is_exit_1():
    assert Busy("x").exit_code == 1
