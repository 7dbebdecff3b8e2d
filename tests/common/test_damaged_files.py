"""Hostile files (issue 19, items 1, 2 and 6): every file the suite reads is checked by one reader
(scalecl.common.readers), every path it writes follows one ownership rule (scalecl.common.files), and OS errors are user
errors. Each case is exit code 1 or 2 with exactly one `error:` line, and the user's files stay as they were.
"""

from __future__ import annotations

import errno
import json
import os
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

import scalecl.common.files as files
from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.common.readers import read_json, read_jsonl, safetensors_header
from tests.report.fake_runs import write_result

runner = CliRunner()
PREPARE = ["prepare", "--method", "fft", "--random-config", "llama"]
UPSCALE = ["upscale", "--random-config", "llama", "--hidden-up", "32", "--ffn-up", "16", "--variant", "adapt"]


def tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


# what eval-ppl prints on stderr while it works: what it chose, its memory estimate, its progress
PPL_LINES = ("eval-ppl: ", "estimate: ", "tokenizer: ")


def one_error(res, code: int = 2, progress: str | tuple[str, ...] | None = None) -> str:
    """The single `error:` line of a failed command (stdout and stderr together), checked. `progress`: the prefix
    of lines the command prints while it works (eval-ppl's, on stderr: PPL_LINES), left out before checking."""
    def kept(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if ln.strip() and not (progress and ln.startswith(progress))]

    lines = kept(res.output)
    assert res.exit_code == code and len(lines) == 1 and lines[0].startswith("error:"), (res.exit_code, res.output)
    assert "Traceback" not in res.output and kept(res.stderr) == lines, res.stderr
    return lines[0]


def one_stderr_error(res, code: int = 2) -> str:
    """The single `error:` line on stderr of a command whose progress lines may precede it on stdout."""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == code and len(lines) == 1 and lines[0].startswith("error:"), (res.exit_code, res.output)
    assert "Traceback" not in res.output
    return lines[0]


# ---------------------------------------------------------------------------------------------------------
# the reader


def test_reader_names_the_file_for_every_failure(tmp_path):
    bad = {"missing.json": None, "garbage.json": "{oops", "list.json": "[1, 2]", "empty.json": ""}
    for name, text in bad.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(ScaleclError, match=name):
            read_json(tmp_path / name, "record")
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(ScaleclError, match="is a folder"):
        read_json(tmp_path / "folder.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ScaleclError, match="not UTF-8"):
        read_json(tmp_path / "bin.json")
    (tmp_path / "log.jsonl").write_text('{"step": 1}\n\n{"step": 2\n')
    with pytest.raises(ScaleclError, match=r"log\.jsonl \(line 3\)"):
        read_jsonl(tmp_path / "log.jsonl")
    assert read_json(tmp_path / "list.json", expect=list) == [1, 2]


def _safetensors(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_reader_checks_safetensors_against_the_file(tmp_path):
    ok = _safetensors(tmp_path / "ok.safetensors", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
                      b"\x00" * 8)
    assert set(safetensors_header(ok)) == {"w"}
    (tmp_path / "empty.safetensors").write_bytes(b"")
    cases = {
        "empty.safetensors": "empty",
        _safetensors(tmp_path / "short.safetensors", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
                     b"\x00" * 3).name: "truncated",
        _safetensors(tmp_path / "dtype.safetensors", {"w": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}},
                     b"\x00").name: "unknown dtype 'Q7'",
        _safetensors(tmp_path / "shape.safetensors", {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
                     b"\x00" * 8).name: "do not match its shape",
    }
    (tmp_path / "header.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    cases["header.safetensors"] = "bad header length"
    for name, phrase in cases.items():
        with pytest.raises(ScaleclError, match=phrase) as e:
            safetensors_header(tmp_path / name)
        assert name in str(e.value)


W = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("header, data, phrase", [
    ({"w": W | {"shape": [True, 2]}}, 8, "bad shape or offsets"),  # a boolean is no dimension, even true = 1
    ({"w": W | {"shape": [2.0]}}, 8, "bad shape or offsets"),
    ({"w": W | {"data_offsets": [False, 8]}}, 8, "bad shape or offsets"),
    ({"w": W | {"dtype": ["F32"]}}, 8, "unknown dtype"),
    ({"w": W, "__metadata__": "oops"}, 8, "__metadata__"),
    ({"w": W, "__metadata__": {"format": 1}}, 8, "__metadata__"),
    ({"w": W}, 12, "bytes after its last tensor"),
    ({"w": W | {"data_offsets": [4, 12]}}, 12, "gap"),
    ({"w": W, "v": W | {"shape": [1], "data_offsets": [4, 8]}}, 8, "overlaps"),
    ({"w": W | {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, 2, "do not match its shape"),
    ({"w": W | {"shape": [2**62, 4]}}, 8, "do not match its shape"),
])
def test_reader_refuses_what_safetensors_refuses(tmp_path, header, data, phrase):
    import safetensors.torch as sft

    f = _safetensors(tmp_path / "w.safetensors", header, b"\x00" * data)
    with pytest.raises(Exception):  # noqa: B017 - the library's own refusal, whatever its type
        sft.load_file(str(f))
    with pytest.raises(ScaleclError, match=phrase) as e:
        safetensors_header(f)
    assert str(f) in str(e.value)


# ---------------------------------------------------------------------------------------------------------
# damaged checkpoints and configs: one line each, wherever they are read


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


# scalecl.json fields given a value of the wrong type or an unknown value (read_meta checks every field's type)
META_DAMAGE = {"meta_dtype": {"dtype": "float7"}, "meta_method_int": {"method": 5}, "meta_options_list": {"options": [1]},
               "meta_layout_int": {"layout": 3}, "meta_format_text": {"format_version": "2"}}
# safetensors headers the library refuses (SafetensorError) that its size checks alone let through
HEADER_DAMAGE = {"weights_shape_bool": lambda h, k: h | {k: h[k] | {"shape": [True, *h[k]["shape"]]}},
                 "weights_metadata_str": lambda h, k: h | {"__metadata__": "oops"}}


def _damage_header(w: Path, change) -> None:
    """Rewrite a safetensors file's header by `change(header, first tensor's name)`, the data unchanged."""
    raw = w.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    first = next(k for k in header if k != "__metadata__")
    new = json.dumps(change(header, first)).encode()
    w.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


@pytest.mark.parametrize("damage, phrase", [
    ("meta_list", "JSON array"), ("meta_garbage", "not a JSON file"), ("meta_dtype", "unknown dtype 'float7'"),
    ("weights_empty", "empty"), ("weights_truncated", "truncated"), ("meta_heads", "num_attention_heads"),
    ("meta_method_int", "'method' is a JSON number, expected string or null"),
    ("meta_options_list", "'options' is a JSON array, expected object"),
    ("meta_layout_int", "'layout' is a JSON number"), ("meta_format_text", "'format_version' is a JSON string"),
    ("weights_shape_bool", "bad shape or offsets"), ("weights_metadata_str", "__metadata__"),
])
def test_damaged_checkpoint_is_one_line_in_merge_and_eval_ppl(ckpt, tmp_path, damage, phrase):
    d = _copy(ckpt, tmp_path / "damaged")
    meta = json.loads((d / "scalecl.json").read_text())
    meta.pop("record_digest")  # a record that keeps no digest of itself (an earlier scalecl's): the checks behind it
    if damage.startswith("weights"):  # the readers behind verification: a checkpoint that records no fingerprints
        meta = {k: v for k, v in meta.items() if k not in ("written", "digests")}
        (d / "scalecl.json").write_text(json.dumps(meta))
    w = d / "model.safetensors"
    if damage == "meta_list":
        (d / "scalecl.json").write_text("[]")
    elif damage == "meta_garbage":
        (d / "scalecl.json").write_text("{\"method\": ")
    elif damage in META_DAMAGE:
        (d / "scalecl.json").write_text(json.dumps(meta | META_DAMAGE[damage]))
    elif damage in HEADER_DAMAGE:
        _damage_header(w, HEADER_DAMAGE[damage])
    elif damage == "meta_heads":
        (d / "scalecl.json").write_text(json.dumps(meta | {"base_config": meta["base_config"] | {"num_attention_heads": 0}}))
    elif damage == "weights_empty":
        w.write_bytes(b"")
    else:
        w.write_bytes(w.read_bytes()[: w.stat().st_size - 100])
    before = tree(d)
    assert phrase in one_error(runner.invoke(app, ["merge", "--model", str(d), "--out", str(tmp_path / "m")]))
    assert phrase in one_error(runner.invoke(app, ["eval-ppl", "--model", str(d), "--dataset", "builtin:en",
                                                   "--cache", str(tmp_path / "cache")]))
    assert tree(d) == before and not (tmp_path / "m").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("change, phrase", [
    ({"hidden_size": "64"}, "hidden_size must be a positive integer"),
    ({"num_hidden_layers": -2}, "num_hidden_layers must be a positive integer"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer"),
])
def test_bad_config_json_sizes_are_one_line(ckpt, tmp_path, change, phrase):
    d = _copy(ckpt, tmp_path / "plain")
    (d / "scalecl.json").unlink()  # a plain transformers folder
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg | change))
    line = one_error(runner.invoke(app, [*PREPARE[:3], "--model", str(d), "--out", str(tmp_path / "p")]))
    assert phrase in line and str(d) in line
    assert not (tmp_path / "p").exists()


def test_pickled_weights_are_refused_before_torch_load(ckpt, tmp_path, monkeypatch):
    import torch

    d = _copy(ckpt, tmp_path / "bin")
    (d / "scalecl.json").unlink()
    (d / "model.safetensors").rename(d / "pytorch_model.bin")

    def never(*a, **k):
        raise AssertionError("torch.load reached")

    monkeypatch.setattr(torch, "load", never)
    for args in (["merge", "--model", str(d), "--out", str(tmp_path / "m")],
                 [*PREPARE[:3], "--model", str(d), "--out", str(tmp_path / "p")],
                 ["eval-ppl", "--model", str(d), "--dataset", "builtin:en", "--cache", str(tmp_path / "c")]):
        assert "pytorch_model.bin" in one_error(runner.invoke(app, args))


def test_damaged_training_state_is_one_line(tmp_path):
    import torch

    from scalecl.training.state import JSON_NAME, TENSORS_NAME, load_state, save_state

    save_state(tmp_path, {"step": 3, "w": torch.ones(4)})
    assert load_state(tmp_path)["step"] == 3
    t = tmp_path / TENSORS_NAME
    t.write_bytes(t.read_bytes()[:-5])
    with pytest.raises(ScaleclError, match="truncated"):
        load_state(tmp_path)
    (tmp_path / JSON_NAME).write_text("[]")
    with pytest.raises(ScaleclError, match=JSON_NAME):
        load_state(tmp_path)


# a training state's fields given the wrong types: each is one error naming trainer_state.json
STATE_DAMAGE = {
    "step_text": ({"step": "3"}, "'step' must be an integer"), "step_negative": ({"step": -1}, "'step' must be"),
    "step_bool": ({"step": True}, "'step' must be"), "losses_dict": ({"losses": {"a": 1}}, "'losses' must be"),
    "losses_text": ({"losses": ["x"]}, "'losses' must be"), "records_dict": ({"records": {}}, "'records' must be"),
    "records_ints": ({"records": [1]}, "'records' must be"), "timing_list": ({"timing": []}, "'timing' must be"),
    "rng_null": ({"rng": None}, "'rng' must be"), "no_optimizer": ({"optimizer": ...}, "no 'optimizer'"),
}


def _damage_state(folder: Path, change: dict) -> None:
    from scalecl.training.state import JSON_NAME

    doc = json.loads((folder / JSON_NAME).read_text())
    doc["state"] = {k: v for k, v in (doc["state"] | change).items() if v is not ...}
    (folder / JSON_NAME).write_text(json.dumps(doc))


@pytest.mark.parametrize("damage", sorted(STATE_DAMAGE))
def test_wrongly_typed_training_state_is_one_line(tmp_path, damage):
    import torch

    from scalecl.training.state import JSON_NAME, load_state, save_state

    state = {"step": 3, "losses": [1.0, 0.5, float("nan")], "records": [{"step": 0}], "optimizer": {"state": {}},
             "scheduler": {}, "rng": {"torch": torch.ones(2)}, "data": None, "timing": {"train_s": 1, "eval_s": 0.5},
             "run": {"name": "x"}}
    save_state(tmp_path, state)
    assert load_state(tmp_path)["step"] == 3
    change, phrase = STATE_DAMAGE[damage]
    _damage_state(tmp_path, change)
    with pytest.raises(ScaleclError, match=phrase) as e:
        load_state(tmp_path)
    assert str(tmp_path / JSON_NAME) in str(e.value)


@pytest.mark.parametrize("damage", ["step_text", "losses_dict", "records_dict"])
def test_resume_from_a_wrongly_typed_training_state_is_one_line(stopped, tmp_path, monkeypatch, damage):
    import shutil

    root, args = stopped
    shutil.copytree(root, tmp_path / "run", symlinks=True)
    monkeypatch.chdir(tmp_path / "run")
    (step,) = Path("runs/cpt").glob("*/step-*")
    _damage_state(step, STATE_DAMAGE[damage][0])
    before = tree(Path("runs"))
    assert "trainer_state.json" in one_stderr_error(runner.invoke(app, [*args, "--resume"]))
    assert tree(Path("runs")) == before and not list(Path("out").glob("*/result.json"))


@pytest.mark.parametrize("garbage", ["garbage{", "{}", "[1]", ""])
def test_damaged_tokenizer_cache_is_one_line(tmp_path, monkeypatch, garbage):
    from dataclasses import asdict

    from scalecl.common.schema import config_hash
    from scalecl.experiments import load_preset
    from scalecl.experiments.bio_data import TEXT_FORMAT, bio_config

    monkeypatch.chdir(tmp_path)
    entry = Path("cache") / "bio" / f"tokenizer-{config_hash(asdict(bio_config(load_preset('bio', 'tiny', []))), TEXT_FORMAT)}"
    entry.mkdir(parents=True)
    (entry / "tokenizer.json").write_text(garbage)
    before = tree(tmp_path)
    res = runner.invoke(app, ["train-bio", "--preset", "tiny", "--method", "fft", "--cache", "cache", "--out", "out",
                              "--checkpoints", "ck"])
    line = one_stderr_error(res)  # after one line saying the entry records no fingerprints (made by hand here)
    assert str(entry) in line and "delete" in line and "records no fingerprints" in res.stdout
    assert tree(tmp_path) == before


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_perplexity_is_an_error_and_no_record(ppl_model, tmp_path, value):
    import safetensors.torch as sft

    model, corpus = ppl_model
    d = _copy(model, tmp_path / "broken")
    weights = sft.load_file(str(d / "model.safetensors"))
    for t in weights.values():
        t.fill_(value)
    sft.save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
    meta = json.loads((d / "scalecl.json").read_text())
    del meta["written"], meta["record_digest"]  # the weights changed: not a checkpoint the suite could replace, still one it reads
    (d / "scalecl.json").write_text(json.dumps(meta))
    out = tmp_path / "ppl.json"
    line = one_error(runner.invoke(app, _ppl(d, corpus, out)), code=1, progress=PPL_LINES)
    assert "not finite" in line and not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["broken"]


# ---------------------------------------------------------------------------------------------------------
# ownership: the suite replaces only files its own manifest proves it wrote


def test_overwrite_never_deletes_a_file_scalecl_json_lists(tmp_path):
    out = tmp_path / "ck"
    assert runner.invoke(app, [*UPSCALE, "--out", str(out)]).exit_code == 0
    (out / "notes.txt").write_text("the user's notes")
    meta = json.loads((out / "scalecl.json").read_text())
    meta["files"] = sorted(meta["files"] + ["notes.txt"])  # a hand-edited list of names proves nothing
    meta["written"]["notes.txt"] = "16:0123456789abcdef0123456789abcdef"
    (out / "scalecl.json").write_text(json.dumps(meta))
    before = tree(out)
    assert "notes.txt" in one_error(runner.invoke(app, [*UPSCALE, "--out", str(out), "--overwrite"]))
    assert tree(out) == before
    # a file the suite wrote but the user changed since is not the suite's either
    (out / "notes.txt").unlink()
    meta["files"].remove("notes.txt")
    del meta["written"]["notes.txt"]
    (out / "scalecl.json").write_text(json.dumps(meta))
    (out / "config.json").write_text((out / "config.json").read_text() + " ")
    before = tree(out)
    assert "config.json" in one_error(runner.invoke(app, [*UPSCALE, "--out", str(out), "--overwrite"]))
    assert tree(out) == before


def test_overwrite_of_an_older_checkpoint_without_fingerprints_is_refused(tmp_path):
    """A format-1 scalecl.json records no fingerprints, so no file beside it is provably the suite's: the user's
    own weights and config under the usual names stay, as does a folder holding only the suite's own names."""
    out = tmp_path / "old"
    assert runner.invoke(app, [*PREPARE, "--out", str(out)]).exit_code == 0
    meta = json.loads((out / "scalecl.json").read_text())
    for key in ("files", "written"):
        del meta[key]
    (out / "scalecl.json").write_text(json.dumps(meta | {"format_version": 1}))
    (out / "model.safetensors").write_bytes(b"THE USER'S OWN WEIGHTS" * 10)
    (out / "config.json").write_text('{"note": "the user\'s own config"}')
    (out / "vocab.txt").write_text("the user's vocabulary\n")
    before = tree(out)
    line = one_error(runner.invoke(app, [*PREPARE, "--out", str(out), "--overwrite"]))
    assert "older scalecl" in line and "fingerprints" in line
    assert tree(out) == before
    (out / "vocab.txt").unlink()
    before = tree(out)
    assert "older scalecl" in one_error(runner.invoke(app, [*PREPARE, "--out", str(out), "--overwrite"]))
    assert tree(out) == before


def fake_bio_run(root: Path, name: str = "cpu-fft-abc", method: str = "fft") -> Path:
    d = root / "bio" / name
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "task0/acc": 0.5, "task1/acc": 0.5}) + "\n"
                                             for s in (0, 5)))
    write_result(d, {
        "experiment": "bio", "preset": "cpu", "method": method, "trainable_params": 10, "lr": 1e-4,
        "provenance": {"date": "2026-11-21"}, "data": {"n_bio": 100, "n_task1": 20},
        "config": {"model": {"hidden": 8, "layers": 1}, "stage3": {"steps": 5, "batch": 2, "lr": 1e-4},
                   "eval": {"slice_people": 10}},
        "priors": {"task0_heldout": {"pooled": 0.05}},
        "summary": {"task0_start": 0.5, "task0_min": 0.5, "task0_end": 0.5, "task1_end": 0.5},
        "final": {"task0_heldout": {"acc": 0.5}, "task1": {"acc": 0.5}}})
    return d


def test_plot_never_overwrites_a_users_file_and_replaces_its_own(tmp_path):
    res_dir, out = tmp_path / "results", tmp_path / "figs"
    fake_bio_run(res_dir)
    out.mkdir()
    (out / "table_bio.csv").write_text("my own table\n")
    before = tree(out)
    line = one_error(runner.invoke(app, ["plot", "--results", str(res_dir), "--out", str(out)]))
    assert "table_bio.csv" in line and "not written by scalecl plot" in line
    assert tree(out) == before  # all or nothing: not even the figure drawn before the table was refused
    (out / "table_bio.csv").unlink()
    for _ in range(2):  # its own files: written, then replaced
        res = runner.invoke(app, ["plot", "--results", str(res_dir), "--out", str(out)])
        assert res.exit_code == 0, res.output
    assert (out / "table_bio.csv").read_text().startswith("preset,method")
    (out / "fig8_bio_cpu.png").unlink()
    os.symlink(tmp_path / "elsewhere.png", out / "fig8_bio_cpu.png")  # a link is never written through
    assert "fig8_bio_cpu.png" in one_error(runner.invoke(app, ["plot", "--results", str(res_dir), "--out", str(out)]))
    assert not (tmp_path / "elsewhere.png").exists()


def test_plot_skips_runs_with_missing_or_malformed_files(tmp_path):
    res_dir = tmp_path / "results"
    fake_bio_run(res_dir)
    (fake_bio_run(res_dir, "cpu-lora-abc", "lora") / "metrics.jsonl").unlink()
    (fake_bio_run(res_dir, "cpu-freeze-abc", "freeze") / "result.json").write_text("[1]")
    (fake_bio_run(res_dir, "cpu-llama-pro-abc", "llama-pro") / "metrics.jsonl").write_text('{"step": 0\n')
    h = res_dir / "harness" / "x"
    h.mkdir(parents=True)
    (h / "run.json").write_text("{broken")
    res = runner.invoke(app, ["plot", "--results", str(res_dir), "--out", str(tmp_path / "figs")])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    skipped = [ln for ln in res.stderr.splitlines() if ln.startswith("skipped:")]
    assert len(skipped) == 4, res.stderr
    for name in ("cpu-lora-abc/metrics.jsonl", "cpu-freeze-abc/result.json", "cpu-llama-pro-abc/metrics.jsonl",
                 "x/run.json"):
        assert sum(name in ln for ln in skipped) == 1, (name, skipped)


@pytest.fixture(scope="module")
def ppl_model(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny checkpoint with a tokenizer, and a small jsonl corpus for eval-ppl."""
    from scalecl.data.bilingual import BilingualConfig, english_biographies, train_bpe_tokenizer
    from scalecl.models.build import model_from_config, tiny_config
    from scalecl.training.checkpoint import save_model

    root = tmp_path_factory.mktemp("ppl")
    texts = english_biographies(BilingualConfig(people=20, heldout=4, texts=1))
    (root / "corpus").mkdir()
    (root / "corpus" / "test.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:20]))
    tok = train_bpe_tokenizer(texts, vocab_size=200)
    config = tiny_config("llama", vocab_size=len(tok), max_position_embeddings=64, eos_token_id=tok.eos_token_id)
    save_model(model_from_config(config), root / "model", tokenizer=tok)
    return root / "model", root / "corpus"


def _ppl(model: Path, corpus: Path, out: Path) -> list[str]:
    return ["eval-ppl", "--model", str(model), "--dataset", str(corpus), "--split", "test", "--seq-len", "32",
            "--out", str(out)]


def test_eval_ppl_out_replaces_only_its_own_records(ppl_model, tmp_path):
    model, corpus = ppl_model
    users = {"list.json": "[1, 2, 3]\n", "lookalike.json": json.dumps({"ppl": 1.0, "model": "m", "dataset": "d"})}
    for name, text in users.items():
        (tmp_path / name).write_text(text)
        assert "not a record written by eval-ppl" in one_error(runner.invoke(app, _ppl(model, corpus, tmp_path / name)))
        assert (tmp_path / name).read_text() == text
    link = tmp_path / "dangling.json"
    os.symlink(tmp_path / "nowhere" / "x.json", link)
    assert "symbolic link" in one_error(runner.invoke(app, _ppl(model, corpus, link)))
    assert link.is_symlink() and not link.exists()
    mine = tmp_path / "mine.json"
    for _ in range(2):  # written, then replaced: a record eval-ppl wrote carries its mark
        res = runner.invoke(app, _ppl(model, corpus, mine))
        assert res.exit_code == 0, res.output
        assert json.loads(mine.read_text())["written_by"] == "scalecl eval-ppl"


def test_eval_ppl_replaces_no_record_edited_by_hand_nor_writes_through_a_hard_link(ppl_model, tmp_path):
    """The `"written_by"` mark is a name, not proof: a record eval-ppl wrote and the user edited since, or a
    user's file carrying the mark, is refused; an unchanged record is replaced by rename, so a hard link to it
    keeps the old content (the inode is never written through)."""
    model, corpus = ppl_model
    mine = tmp_path / "mine.json"
    assert runner.invoke(app, _ppl(model, corpus, mine)).exit_code == 0
    edited = json.loads(mine.read_text()) | {"note": "my own remark"}  # still marked "written_by": eval-ppl
    mine.write_text(json.dumps(edited))
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({"written_by": "scalecl eval-ppl", "ppl": 1.0}))
    for f in (mine, forged):
        before = tree(tmp_path)
        assert str(f) in one_error(runner.invoke(app, _ppl(model, corpus, f)))
        assert tree(tmp_path) == before
    ours = tmp_path / "ours.json"
    assert runner.invoke(app, _ppl(model, corpus, ours)).exit_code == 0
    link = tmp_path / "link.json"
    os.link(ours, link)
    old = link.read_bytes()
    res = runner.invoke(app, _ppl(model, corpus, ours))
    assert res.exit_code == 0, res.output
    assert link.read_bytes() == old and os.stat(link).st_ino != os.stat(ours).st_ino


def _fake_lm_eval(monkeypatch) -> None:
    """eval-harness without lm-eval's evaluation (ownership is about the files it writes)."""
    from scalecl.evaluation import harness

    monkeypatch.setattr(harness, "check_task_data", lambda *a, **k: None)  # the tasks' data: lm-eval's
    monkeypatch.setattr(harness, "evaluate_model", lambda *a, **k: {"results": {}, "versions": {}, "scalecl": {"units": {}, "subset": None}})
    monkeypatch.setattr(harness, "score_rows", lambda *a, **k: [])


def test_eval_harness_replaces_only_its_own_results(ppl_model, tmp_path, monkeypatch):
    model, _ = ppl_model
    _fake_lm_eval(monkeypatch)
    out = tmp_path / "H"
    args = ["eval-harness", "--model", str(model), "--tasks", "arc_challenge", "--device", "cpu", "--out", str(out)]
    for _ in range(2):  # written, then its own files replaced
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
    (sub,) = [d for d in out.iterdir() if d.is_dir()]
    assert {p.name for p in sub.iterdir()} == {"lm_eval_results.json", "scores.csv", "scores.md", "run.json", "items.jsonl"}
    for name, text in (("scores.csv", "my,own\n1,2\n"), ("run.json", '{"mine": true}\n')):
        (sub / name).write_text(text)  # the user's file (or one edited by hand) where eval-harness writes
        before = tree(out)
        line = one_error(runner.invoke(app, args))
        assert f"{sub.name}/{name}" in line and "not written by scalecl eval-harness" in line
        assert tree(out) == before
        (sub / name).unlink()


def test_temporaries_are_removed_only_with_the_suites_mark(tmp_path, ckpt):
    """`.tmp-*` / `.<name>.tmp-<dead pid>-*` folders are removed only when they hold the mark the suite writes
    into every temporary folder it makes; a user's folder so named stays."""
    import subprocess
    import sys

    from scalecl.training.checkpoint import load_model, save_model

    user = tmp_path / ".tmp-mine"
    user.mkdir()
    (user / "data.txt").write_text("the user's")
    marked = files.make_temporary(tmp_path, files.TMP_PREFIX)
    files.remove_temporaries(tmp_path)
    assert (user / "data.txt").read_text() == "the user's" and not marked.exists()
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    sibling = tmp_path / f".ck.tmp-{int(proc.stdout)}-abc"  # a dead pid: what a killed save would leave
    sibling.mkdir()
    (sibling / "model.safetensors").write_bytes(b"the user's bytes")
    before = tree(sibling)
    save_model(load_model(ckpt), tmp_path / "ck")
    assert tree(sibling) == before


CPT_RUN = ["train-cpt", "--preset", "tiny", "--method", "fft", "--set", "pretrain.steps=4", "--set", "train.steps=4",
           "--set", "eval.every=2", "--set", "checkpoint.every=2", "--out", "out", "--cache", "cache",
           "--checkpoints", "ck"]


def _stderr_error(res, code: int = 2) -> str:
    """The single `error:` line of a failed training command (progress lines may precede it on stdout)."""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == code and len(lines) == 1 and lines[0].startswith("error:"), (res.exit_code, res.output)
    assert "Traceback" not in res.output
    return lines[0]


def test_a_run_touches_no_user_file_in_its_folders(tmp_path, monkeypatch):
    """Files a user put in an unfinished run's folder, or beside its checkpoints, are never replaced or removed:
    a file the run must write (metrics.jsonl) or a step folder it must save (step-0000004) is refused with one
    line before training; notes, a folder named like a temporary and a step folder the run does not write stay
    through --resume and --force."""
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, [*CPT_RUN, "--stop-after", "2"]).exit_code == 0
    (run,) = Path("out").iterdir()
    ck = Path("ck/cpt") / run.name
    (run / "notes.txt").write_text("my notes\n")
    (ck / ".tmp-mine").mkdir()
    (ck / ".tmp-mine" / "keep.txt").write_text("mine\n")
    (ck / "step-0000001").mkdir()
    (ck / "step-0000001" / "trainer_state.json").write_text('{"state": {"step": 1}}')  # not the suite's
    users = {p: p.read_bytes() for p in (run / "notes.txt", ck / ".tmp-mine" / "keep.txt",
                                         ck / "step-0000001" / "trainer_state.json")}
    for planted in (run / "metrics.jsonl", ck / "step-0000004" / "x.txt"):
        planted.parent.mkdir(exist_ok=True)
        planted.write_text("the user's\n")
        before = tree(tmp_path)
        where = planted.parent if planted.name == "x.txt" else planted
        assert str(where) in _stderr_error(runner.invoke(app, [*CPT_RUN, "--resume"]))
        assert tree(tmp_path) == before
        planted.unlink()
        if planted.parent.name.startswith("step-"):
            planted.parent.rmdir()
    for extra in (["--resume"], ["--force"]):
        res = runner.invoke(app, [*CPT_RUN, *extra])
        assert res.exit_code == 0, res.output
        assert (run / "result.json").exists()
        assert {p: p.read_bytes() for p in users} == users
    (run / "result.json").write_text((run / "result.json").read_text() + " ")  # the user edited the result
    before = tree(tmp_path)
    assert "result.json" in _stderr_error(runner.invoke(app, [*CPT_RUN, "--force"]))
    assert tree(tmp_path) == before


# ---------------------------------------------------------------------------------------------------------
# OS errors: a read-only or full disk is one line, exit code 1, nothing recorded as finished


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_full_or_read_only_disk_is_one_line(ppl_model, tmp_path, monkeypatch, code):
    model, corpus = ppl_model
    real = files.write_atomic

    def failing(path, text):
        raise OSError(code, os.strerror(code), str(path))

    res_dir = tmp_path / "results"
    fake_bio_run(res_dir)  # written by the run writer before the disk fails
    monkeypatch.setattr(files, "write_atomic", failing)
    out = tmp_path / "ppl.json"
    line = one_error(runner.invoke(app, _ppl(model, corpus, out)), code=1, progress=PPL_LINES)
    assert str(out) in line and errno.errorcode[code] in line and not out.exists()
    line = one_error(runner.invoke(app, ["plot", "--results", str(res_dir), "--out", str(tmp_path / "f")]), code=1)
    assert str(tmp_path / "f") in line
    monkeypatch.setattr(files, "write_atomic", real)


def test_full_disk_during_a_run_records_nothing_as_finished(tmp_path, monkeypatch, local):
    from tests.conftest import local_sets

    real = os.replace

    def full(src, dst, *a, **k):
        if Path(dst).name == "result.json":
            raise OSError(errno.ENOSPC, "No space left on device")  # as a write reports it: no file name
        return real(src, dst, *a, **k)

    monkeypatch.setattr(files.os, "replace", full)
    args = ["train-cpt", "--preset", "tiny", "--method", "fft", "--out", str(tmp_path / "out"), "--cache",
            str(tmp_path / "cache"), "--checkpoints", str(tmp_path / "ck")]
    sets = local_sets(local, "llama", "train.steps=2", "eval.every=2")
    res = runner.invoke(app, args + [x for s in sets for x in ("--set", s)])
    monkeypatch.setattr(files.os, "replace", real)
    errors = [ln for ln in res.output.splitlines() if "error" in ln.lower()]  # progress lines come before it
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert len(errors) == 1 and errors[0].startswith("error:") and res.output.strip().endswith(errors[0]), errors
    assert "result.json" in errors[0] and "ENOSPC" in errors[0]
    assert not list((tmp_path / "out").rglob("result.json"))


def test_read_only_out_fails_before_any_work(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    real = files.tempfile.mkdtemp

    def mkdtemp(*a, dir=None, **kw):  # noqa: A002  creating an entry in `ro` fails, as in a read-only folder
        if dir is not None and Path(dir) == ro:
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*a, dir=dir, **kw)

    monkeypatch.setattr(files.tempfile, "mkdtemp", mkdtemp)
    res_dir = tmp_path / "results"
    fake_bio_run(res_dir)
    assert "not writable" in one_error(runner.invoke(app, ["plot", "--results", str(res_dir), "--out", str(ro)]))
    assert list(ro.iterdir()) == []
    link = tmp_path / "gone"
    os.symlink(tmp_path / "nothing", link)
    assert "symbolic link to nothing" in one_error(runner.invoke(app, ["plot", "--results", str(res_dir),
                                                                       "--out", str(link)]))


# ---------------------------------------------------------------------------------------------------------
# generated damage through the commands (issue 19, item 7): whatever a checkpoint's files are made to hold,
# merge, eval-ppl and --resume either work or end with one `error:` line, write nothing and leave the damaged
# folder as it was

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

DAMAGE = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
_json = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=6)


@st.composite
def damaged(draw, original: bytes, is_json: bool) -> bytes:
    """A damaged copy of a file: cut short, bytes overwritten, any bytes, or (JSON) a key given any value."""
    kind = draw(st.sampled_from(["cut", "flip", "bytes", "key"] if is_json else ["cut", "flip", "bytes"]))
    if kind == "cut":
        return original[: draw(st.integers(0, max(len(original) - 1, 0)))]
    if kind == "flip":
        at = draw(st.integers(0, min(len(original), 400) - 1))
        return original[:at] + draw(st.binary(min_size=1, max_size=8)) + original[at + 8:]
    if kind == "bytes":
        return draw(st.binary(max_size=80))
    doc = json.loads(original)
    key = draw(st.sampled_from(sorted(doc)) | st.text(max_size=5))
    return json.dumps(doc | {key: draw(_json)}).encode()


def _fails_cleanly_or_works(res, written: Path) -> None:
    assert res.exit_code in (0, 1, 2), (res.exit_code, res.output, res.exception)
    if res.exit_code:
        one_error(res, res.exit_code)
        assert not written.exists()


@DAMAGE
@given(data=st.data())
def test_generated_damage_through_merge_and_eval_ppl(ppl_model, tmp_path_factory, data):
    model, corpus = ppl_model
    name = data.draw(st.sampled_from(["scalecl.json", "config.json", "model.safetensors"]), label="file")
    tmp = tmp_path_factory.mktemp("damage")
    d = _copy(model, tmp / "model")
    (d / name).write_bytes(data.draw(damaged((model / name).read_bytes(), name.endswith(".json")), label="bytes"))
    before = tree(d)
    _fails_cleanly_or_works(runner.invoke(app, ["merge", "--model", str(d), "--out", str(tmp / "m")]), tmp / "m")
    _fails_cleanly_or_works(runner.invoke(app, _ppl(d, corpus, tmp / "ppl.json")), tmp / "ppl.json")
    assert tree(d) == before


@pytest.fixture(scope="module")
def stopped(local, tmp_path_factory) -> tuple[Path, list[str]]:
    """A tiny CPT run stopped after step 2 with a checkpoint, and the command that resumes it (relative paths)."""
    from tests.conftest import local_sets

    sets = [x for s in local_sets(local, "llama", "train.steps=4", "checkpoint.every=2") for x in ("--set", s)]
    root = tmp_path_factory.mktemp("stopped")
    args = ["train-cpt", "--preset", "tiny", "--method", "fft", "--out", "out", "--cache", "cache", "--checkpoints",
            "runs", *sets]
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert runner.invoke(app, [*args, "--stop-after", "2"]).exit_code == 0
    finally:
        os.chdir(cwd)
    return root, args


@pytest.mark.slow
@settings(DAMAGE, max_examples=10)
@given(data=st.data())
def test_generated_damage_to_a_checkpoint_then_resume(stopped, tmp_path_factory, monkeypatch, data):
    import shutil

    root, args = stopped
    tmp = tmp_path_factory.mktemp("resume") / "run"
    shutil.copytree(root, tmp, symlinks=True)
    monkeypatch.chdir(tmp)
    (step,) = Path("runs/cpt").glob("*/step-*")
    files = sorted(p for p in step.rglob("*") if p.is_file() and p.suffix in (".json", ".safetensors"))
    target = data.draw(st.sampled_from(files), label="file")
    target.write_bytes(data.draw(damaged(target.read_bytes(), target.suffix == ".json"), label="bytes"))
    res = runner.invoke(app, [*args, "--resume"])
    assert res.exit_code in (0, 1, 2), (res.exit_code, res.output, res.exception)
    results = list(Path("out").glob("*/result.json"))
    if res.exit_code:  # progress lines may precede it on stdout; stderr holds the error line alone
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
        assert "Traceback" not in res.output
        assert not results
    else:
        assert len(results) == 1
