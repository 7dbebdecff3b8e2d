"""Inputs a hostile tester tried: each is one `error:` line (or works), never a traceback or a quiet wrong run.

Text that is not text (JSON numbers, lists, objects), folders of mixed formats or with a loading script, a
container's memory limit, SCALE's product setting as part of a run's name, an output inside a cache entry or a
checkpoint (or a cached stage itself), a run finished by another process while this one waited, WORLD_SIZE set by hand or to garbage,
repeated study values, and a short write while an encoding is cached.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from scalecl.cli import app

runner = CliRunner()


def _one_error(res, *phrases: str, code: int = 2) -> str:
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert res.exit_code == code and len(errors) == 1 and lines[-1] == errors[0], res.output
    assert "Traceback" not in res.output
    for phrase in phrases:
        assert phrase in errors[0], (phrase, errors[0])
    return errors[0]


def _ppl(local: Path, data: Path | str, tmp: Path, *more: str) -> list[str]:
    return ["eval-ppl", "--model", str(local / "llama"), "--dataset", str(data), "--seq-len", "32",
            "--cache", str(tmp / "cache"), *more]


def _cpt(local: Path, data: Path | str, tmp: Path, *more: str) -> list[str]:
    c = str(local / "corpus" / "en")
    return ["train-cpt", "--preset", "tiny", "--method", "fft", "--model", str(local / "llama"), "--data", str(data),
            "--old-eval", c, "--new-eval", c, "--set", "old_eval.split=test", "--set", "new_eval.split=test",
            "--set", "train.seq_len=32", "--out", str(tmp / "runs"), "--cache", str(tmp / "cache"),
            "--checkpoints", str(tmp / "ck"), *more]


# -- text readers --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, kind", [(123, "a number"), (["a b", "c d"], "a list"), ({"t": "a b"}, "an object"),
                                         (True, "a boolean")])
def test_json_values_that_are_not_text_are_refused(local, tmp_path, value, kind):
    f = tmp_path / "docs.jsonl"
    f.write_text("".join(json.dumps({"text": value}) + "\n" for _ in range(3)))
    _one_error(runner.invoke(app, _ppl(local, f, tmp_path)), "document 0 of column 'text' is " + kind, "not text")
    _one_error(runner.invoke(app, _cpt(local, f, tmp_path)), kind, "not text")
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("result.json"))


def test_a_folder_of_mixed_formats_is_refused(local, tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "a.txt").write_text("one line of text\nanother line of text\n")
    (d / "b.jsonl").write_text(json.dumps({"text": "one document"}) + "\n")
    line = _one_error(runner.invoke(app, _ppl(local, d, tmp_path)), "several formats", "json (.jsonl)", "text (.txt)")
    assert "quoted glob" in line
    _one_error(runner.invoke(app, _cpt(local, d, tmp_path)), "several formats")
    (d / "b.jsonl").unlink()  # one format: read
    (d / ".hidden.jsonl").write_text("{}\n")  # a hidden file is no data
    assert runner.invoke(app, _ppl(local, d, tmp_path)).exit_code == 0


def test_a_folder_with_a_loading_script_is_one_line(local, tmp_path):
    d = tmp_path / "scripted"
    d.mkdir()
    (d / "scripted.py").write_text("raise SystemExit('a dataset script must never run')\n")
    (d / "data.jsonl").write_text(json.dumps({"text": "one document"}) + "\n")
    _one_error(runner.invoke(app, _ppl(local, d, tmp_path)), "loading script (scripted.py)", "never would")
    _one_error(runner.invoke(app, _cpt(local, d, tmp_path)), "loading script")


# -- the memory check ----------------------------------------------------------------------------------------


def _cgroup(tmp: Path, limit: str, usage: int, inactive: int, v1: bool = False) -> tuple:
    (tmp / "max").write_text(limit + "\n")
    (tmp / "current").write_text(f"{usage}\n")
    key = "total_inactive_file" if v1 else "inactive_file"
    (tmp / "stat").write_text(f"anon 1\n{key} {inactive}\nfile 5\n")
    return ((str(tmp / "max"), str(tmp / "current"), str(tmp / "stat"), key),)


def test_the_memory_check_reads_the_containers_limit(tmp_path, monkeypatch):
    import scalecl.compute.machine as machine

    gib = 2**30
    monkeypatch.setattr(machine, "CGROUP_FILES", _cgroup(tmp_path, str(3 * gib // 2), gib // 2, gib // 4))
    assert machine.cgroup_room() == 3 * gib // 2 - (gib // 2 - gib // 4)  # page cache it can drop is room
    assert machine.available_memory() <= machine.cgroup_room()
    monkeypatch.setattr(machine, "CGROUP_FILES", _cgroup(tmp_path, "max", gib, 0))
    assert machine.cgroup_room() is None  # cgroup v2: no limit
    monkeypatch.setattr(machine, "CGROUP_FILES", _cgroup(tmp_path, str(2**63 - 4096), gib, 0, v1=True))
    assert machine.cgroup_room() is None  # cgroup v1 writes "no limit" as a huge number
    monkeypatch.setattr(machine, "CGROUP_FILES", (("/nonexistent/memory.max", "/x", "/y", "k"),))
    assert machine.cgroup_room() is None


def test_a_run_past_the_containers_limit_is_refused_before_work(local, tmp_path, monkeypatch):
    import scalecl.compute.machine as machine

    monkeypatch.delenv("SCALECL_MEMORY_CHECK", raising=False)
    monkeypatch.setattr(machine, "CGROUP_FILES", _cgroup(tmp_path, str(2**20), 0, 0))  # 1 MiB left
    _one_error(runner.invoke(app, _ppl(local, local / "corpus" / "en", tmp_path, "--split", "test")),
               "more than the 1 MiB available")
    _one_error(runner.invoke(app, _cpt(local, local / "corpus" / "ko", tmp_path)), "more than the 1 MiB available")
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("result.json"))


# -- run identity and guards ---------------------------------------------------------------------------------


def test_scale_products_are_part_of_a_scale_runs_name(local, tmp_path, monkeypatch):
    """Runs made with SCALECL_SCALE_PRODUCTS=concat are other runs than the default's (other last bits, and through
    training other numbers): a blocks run is never resumed, nor served as finished, under concat."""
    import scalecl.experiments.cpt as cpt
    from scalecl.compute.processes import Dist
    from scalecl.experiments import load_preset
    from scalecl.experiments.base import Paths
    from scalecl.methods import get_method
    from tests.conftest import local_sets

    exp = cpt.CptExperiment(load_preset("cpt", "tiny", local_sets(local)), "tiny", Paths(tmp_path, tmp_path, tmp_path))
    route, fft = get_method("scale-route", **exp.rc.method_options("scale-route")), get_method("fft")
    blocks = {m.name: exp.run_of(m, Dist()) for m in (route, fft)}
    monkeypatch.setenv("SCALECL_SCALE_PRODUCTS", "concat")
    concat = {m.name: exp.run_of(m, Dist()) for m in (route, fft)}
    assert concat["scale-route"].name != blocks["scale-route"].name
    assert concat["scale-route"].identity["numerics"]["scale_products"] == "concat"
    assert concat["fft"].name == blocks["fft"].name  # no SCALE products in FFT
    assert "scale_products" not in blocks["scale-route"].identity["numerics"]  # default: names as before


def test_an_output_inside_a_cache_entry_or_a_checkpoint_is_refused(local, tmp_path):
    entry = tmp_path / "cache" / "cpt" / "corpus-0123"
    entry.mkdir(parents=True)
    (entry / "scalecl-cache.json").write_text("{}")
    inside_ck = local / "llama" / "sub"
    (tmp_path / "results").mkdir()
    for args, phrase in (
        (["upscale", "--random-config", "llama", "--hidden-up", "32", "--out", str(entry / "up")], str(entry)),
        (["prepare", "--method", "fft", "--random-config", "llama", "--out", str(inside_ck)], str(local / "llama")),
        (_ppl(local, local / "corpus" / "en", tmp_path, "--split", "test", "--out", str(entry / "ppl.json")),
         str(entry)),
        (_cpt(local, local / "corpus" / "ko", tmp_path)[:-6] + ["--out", str(entry / "runs"), "--cache",
                                                               str(tmp_path / "c2"), "--checkpoints",
                                                               str(tmp_path / "k2")], str(entry)),
        (_cpt(local, local / "corpus" / "ko", tmp_path)[:-6] + ["--out", str(tmp_path / "r3"), "--cache",
                                                               str(entry / "c"), "--checkpoints",
                                                               str(tmp_path / "k3")], str(entry)),
        (["plot", "--results", str(tmp_path / "results"), "--out", str(inside_ck)], str(local / "llama")),
    ):
        _one_error(runner.invoke(app, args), "lies inside", phrase, "verifies on read")
    assert sorted(p.name for p in entry.iterdir()) == ["scalecl-cache.json"]
    assert not inside_ck.exists()


def test_a_cached_stage_is_never_a_writers_destination(local, tmp_path):
    """A cached stage (train-cpt's base, train-bio's stages) is a checkpoint of the suite, but one that later runs
    read as their base: upscale, prepare, merge and save_model never replace it, --overwrite or not."""
    from scalecl import load_model, save_model
    from scalecl.common.errors import ScaleclError

    entry = tmp_path / "cache" / "cpt" / "base-0123456789"
    save_model(load_model(local / "llama"), entry, base_model="builtin", extra={"stage": {"steps": 0}})
    before = {p.name: p.read_bytes() for p in entry.iterdir()}
    for args in (["upscale", "--random-config", "llama", "--hidden-up", "32", "--out", str(entry)],
                 ["prepare", "--method", "fft", "--model", str(local / "llama"), "--out", str(entry)],
                 ["merge", "--model", str(local / "llama"), "--out", str(entry)]):
        for more in ([], ["--overwrite"]):
            line = _one_error(runner.invoke(app, args + more), "is a cache entry", "outside the cache")
            assert "--overwrite" not in line
    with pytest.raises(ScaleclError, match="is a cache entry"):
        save_model(load_model(local / "llama"), entry, overwrite=True)
    assert {p.name: p.read_bytes() for p in entry.iterdir()} == before


def test_a_training_checkpoint_given_as_a_model_names_the_model_inside_it(local, tmp_path):
    """A run's step folder (its record, training state, and the model in model/) given as --model: one line in
    every command that takes one, naming step-N/model, which each takes."""
    import shutil

    step = tmp_path / "ck" / "step-0000002"
    shutil.copytree(local / "llama", step / "model")
    (step / "scalecl-checkpoint.json").write_text("{}")
    (tmp_path / "tasks.yaml").write_text("task: none\n")
    for args in (_ppl(local, local / "corpus" / "en", tmp_path, "--split", "test")[:2] + [str(step)]
                 + _ppl(local, local / "corpus" / "en", tmp_path, "--split", "test")[3:],
                 ["eval-harness", "--model", str(step), "--tasks", str(tmp_path / "tasks.yaml"), "--out",
                  str(tmp_path / "h")],
                 ["merge", "--model", str(step), "--out", str(tmp_path / "m")],
                 ["upscale", "--model", str(step), "--hidden-up", "32", "--out", str(tmp_path / "u")],
                 ["prepare", "--method", "fft", "--model", str(step), "--out", str(tmp_path / "p")],
                 _cpt(local, local / "corpus" / "ko", tmp_path)[:6] + [str(step)]
                 + _cpt(local, local / "corpus" / "ko", tmp_path)[7:]):
        _one_error(runner.invoke(app, args), "is a training checkpoint", f"its model is {step / 'model'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "tasks.yaml"]


def test_a_run_finished_by_another_process_meanwhile_is_taken_as_finished(tmp_path):
    """Two `--resume` of one run: the one that waited finds the other's result.json as a finished run (the
    manifest read again), not as a file it did not write."""
    from scalecl.training.run import Run

    identity = {"experiment": "cpt", "name": "x", "method": "fft", "options": {}, "config_hash": "h"}
    loser, winner = (Run(dict(identity), tmp_path / "out", tmp_path / "ck") for _ in range(2))
    assert loser.result() is None
    loser.check_out_files()  # what the loser read before it waited
    winner.finish({"experiment": "cpt", "preset": "tiny", "method": "fft", "final": {"step": 1}})
    assert loser.result()["final"] == {"step": 1}


@pytest.mark.parametrize("env, phrase", [
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not a number of processes"),
    ({"WORLD_SIZE": "-3"}, "is not a number of processes"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 but RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not set"),
    ({"WORLD_SIZE": "2", "RANK": "x", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK is not set"),
])
def test_world_size_set_by_hand_or_garbage_is_one_line(local, tmp_path, monkeypatch, env, phrase):
    for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    _one_error(runner.invoke(app, _cpt(local, local / "corpus" / "ko", tmp_path)), phrase, "torchrun")
    assert not (tmp_path / "runs").exists()


def test_a_study_value_given_twice_is_one_run():
    from scalecl.experiments.study import study_configs

    _, values, configs = study_configs("tau", "tiny", "0.9;0.5;0.9;0.90", [])
    assert values == ["0.9", "0.5"] and len(configs) == 2 and configs[0] != configs[1]


def test_a_short_write_while_caching_an_encoding_is_one_os_error_line(tmp_path, monkeypatch):
    from scalecl.cli.errors import os_error_line
    from scalecl.data.tokenizer import save_array

    def short(path, array):
        Path(path).write_bytes(b"\x93NUMPY")
        raise OSError("60815 requested and 51168 written")

    monkeypatch.setattr(np, "save", short)
    with pytest.raises(OSError) as e:
        save_array(tmp_path / "ids.npy", np.arange(10))
    line = os_error_line(e.value)
    assert line is not None and str(tmp_path / "ids.npy") in line and "short write" in line and "EFBIG" in line
