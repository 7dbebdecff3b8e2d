"""Code in a model or tokenizer folder never runs, even when stdin answers transformers' question with yes.

A planted module (`evil.py`, named by an `auto_map` in config.json or tokenizer_config.json) writes a marker
file when imported. Every command that loads a model or a tokenizer is given such a folder with "y" on stdin
(`yes y |` in a script); the marker is never written, and the command either works, through transformers' own
class or scalecl's, or ends in one error line.
"""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scalecl.cli import app

runner = CliRunner()
YES = "y\n" * 50
REFUSED = "scalecl never runs code from a model or tokenizer folder"
ROOT = Path(__file__).resolve().parents[2]

EVIL = """import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
class EvilConfig(LlamaConfig):
    model_type = "evilnet"
class EvilModel(LlamaForCausalLM):
    config_class = EvilConfig
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def _edit(path: Path, **changes) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> dict[str, Path]:
    """A plain tiny Llama with its tokenizer (`good`), a corpus, and planted folders: `cfg` (config.json maps
    AutoConfig and the model to evil.py, under a model_type transformers does not ship), `tok` (a sound model
    whose tokenizer_config.json maps AutoTokenizer to evil.py), `known` (config.json maps the model to evil.py
    under model_type llama, which transformers ships), `knowntok` (tokenizer_config.json maps to evil.py, its
    class one transformers ships), `scale` (a SCALE model saved with save_pretrained whose modeling_scale.py is
    replaced by evil.py's code)."""
    from scalecl.data.bilingual import (
        BilingualConfig,
        english_biographies,
        split_documents,
        train_bpe_tokenizer,
    )
    from scalecl.methods import get_method
    from scalecl.models.build import model_from_config, tiny_config

    root = tmp_path_factory.mktemp("remote_code")
    marker = root / "MARKER"
    cfg = BilingualConfig(people=30, heldout=6, texts=2)
    texts = english_biographies(cfg)
    (root / "corpus").mkdir()
    for split, docs in split_documents(texts, cfg, "en").items():
        (root / "corpus" / f"{split}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tok = train_bpe_tokenizer(texts, vocab_size=300)
    config = tiny_config("llama", vocab_size=len(tok), max_position_embeddings=64, eos_token_id=tok.eos_token_id)
    model = model_from_config(config)
    evil = EVIL.format(marker=str(marker))
    for name in ("good", "cfg", "tok", "known", "knowntok"):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        if name != "good":
            (root / name / "evil.py").write_text(evil)
    _edit(root / "cfg" / "config.json", model_type="evilnet",
          auto_map={"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"})
    _edit(root / "known" / "config.json", auto_map={"AutoModelForCausalLM": "evil.EvilModel"})
    for name, cls in (("tok", "EvilTokenizer"), ("knowntok", "PreTrainedTokenizerFast")):
        _edit(root / name / "tokenizer_config.json", tokenizer_class=cls,
              auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
    wide = get_method("scale-route", hidden_up=32, ffn_up=16).apply(model_from_config(config))
    wide.save_pretrained(root / "scale")
    tok.save_pretrained(root / "scale")
    (root / "scale" / "modeling_scale.py").write_text(evil)
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "mc.jsonl").write_text("".join(json.dumps({"q": d[:40], "choices": ["a", "b"], "label": i % 2}) + "\n"
                                            for i, d in enumerate(texts[:4])))
    (tasks / "local_mc.yaml").write_text(
        f"task: local_mc\ndataset_path: json\ndataset_name: null\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tasks / 'mc.jsonl'}\n  cache_dir: {root / 'hf_cache'}\noutput_type: multiple_choice\n"
        'test_split: test\ndoc_to_text: "{{q}}"\ndoc_to_target: "{{label}}"\ndoc_to_choice: "{{choices}}"\n'
        "metric_list:\n  - metric: acc\n")
    return {"root": root, "marker": marker, "tasks": tasks / "local_mc.yaml", **{
        n: root / n for n in ("good", "cfg", "tok", "known", "knowntok", "scale", "corpus")}}


@pytest.fixture(autouse=True)
def _no_marker(fx):
    """Each test starts without the marker: what it finds is what its own command did."""
    fx["marker"].unlink(missing_ok=True)


def _cpt(fx, tmp: Path, model: str, *more: str) -> list[str]:
    c = str(fx["corpus"])
    return ["train-cpt", "--preset", "tiny", "--method", "fft", "--model", model, "--data", c, "--old-eval", c,
            "--new-eval", c, "--set", "train.seq_len=32", "--set", "train.steps=2", "--set", "eval.every=2",
            "--out", str(tmp / "runs"), "--cache", str(tmp / "cache"), "--checkpoints", str(tmp / "ck"), *more]


def _ppl(fx, tmp: Path, model: str, *more: str) -> list[str]:
    return ["eval-ppl", "--model", model, "--dataset", str(fx["corpus"]), "--split", "test", "--take", "3",
            "--seq-len", "32", "--cache", str(tmp / "cache"), *more]


def _harness(fx, tmp: Path, model: str, *more: str) -> list[str]:
    return ["eval-harness", "--model", model, "--tasks", str(fx["tasks"]), "--limit", "2", "--batch-size", "2",
            "--device", "cpu", "--bootstrap-iters", "0", "--out", str(tmp / "harness"), "--cache", str(tmp / "cache"),
            *more]


# (name, arguments from (fixture, tmp)): every command that loads a model or a tokenizer a user names
REFUSALS = {
    "train-cpt --model": lambda fx, t: _cpt(fx, t, str(fx["cfg"])),
    "train-cpt model's tokenizer": lambda fx, t: _cpt(fx, t, str(fx["tok"])),
    "train-cpt --set tokenizer=": lambda fx, t: _cpt(fx, t, str(fx["good"]), "--set", f"tokenizer={fx['tok']}"),
    "train-bio --tokenizer": lambda fx, t: ["train-bio", "--preset", "tiny", "--method", "fft", "--tokenizer",
                                            str(fx["tok"]), "--out", str(t / "runs"), "--cache", str(t / "cache"),
                                            "--checkpoints", str(t / "ck")],
    "eval-ppl --model": lambda fx, t: _ppl(fx, t, str(fx["cfg"])),
    "eval-ppl model's tokenizer": lambda fx, t: _ppl(fx, t, str(fx["tok"])),
    "eval-ppl --tokenizer": lambda fx, t: _ppl(fx, t, str(fx["good"]), "--tokenizer", str(fx["tok"])),
    "eval-harness --model": lambda fx, t: _harness(fx, t, str(fx["cfg"])),
    "eval-harness --tokenizer": lambda fx, t: _harness(fx, t, str(fx["good"]), "--tokenizer", str(fx["tok"])),
    "upscale --model": lambda fx, t: ["upscale", "--model", str(fx["cfg"]), "--out", str(t / "up"), "--hidden-up",
                                      "32", "--ffn-up", "16"],
    "prepare --model": lambda fx, t: ["prepare", "--method", "fft", "--model", str(fx["cfg"]), "--out", str(t / "p")],
    "merge --model": lambda fx, t: ["merge", "--model", str(fx["cfg"]), "--out", str(t / "m")],
    "merge model's tokenizer": lambda fx, t: ["merge", "--model", str(fx["tok"]), "--out", str(t / "m")],
}


def _one_error_line(res) -> str:
    out = res.output
    assert "Traceback" not in out, out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error:"), out
    assert sum(ln.startswith("error:") for ln in lines) == 1, out
    return lines[-1]


@pytest.mark.parametrize("case", list(REFUSALS))
def test_planted_code_never_runs_when_stdin_says_yes(case, fx, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, REFUSALS[case](fx, tmp_path), input=YES)
    assert not fx["marker"].exists(), f"{case}: the planted module ran"
    assert res.exit_code == 2, (case, res.output, res.exception)
    line = _one_error_line(res)
    assert REFUSED in line and "evil.Evil" in line, (case, line)


WORKS = {  # the planted code is named, but transformers' own class (or scalecl's) loads the folder
    "eval-ppl: a model of a family transformers ships": lambda fx, t: _ppl(fx, t, str(fx["known"])),
    "eval-ppl: a tokenizer of a class transformers ships": lambda fx, t: _ppl(fx, t, str(fx["knowntok"])),
    "prepare: a model of a family transformers ships": lambda fx, t: [
        "prepare", "--method", "fft", "--model", str(fx["known"]), "--out", str(t / "p")],
    "merge: a tokenizer of a class transformers ships": lambda fx, t: [
        "merge", "--model", str(fx["knowntok"]), "--out", str(t / "m")],
    "eval-ppl: SCALE saved with save_pretrained, its model code replaced": lambda fx, t: _ppl(fx, t, str(fx["scale"])),
}


@pytest.mark.parametrize("case", list(WORKS))
def test_folders_naming_code_load_with_the_classes_scalecl_trusts(case, fx, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, WORKS[case](fx, tmp_path), input=YES)
    assert not fx["marker"].exists(), f"{case}: the planted module ran"
    assert res.exit_code == 0, (case, res.output, res.exception)


def test_load_model_never_runs_a_folders_code(fx, monkeypatch):
    import torch

    import scalecl
    from scalecl.common.errors import ScaleclError

    monkeypatch.setattr(sys, "stdin", io.StringIO(YES))
    with pytest.raises(ScaleclError, match=REFUSED):
        scalecl.load_model(fx["cfg"])
    for name in ("known", "scale"):  # transformers' Llama class; scalecl's own SCALE class, not the folder's file
        model = scalecl.load_model(fx[name])
        assert type(model).__module__.startswith(("transformers.", "scalecl.")), type(model)
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()
    assert not fx["marker"].exists()


def test_yes_piped_into_the_command_runs_nothing(fx, tmp_path):
    """As a script would do it: `yes y | scalecl train-cpt --model <folder naming code>` in a real process."""
    args = " ".join(f"'{a}'" for a in _cpt(fx, tmp_path, str(fx["cfg"])))
    res = subprocess.run(f"yes y | {sys.executable} -m scalecl.cli {args}", shell=True, capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)
    assert not fx["marker"].exists()
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and lines and REFUSED in lines[-1], res.stderr


def _loads_without_remote_code(call: ast.Call) -> bool:
    for kw in call.keywords:
        if kw.arg is None and "NO_REMOTE_CODE" in ast.unparse(kw.value):
            return True
        if kw.arg == "trust_remote_code" and isinstance(kw.value, ast.Constant) and kw.value.value is False:
            return True
    return False


def test_every_transformers_load_in_the_package_refuses_remote_code():
    """Every `from_pretrained` call in scalecl (outside scalecl.modeling, the code shipped inside checkpoints,
    whose class methods pass their caller's arguments on) passes trust_remote_code=False, so no later call can
    forget it; `pipeline` is not used at all."""
    missing, seen = [], 0
    for path in sorted((ROOT / "scalecl").rglob("*.py")):
        if "modeling" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "from_pretrained":
                seen += 1
                if not _loads_without_remote_code(node):
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "pipeline":
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno} (pipeline)")
    assert seen >= 8 and not missing, missing


def test_the_fixture_would_run_the_plant(fx, tmp_path):
    """The planted folders are real: transformers, asked without trust_remote_code and answered yes, runs them
    (in another process, whose module cache is a temporary folder)."""
    code = ("from transformers import AutoConfig, AutoTokenizer; import sys; "
            "AutoTokenizer.from_pretrained(sys.argv[1]) if 'tok' in sys.argv[1] else AutoConfig.from_pretrained(sys.argv[1])")
    try:
        for name in ("cfg", "tok"):
            fx["marker"].unlink(missing_ok=True)
            subprocess.run([sys.executable, "-c", code, str(fx[name])], input=YES, text=True, capture_output=True,
                           timeout=120, env={**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")})
            assert fx["marker"].exists(), name
    finally:
        fx["marker"].unlink(missing_ok=True)
