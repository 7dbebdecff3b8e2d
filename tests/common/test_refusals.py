"""The second hostile probe's findings (issue 19), one test per mechanism: unusable output paths are bad input
(exit 2, nothing created), records that contradict themselves are refused, weights that would load only by being
cast, re-initialised or re-shaped are refused, plot writes all of its outputs or none, a run is finished only
by a result it wrote, locks leave nothing behind, and the remaining bad numbers are refused before any work.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.common.files import OwnedFiles, check_writable_dir
from tests.common.test_damaged_files import _copy, tree
from tests.conftest import reseal

runner = CliRunner()
PREPARE = ["prepare", "--method", "fft", "--random-config", "llama"]


def one_error(res, code: int = 2) -> str:
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == code and len(lines) == 1 and lines[0].startswith("error:"), (res.exit_code, res.output)
    assert "Traceback" not in res.output
    return lines[0]


def _edit_weights(folder: Path, change) -> None:
    f = folder / "model.safetensors"
    save_file(change(load_file(str(f))), str(f), metadata={"format": "pt"})
    if (folder / "scalecl.json").is_file():
        reseal(folder)  # an edit made to look like the suite's: the checks behind verification refuse it


# ---------------------------------------------------------------------------------------------------------
# unusable output paths: exit 2 before any work, nothing created


def test_a_name_longer_than_the_file_system_allows_is_bad_input(tmp_path):
    long = tmp_path / ("L" * 300)
    with pytest.raises(ScaleclError, match="bytes"):
        check_writable_dir(long)
    deep = tmp_path.joinpath(*(["d" * 200] * 25))  # ~5,000 bytes: over PATH_MAX
    with pytest.raises(ScaleclError, match="path is"):
        check_writable_dir(deep)
    before = tree(tmp_path)
    assert "bytes" in one_error(runner.invoke(app, [*PREPARE, "--out", str(long)]))
    assert tree(tmp_path) == before


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs /sys (Linux)")
def test_a_folder_where_nothing_can_be_created_is_bad_input():
    """/sys refuses new entries whoever asks (root included): found by trying, exit 2, not at the first write."""
    with pytest.raises(ScaleclError, match="not writable"):
        check_writable_dir(Path("/sys/kernel/scalecl-test-out"))
    assert "not writable" in one_error(runner.invoke(app, [*PREPARE, "--out", "/sys/kernel/scalecl-test-out"]))


def test_a_read_only_empty_output_folder_is_refused_not_replaced(tmp_path, monkeypatch):
    """An empty folder the user cannot write into (e.g. chmod 555 for a non-root user) was replaced by renaming
    a filled sibling onto it: now the folder itself is tried first."""
    import scalecl.common.files as files

    out = tmp_path / "ro"
    out.mkdir()
    real = files.tempfile.mkdtemp

    def mkdtemp(*a, dir=None, **k):  # noqa: A002  as creating an entry in a read-only folder fails
        if dir is not None and Path(dir) == out:
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(files.tempfile, "mkdtemp", mkdtemp)
    assert "not writable" in one_error(runner.invoke(app, [*PREPARE, "--out", str(out)]))
    assert out.is_dir() and not any(out.iterdir())


def test_empty_plot_out_is_refused(tmp_path):
    assert "--out is empty" in one_error(runner.invoke(app, ["plot", "--results", str(tmp_path), "--out", ""]))


# ---------------------------------------------------------------------------------------------------------
# records and weights that would load only by being trusted, cast, re-initialised or re-shaped


@pytest.mark.parametrize("change, phrase", [
    ({"format_version": 999}, "format version 999"),
    ({"layout": "scale"}, "does not match its method"),
    ({"layout": "lora"}, "does not match its method"),
])
def test_a_self_contradicting_checkpoint_record_is_refused(ckpt, tmp_path, change, phrase):
    d = _copy(ckpt, tmp_path / "x")
    meta = json.loads((d / "scalecl.json").read_text())
    meta.pop("record_digest")  # a record that keeps no digest of itself (an earlier scalecl's): the checks behind it
    (d / "scalecl.json").write_text(json.dumps(meta | change))
    (tmp_path / "text.txt").write_text("a document\n")  # the record is refused before the text is read
    for cmd in (["merge", "--model", str(d), "--out", str(tmp_path / "m")],
                ["eval-ppl", "--model", str(d), "--dataset", str(tmp_path / "text.txt")]):
        assert phrase in one_error(runner.invoke(app, cmd))
    assert not (tmp_path / "m").exists()


def test_integer_weights_are_refused_not_cast(ckpt, tmp_path):
    d = _copy(ckpt, tmp_path / "x")
    _edit_weights(d, lambda t: {k: v.to(torch.int32) for k, v in t.items()})
    line = one_error(runner.invoke(app, ["merge", "--model", str(d), "--out", str(tmp_path / "m")]))
    assert "I32" in line and "not a floating-point weight" in line


def test_merge_refuses_non_finite_weights_and_writes_nothing(ckpt, tmp_path):
    d = _copy(ckpt, tmp_path / "x")
    _edit_weights(d, lambda t: {k: torch.full_like(v, float("nan")) for k, v in t.items()})
    assert "non-finite weights" in one_error(runner.invoke(app, ["merge", "--model", str(d), "--out", str(tmp_path / "m")]))
    assert not (tmp_path / "m").exists()


def _plain_folder(ckpt: Path, dst: Path) -> Path:
    d = _copy(ckpt, dst)
    (d / "scalecl.json").unlink()
    return d


@pytest.mark.parametrize("damage, phrase", [
    ("missing", "missing from the files"),
    ("shape", "other shapes than its config.json"),
])
def test_a_base_missing_weights_or_of_other_shapes_is_one_line(ckpt, tmp_path, damage, phrase):
    """transformers would initialise a missing weight at random (and print a multi-line report): refused."""
    d = _plain_folder(ckpt, tmp_path / "x")
    if damage == "missing":
        _edit_weights(d, lambda t: {k: v for k, v in t.items() if "layers.0.mlp" not in k})
    else:
        _edit_weights(d, lambda t: {k: torch.zeros(v.shape[0] + 1, *v.shape[1:]) if "q_proj" in k else v
                                    for k, v in t.items()})
    for cmd in (["upscale", "--model", str(d), "--hidden-up", "32", "--ffn-up", "16", "--out", str(tmp_path / "u")],
                ["prepare", "--method", "lora", "--model", str(d), "--out", str(tmp_path / "p")]):
        res = runner.invoke(app, cmd)
        assert phrase in one_error(res), res.output
        assert "LOAD REPORT" not in res.output
    assert not (tmp_path / "u").exists() and not (tmp_path / "p").exists()


@pytest.mark.parametrize("field, value", [("rope_theta", "abc"), ("rms_norm_eps", -1.0), ("rope_theta", 0)])
def test_real_valued_config_fields_are_checked(ckpt, tmp_path, field, value):
    d = _plain_folder(ckpt, tmp_path / "x")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg | {field: value}))
    line = one_error(runner.invoke(app, ["prepare", "--method", "lora", "--model", str(d), "--out", str(tmp_path / "p")]))
    assert field in line and "finite number" in line


# ---------------------------------------------------------------------------------------------------------
# plot: all outputs or none


def test_deferred_owned_files_write_nothing_until_every_name_is_checked(tmp_path):
    out = tmp_path / "figs"
    out.mkdir()
    (out / "b.csv").write_text("the user's")
    w = OwnedFiles(out, "scalecl plot", deferred=True)
    w.write("a.png", b"png")
    with pytest.raises(ScaleclError, match="b.csv"):
        w.write("b.csv", "ours")
    assert sorted(p.name for p in out.iterdir()) == ["b.csv"]  # a.png held, never written
    w2 = OwnedFiles(out, "scalecl plot", deferred=True)
    w2.write("a.png", b"png")
    (out / "a.png").write_text("appeared meanwhile")  # checked again at flush: still refused, nothing written
    with pytest.raises(ScaleclError, match="a.png"):
        w2.flush()
    assert (out / "a.png").read_text() == "appeared meanwhile"


# ---------------------------------------------------------------------------------------------------------
# a run is finished only by a result.json it wrote


def test_a_result_json_the_run_did_not_write_is_not_a_finished_run(tmp_path, local):
    from tests.conftest import local_sets, run

    sets = local_sets(local, "llama", "train.steps=2", "eval.every=2")
    run(tmp_path, sets, ["fft"])
    (f,) = list((tmp_path / "out").rglob("result.json"))
    f.write_text('{"summary": {"x": NaN}}')  # e.g. edited by hand: no longer the file the run recorded
    with pytest.raises(ScaleclError, match="not written by scalecl run"):
        run(tmp_path, sets, ["fft"])


# ---------------------------------------------------------------------------------------------------------
# locks leave nothing behind


def test_a_released_lock_leaves_no_file_and_no_folder_it_made(tmp_path):
    from scalecl.common.locks import lock_path, locked

    target = tmp_path / "a" / "b" / "run"
    with locked(target, wait=False, what="run"):
        assert lock_path(target).exists()
    assert not (tmp_path / "a").exists()
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "mine.txt").write_text("x")
    with locked(tmp_path / "keep" / "run", wait=False, what="run"):
        pass
    assert sorted(p.name for p in (tmp_path / "keep").iterdir()) == ["mine.txt"]


def test_a_lock_removed_while_waited_on_is_taken_afresh(tmp_path):
    """The holder removes its lock file before releasing: a waiter that had opened the old file must not think
    it holds the lock (filelock re-checks the link count), and two holders never overlap."""
    import threading

    from scalecl.common.locks import locked

    target, inside, overlaps = tmp_path / "run", [], []

    def worker():
        for _ in range(20):
            with locked(target, wait=True, what="run"):
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(1)
                inside.pop()

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not overlaps and not any(t.is_alive() for t in threads)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------
# numbers and names refused before any work


@pytest.mark.parametrize("name, phrase", [("cpu:99", "one CPU device"), ("", "--device is empty"),
                                          ("  ", "--device is empty")])
def test_devices_that_do_not_exist_are_refused(name, phrase):
    from scalecl.compute.machine import pick_device

    with pytest.raises(ScaleclError, match=phrase):
        pick_device(name)
    assert pick_device("cpu").type == "cpu" and pick_device("cpu:0").type == "cpu"


def test_stop_after_beyond_any_run_is_refused():
    from scalecl.experiments.sweep import SweepOptions

    with pytest.raises(ScaleclError, match="--stop-after"):
        SweepOptions(stop_after=2**63)
    assert SweepOptions(stop_after=10).stop_after == 10


def test_lora_alpha_must_be_positive():
    from scalecl.methods import get_method

    for alpha in (-8, 0):
        with pytest.raises(ScaleclError, match="alpha"):
            get_method("lora", rank=4, alpha=alpha)
    assert get_method("lora", rank=4, alpha=8).alpha == 8


def test_harness_bootstrap_and_metric_overrides_are_checked():
    from scalecl.evaluation.harness import (
        HarnessSettings,
        TaskSelection,
        _check_settings,
        check_metric_overrides,
    )

    with pytest.raises(ScaleclError, match="--bootstrap-iters"):
        _check_settings(HarnessSettings(bootstrap_iters=-1))
    _check_settings(HarnessSettings(bootstrap_iters=0))
    sel = TaskSelection(("arc_easy", "kobest_boolq"), ())
    with pytest.raises(ScaleclError, match="'hellaswag'"):
        check_metric_overrides({"hellaswag": "acc"}, sel)
    check_metric_overrides({"kobest_boolq": "f1"}, sel)


def test_empty_tokenizer_and_huge_ppl_batch_are_refused(tmp_path):
    assert "--tokenizer is empty" in one_error(runner.invoke(app, ["train-bio", "--preset", "tiny", "--tokenizer", "",
                                                                    "--out", str(tmp_path / "o")]))
    res = runner.invoke(app, ["eval-ppl", "--model", str(tmp_path), "--dataset", "x", "--batch", str(2**63)])
    assert res.exit_code == 2 and "--batch" in res.output


# ---------------------------------------------------------------------------------------------------------
# a damaged dataset file is one line (datasets' own error log kept off stderr)


@pytest.mark.slow
def test_a_damaged_parquet_or_json_dataset_is_one_line(local, tmp_path):
    import subprocess
    import sys

    for name, data in (("test.parquet", b"PAR1garbagegarbage"), ("test.jsonl", b'{oops\n{"text": 1\n')):
        ds = tmp_path / name.split(".")[1]
        ds.mkdir()
        (ds / name).write_bytes(data)
        r = subprocess.run([sys.executable, "-c", "from scalecl.cli import main; main()", "eval-ppl", "--model",
                            str(local / "llama"), "--dataset", str(ds), "--split", "test", "--seq-len", "16",
                            "--cache", str(tmp_path / "cache")],
                           capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr
        assert "dataset" in lines[0]


def test_safetensors_header_helper_matches_the_real_format(tmp_path):
    """Sanity of this file's fixtures: a header written by safetensors reads back through the suite's reader."""
    from scalecl.common.readers import model_weights_header

    save_file({"w": torch.zeros(2, 3)}, str(tmp_path / "m.safetensors"))
    h = model_weights_header(tmp_path / "m.safetensors")
    assert h["w"]["dtype"] == "F32" and h["w"]["shape"] == [2, 3]
    raw = (tmp_path / "m.safetensors").read_bytes()
    assert struct.unpack("<Q", raw[:8])[0] > 0


@pytest.mark.parametrize("variant", ["preserve", "adapt", "route"])
def test_ffn_up_zero_is_a_valid_attention_only_widening(variant):
    """--ffn-up 0 is accepted on purpose (the probe flagged it): the model keeps the base's logits exactly."""
    from scalecl.methods import get_method
    from scalecl.models.build import model_from_config, tiny_config

    base = model_from_config(tiny_config("llama"), seed=0).eval()
    x = torch.randint(0, base.config.vocab_size, (2, 12))
    with torch.no_grad():
        ref = base(x).logits
        wide = get_method(f"scale-{variant}", hidden_up=32, ffn_up=0).apply(base).eval()
        assert torch.equal(wide(x).logits, ref)


def test_a_users_file_where_a_run_will_write_is_refused_before_any_data_or_stage(tmp_path, local):
    """Its final checkpoint folder or its run folder: found before the data and stages are built (the probe
    saw a cache filled, then the refusal at the end of training)."""
    from scalecl.compute.processes import Dist
    from scalecl.experiments import load_preset
    from scalecl.experiments.base import Paths
    from scalecl.experiments.cpt import CptExperiment
    from scalecl.methods import get_method
    from tests.conftest import local_sets, run

    sets = local_sets(local, "llama", "train.steps=2", "eval.every=2")
    name = CptExperiment(load_preset("cpt", "tiny", sets), "tiny", Paths(tmp_path / "out")).run_of(
        get_method("fft"), Dist()).name
    final = tmp_path / "runs" / "cpt" / name / "final"
    final.mkdir(parents=True)
    (final / "notes.txt").write_text("mine")
    with pytest.raises(ScaleclError, match="holds no scalecl checkpoint"):
        run(tmp_path, sets, ["fft"])
    assert not (tmp_path / "cache").exists() and (final / "notes.txt").read_text() == "mine"
    (final / "notes.txt").unlink()
    final.rmdir()
    (tmp_path / "out" / name).mkdir(parents=True)
    (tmp_path / "out" / name / "metrics.jsonl").write_text("my own log\n")
    with pytest.raises(ScaleclError, match="not written by scalecl run"):
        run(tmp_path, sets, ["fft"])
    assert not (tmp_path / "cache").exists()


def test_plot_removes_its_own_stale_outputs_and_nothing_else(tmp_path):
    """Re-plotting other results into the same folder: plot's own earlier outputs that these results no longer
    give are removed (named in a `removed` line); a user's file, and one of plot's files the user changed, stay."""
    from tests.common.test_damaged_files import fake_bio_run
    from tests.report.fake_runs import write_result

    res_a, res_b, out = tmp_path / "a", tmp_path / "b", tmp_path / "figs"
    fake_bio_run(res_a, "cpu-fft-abc")
    fake_bio_run(res_b, "cpu-fft-abc")
    run_b = res_b / "bio" / "cpu-fft-abc"
    write_result(run_b, {**json.loads((run_b / "result.json").read_text()), "preset": "tiny"})
    assert runner.invoke(app, ["plot", "--results", str(res_a), "--out", str(out)]).exit_code == 0
    assert (out / "fig8_bio_cpu.png").exists()
    (out / "notes.txt").write_text("mine")
    res = runner.invoke(app, ["plot", "--results", str(res_b), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "fig8_bio_tiny.png").exists() and not (out / "fig8_bio_cpu.png").exists()
    assert "removed" in res.output and "fig8_bio_cpu.png" in res.output
    assert (out / "notes.txt").read_text() == "mine"
    (out / "fig8_bio_tiny.inputs.txt").write_text("edited by hand")
    assert runner.invoke(app, ["plot", "--results", str(res_a), "--out", str(out)]).exit_code == 0
    assert (out / "fig8_bio_tiny.inputs.txt").read_text() == "edited by hand"  # changed: not plot's any more
