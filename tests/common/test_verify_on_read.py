"""Verify on read: every checkpoint, training state and cache entry is checked against the fingerprints
recorded when it was written before it is used. A same-size change inside a file (the damage a bad disk or a
stray write does) is one `error:` line naming the file; a damaged cache entry is set aside and built again
with --force; nothing is recorded as finished from damaged inputs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import scalecl.common.files as files
from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from tests.common.test_damaged_files import one_error, one_stderr_error, tree

runner = CliRunner()
TINY = ["train-cpt", "--preset", "tiny", "--out", "out", "--cache", "cache", "--checkpoints", "ck"]


def zero_bytes(p: Path, at: int, n: int) -> None:
    """Overwrite n bytes at offset `at` with zeros (or ones where they were zero): same size, other content."""
    b = bytearray(p.read_bytes())
    at = min(at, len(b) - n)
    b[at:at + n] = bytes(1 if x == 0 else 0 for x in b[at:at + n])
    p.write_bytes(bytes(b))


def test_a_same_size_change_is_found_in_small_and_large_files(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_SAMPLED_ABOVE", 4096)  # "large": fingerprinted from a sample of 64 spans
    monkeypatch.setattr(files, "_SPAN", 16)
    (tmp_path / "small").write_bytes(os.urandom(3000))
    (tmp_path / "large").write_bytes(os.urandom(50_000))
    written, digests = files.fingerprints(tmp_path), files.large_digests(tmp_path)
    assert set(digests) == {"large"} and files.changed_file(tmp_path, written, digests) is None
    zero_bytes(tmp_path / "large", 20_010, 8)  # between two sampled spans: the fingerprint alone misses it
    assert files.fingerprints(tmp_path) == written
    assert "large differs from what was written" in files.changed_file(tmp_path, written, digests)
    (tmp_path / "large").write_bytes(b"")
    assert "large has 0 bytes, 50,000 were written" in files.changed_file(tmp_path, written, digests)
    (tmp_path / "large").unlink()
    assert "large is missing" in files.changed_file(tmp_path, written, digests)


def _checkpoint(tmp_path: Path) -> Path:
    from scalecl.models.build import model_from_config, tiny_config
    from scalecl.training.checkpoint import save_model

    return save_model(model_from_config(tiny_config("llama")), tmp_path / "ck")


def test_a_damaged_checkpoint_is_not_loaded(tmp_path):
    from scalecl.training.checkpoint import load_model

    ck = _checkpoint(tmp_path)
    load_model(ck)
    zero_bytes(ck / "model.safetensors", 5000, 256)
    before = tree(ck)
    with pytest.raises(ScaleclError, match=r"model\.safetensors differs from what was written") as e:
        load_model(ck)
    assert "is damaged" in str(e.value)
    line = one_error(runner.invoke(app, ["merge", "--model", str(ck), "--out", str(tmp_path / "m")]))
    assert "model.safetensors" in line and not (tmp_path / "m").exists() and tree(ck) == before


def test_an_older_checkpoint_without_fingerprints_still_loads(tmp_path):
    from scalecl.training.checkpoint import load_model

    ck = _checkpoint(tmp_path)
    meta = json.loads((ck / "scalecl.json").read_text())
    del meta["written"], meta["digests"], meta["record_digest"]
    (ck / "scalecl.json").write_text(json.dumps(meta))
    load_model(ck)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A tiny CPT run on the builtin base (cached corpus and base), stopped after step 2 with a checkpoint."""
    root = tmp_path_factory.mktemp("stopped")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        res = runner.invoke(app, [*TINY, "--method", "fft", "--set", "train.steps=4", "--set", "checkpoint.every=2",
                                  "--stop-after", "2"])
        assert res.exit_code == 0, res.output
    finally:
        os.chdir(cwd)
    return root


def _copy_of(stopped: Path, tmp_path: Path, monkeypatch) -> None:
    shutil.copytree(stopped, tmp_path / "run", symlinks=True)
    monkeypatch.chdir(tmp_path / "run")


@pytest.mark.parametrize("name", ["trainer_state.safetensors", "model/model.safetensors", "trainer_state.json"])
def test_resume_from_a_damaged_checkpoint_is_one_line_and_records_nothing(stopped, tmp_path, monkeypatch, name):
    _copy_of(stopped, tmp_path, monkeypatch)
    (step,) = Path("ck/cpt").glob("*/step-*")
    target = step / name
    if name.endswith(".json"):  # valid JSON, same size: a digit changed
        text = target.read_text()
        i = next(i for i, c in enumerate(text) if c.isdigit() and c != "9")
        target.write_text(text[:i] + str(int(text[i]) + 1) + text[i + 1:])
    else:
        zero_bytes(target, 4096, 64)
    before = tree(Path("ck"))
    line = one_stderr_error(runner.invoke(app, [*TINY, "--method", "fft", "--set", "train.steps=4",
                                                "--set", "checkpoint.every=2", "--resume"]))
    assert "is damaged" in line and name in line and "--force" in line
    assert tree(Path("ck")) == before and not list(Path("out").glob("*/result.json"))


def test_a_damaged_cached_base_is_refused_then_rebuilt_with_force(stopped, tmp_path, monkeypatch):
    _copy_of(stopped, tmp_path, monkeypatch)
    (base,) = Path("cache/cpt").glob("base-*")
    zero_bytes(base / "model.safetensors", 3000, 256)
    damaged = (base / "model.safetensors").read_bytes()
    line = one_stderr_error(runner.invoke(app, [*TINY, "--method", "lora"]))
    assert "is damaged" in line and str(base / "model.safetensors") in line and "--force" in line
    assert not list(Path("out").glob("*lora*/result.json"))
    res = runner.invoke(app, [*TINY, "--method", "lora", "--force"])
    assert res.exit_code == 0, res.output
    aside = base.with_name(base.name + ".damaged-1")
    assert (aside / "model.safetensors").read_bytes() == damaged  # set aside, not deleted
    assert "moved to" in res.output and list(Path("out").glob("*lora*/result.json"))
    from scalecl.training.checkpoint import find_damage

    assert find_damage(base) is None


def test_a_damaged_stand_in_corpus_is_refused_then_rebuilt_with_force(stopped, tmp_path, monkeypatch):
    _copy_of(stopped, tmp_path, monkeypatch)
    (corpus,) = Path("cache/cpt").glob("corpus-*")
    target = corpus / "en" / "test.jsonl"
    good = target.read_bytes()
    target.write_bytes(good[:100] + b"x" * 10 + good[110:])
    line = one_stderr_error(runner.invoke(app, [*TINY, "--method", "lora"]))
    assert "stand-in corpus" in line and "test.jsonl" in line
    assert runner.invoke(app, [*TINY, "--method", "lora", "--force"]).exit_code == 0
    assert target.read_bytes() == good  # generated again, as it was


def test_cached_encoding_is_verified_and_rebuilt_on_request(tmp_path):
    from scalecl.data.bilingual import BilingualConfig, english_biographies, train_bpe_tokenizer
    from scalecl.data.tokenizer import cached_encoding

    texts = english_biographies(BilingualConfig(people=20, heldout=4, texts=1))
    tok = train_bpe_tokenizer(texts, vocab_size=200)
    folder = tmp_path / "encoded-x"
    first = cached_encoding(tok, lambda: texts, folder)
    assert (folder / files.SEAL).is_file()
    ids = np.load(folder / "ids.npy")
    ids[3] = (ids[3] + 1) % 200  # a valid array of the same size, one token changed
    np.save(folder / "ids.npy", ids)
    with pytest.raises(ScaleclError, match=r"cached encoding .* is damaged: .*ids\.npy differs"):
        cached_encoding(tok, lambda: texts, folder)
    said = []
    again = cached_encoding(tok, lambda: texts, folder, rebuild=True, say=said.append)
    assert [a.tolist() for a in again] == [a.tolist() for a in first] and "moved to" in said[0]
    assert (tmp_path / "encoded-x.damaged-1" / "ids.npy").is_file()


def test_an_entry_of_an_older_scalecl_is_read_as_before_and_a_sealed_one_verified(tmp_path):
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "a.txt").write_text("kept")
    assert files.usable_entry(entry, "cached thing", rebuild=False)  # no seal: nothing to verify, nothing written
    assert sorted(p.name for p in entry.iterdir()) == ["a.txt"]
    with pytest.raises(ScaleclError, match="scalecl-cache.json is missing"):
        files.usable_entry(entry, "cached thing", rebuild=False, legacy_ok=False)
    files.seal(entry)
    assert files.usable_entry(entry, "cached thing", rebuild=False)
    (entry / "a.txt").write_text("edit")
    with pytest.raises(ScaleclError, match="a.txt differs"):
        files.usable_entry(entry, "cached thing", rebuild=False)


def test_an_entry_without_its_record_is_read_with_one_line_saying_so(tmp_path):
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "a.txt").write_text("x")
    said = []
    assert files.usable_entry(entry, "cached thing", rebuild=False, say=said.append)
    assert len(said) == 1 and "records no fingerprints" in said[0] and "without verification" in said[0]


@pytest.mark.parametrize("where", ["step", "base", "corpus"])
def test_a_record_with_an_entry_removed_does_not_turn_verification_off(stopped, tmp_path, monkeypatch, where):
    _copy_of(stopped, tmp_path, monkeypatch)
    if where == "step":
        (folder,) = Path("ck/cpt").glob("*/step-*")
        record, name, key = folder / "scalecl-checkpoint.json", "model/model.safetensors", "written"
    elif where == "base":
        (folder,) = Path("cache/cpt").glob("base-*")
        record, name, key = folder / "scalecl.json", "model.safetensors", "written"
    else:
        (folder,) = Path("cache/cpt").glob("corpus-*")
        record, name, key = folder / files.SEAL, "ko/train.jsonl", "written"
    doc = json.loads(record.read_text())
    del doc[key][name]
    doc.pop("record_digest", None)  # the cached base's scalecl.json: the layer under its own digest
    record.write_text(json.dumps(doc))
    zero_bytes(folder / name, 100, 8)
    args = [*TINY, "--method", "fft", "--set", "train.steps=4", "--set", "checkpoint.every=2", "--resume"] \
        if where == "step" else [*TINY, "--method", "lora"]
    line = one_stderr_error(runner.invoke(app, args))
    assert "is not in its record" in line and name in line
    assert not list(Path("out").glob("*lora*/result.json"))


def test_a_cached_base_whose_record_was_removed_is_refused_then_set_aside_with_force(stopped, tmp_path, monkeypatch):
    _copy_of(stopped, tmp_path, monkeypatch)
    (base,) = Path("cache/cpt").glob("base-*")
    (base / "scalecl.json").unlink()
    line = one_stderr_error(runner.invoke(app, [*TINY, "--method", "lora"]))
    assert "holds no scalecl.json" in line and "--force" in line
    assert runner.invoke(app, [*TINY, "--method", "lora", "--force"]).exit_code == 0
    assert (base.with_name(base.name + ".damaged-1") / "model.safetensors").is_file()
