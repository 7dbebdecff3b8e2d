"""Bad input to any subcommand: exit code 2, one `error:` line, no traceback, nothing created or changed on disk.

Each case runs from an empty working folder (where every command's default output folders would go) next to
a folder of fixtures (models, corpora, result folders); both are listed (path, size, mtime) before and after.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.data.bilingual import BilingualConfig, english_biographies, split_documents, train_bpe_tokenizer
from scalecl.methods import get_method
from scalecl.models.build import model_from_config, tiny_config
from scalecl.training.checkpoint import save_model

runner = CliRunner()
NO_CUDA = not torch.cuda.is_available()


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fixtures")
    cfg = BilingualConfig(people=40, heldout=8, texts=2)
    texts = english_biographies(cfg)
    for split, docs in split_documents(texts, cfg, "en").items():
        (root / "corpus").mkdir(exist_ok=True)
        (root / "corpus" / f"{split}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tok = train_bpe_tokenizer(texts, vocab_size=300)
    config = tiny_config("llama", vocab_size=len(tok), max_position_embeddings=64, eos_token_id=tok.eos_token_id)
    save_model(model_from_config(config), root / "plain", base_model="random tiny llama", tokenizer=tok)
    wide = get_method("scale-route", hidden_up=32, ffn_up=16).apply(model_from_config(tiny_config("llama")))
    save_model(wide, root / "scale_no_tokenizer", get_method("scale-route", hidden_up=32, ffn_up=16))
    shutil.copytree(root / "plain", root / "truncated")
    w = root / "truncated" / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    (root / "badjson").mkdir()
    (root / "badjson" / "config.json").write_text("{not json")
    (root / "afile").write_text("a file, not a folder\n")
    (root / "gpt2.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2}))
    (root / "notjson.json").write_text("model_type: llama\n")
    for name, text in (("garbage", "garbage{"), ("notdict", "[1, 2]")):
        (root / f"results_{name}" / "bio" / "run").mkdir(parents=True)
        (root / f"results_{name}" / "bio" / "run" / "result.json").write_text(text)
    (root / "results_empty").mkdir()
    (root / "broken.yaml").write_text("task: [unclosed\n")  # invalid YAML
    (root / "list.yaml").write_text("- task: x\n")  # YAML, but not a task's mapping
    return root


def listing(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under the roots with its size and modification time."""
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                st = p.stat()
                out[str(p)] = (st.st_size if p.is_file() else 0, st.st_mtime_ns)
    return out


def cases(fx: Path) -> list[tuple[list[str], str]]:
    """(arguments, a phrase of the expected error line)."""
    tiny_bio = ["train-bio", "--preset", "tiny", "--method", "fft"]
    tiny_cpt = ["train-cpt", "--preset", "tiny", "--method", "fft"]
    local_cpt = [*tiny_cpt, "--set", f"base={fx / 'plain'}", "--set", f"data.path={fx / 'corpus'}",
                 "--set", f"old_eval.path={fx / 'corpus'}", "--set", "old_eval.split=test",
                 "--set", f"new_eval.path={fx / 'corpus'}", "--set", "new_eval.split=test", "--set", "train.seq_len=32"]
    ppl = ["eval-ppl", "--model", str(fx / "plain"), "--dataset", str(fx / "corpus"), "--split", "test"]
    up = ["upscale", "--random-config", "llama", "--out", "up", "--hidden-up", "32"]
    return [
        # upscale
        ([*up, "--hidden-up", "20"], "not a multiple of head_dim"),
        ([*up, "--hidden-up", "16"], "GQA group"),
        ([*up, "--hidden-up", "abc"], "Invalid value for '--hidden-up'"),
        ([*up, "--l-fp", "7", "--variant", "adapt"], "l_fp must lie in 0..3"),
        ([*up, "--tau", "2"], "tau must lie in [-1, 1]"),
        ([*up, "--variant", "widen"], "unknown variant"),
        ([*up, "--init", "svd,ones"], "init must be"),
        ([*up, "--collab", "ffn"], "collab must be"),
        (["upscale", "--model", str(fx / "nope"), "--out", "up"], "does not exist"),
        (["upscale", "--model", str(fx / "badjson"), "--out", "up"], "cannot load a config"),
        (["upscale", "--model", str(fx / "afile"), "--out", "up"], "is a file"),
        (["upscale", "--random-config", str(fx / "gpt2.json"), "--out", "up"], "unsupported architecture 'gpt2'"),
        (["upscale", "--random-config", str(fx / "missing.json"), "--out", "up"], "does not exist"),
        (["upscale", "--random-config", str(fx / "notjson.json"), "--out", "up"], "not a JSON"),
        (["upscale", "--out", "up"], "exactly one of --model"),
        (["upscale", "--random-config", "llama", "--hidden-up", "32", "--out", str(fx / "afile" / "up")], "file"),
        (["upscale", "--random-config", "llama", "--hidden-up", "32"], "Missing option '--out'"),
        ([*up, "--router", "dot"], "unknown router 'dot'"),
        ([*up, "--embed-init", "rnd"], "embed_init=rnd needs untied embeddings"),
        ([*up, "--embed-init", "ones"], "embed_init"),
        # merge
        (["merge", "--model", str(fx / "nope"), "--out", "m"], "does not exist"),
        (["merge", "--model", str(fx / "scale_no_tokenizer"), "--out", "m"], "cannot be merged"),
        (["merge", "--model", str(fx / "plain"), "--out", str(fx / "corpus")], "holds no scalecl checkpoint"),
        (["merge", "--model", str(fx / "plain"), "--out", "."], "current folder"),
        # prepare
        (["prepare", "--method", "sgd", "--random-config", "llama", "--out", "p"], "unknown method 'sgd'"),
        (["prepare", "--method", "lora", "--random-config", "llama", "--out", "p", "--set", "rank=abc"], "rank"),
        (["prepare", "--method", "lora", "--random-config", "llama", "--out", "p", "--set", "rnk=3"], "no option"),
        (["prepare", "--method", "lora", "--random-config", "llama", "--out", "p", "--set", "rank"], "key=value"),
        (["prepare", "--method", "lora", "--random-config", "llama", "--out", "p", "--set", "rank=0"], "rank"),
        (["prepare", "--method", "freeze", "--random-config", "llama", "--out", "p", "--set", "k=99"], "k"),
        (["prepare", "--method", "llama-pro", "--random-config", "llama", "--out", "p", "--set", "n=2"], "divisor"),
        (["prepare", "--method", "fft", "--model", str(fx / "truncated"), "--out", "p"], "truncated"),
        # train-bio
        (["train-bio", "--preset", "tiny", "--method", ""], "--method is empty"),
        (["train-cpt", "--preset", "tiny", "--method", " , "], "has an empty item"),
        ([*tiny_bio, "--seeds", "a,b"], "--seeds takes integers"),
        ([*tiny_bio, "--run-seeds", "0..99999"], "--run-seeds 0..99999: 100,000 seeds, more than the 1,000 seeds"),
        # ranges: their length checked before they are expanded (0..10**11 is no list of 10**11 seeds)
        ([*tiny_bio, "--seeds", "0..100000000000"], "--seeds 0..100000000000: 100,000,000,001 seeds, more than"),
        ([*tiny_bio, "--run-seeds", "0..100000000000"], "--run-seeds 0..100000000000: 100,000,000,001 seeds"),
        ([*tiny_bio, "--seeds", "2..1"], "--seeds 2..1 is an empty range"),
        # an empty item of a list is an error, never dropped
        ([*tiny_bio, "--seeds", "0,,1"], "--seeds 0,,1 has an empty item"),
        ([*tiny_cpt, "--run-seeds", "0,"], "--run-seeds 0, has an empty item"),
        (["train-cpt", "--preset", "tiny", "--method", "fft,,lora"], "--method fft,,lora has an empty item"),
        # a repeated method is an error, never collapsed to one run
        (["train-cpt", "--preset", "tiny", "--method", "fft,lora,fft"], "names fft more than once"),
        (["train-bio", "--preset", "tiny", "--method", "scale-route, scale-route"], "names scale-route more than once"),
        ([*up, "--collab", "attn,,mlp"], "has an empty item"),
        ([*up, "--collab", "attn,attn"], "collab must be attn, mlp or attn,mlp"),
        (["study", "collab", "--preset", "tiny", "--values", "attn;;mlp"], "have an empty value"),
        (["study", "l_fp", "--preset", "tiny", "--values", "0;"], "have an empty value"),
        # layers: the estimate builds the model on the meta device, so their number is bounded first
        ([*tiny_cpt, "--set", "model.layers=1000000"], "model.layers must be <= 1024"),
        ([*tiny_bio, "--set", "model.layers=1025"], "model.layers must be <= 1024"),
        # sizes the machine can hold: CPU threads at most max(256, 4 x its cores)
        ([*tiny_bio, "--set", "compute.threads=100000"], "compute.threads must be <= "),
        ([*tiny_bio, "--set", f"compute.threads={2**20}"], "compute.threads must be <= "),
        ([*tiny_bio, "--seeds", "4294967296"], "--seeds must be an integer in 0..4294967295"),
        ([*tiny_bio, "--set", "seed=1", "--seeds", "0,1"], "given twice"),
        ([*tiny_cpt, "--set", "run_seed=1", "--run-seeds", "0,1"], "given twice"),
        (["train-bio", "--preset", "huge"], "unknown preset 'huge'"),
        ([*tiny_bio, "--set", "stage1.stepz=3"], "unknown config key stage1.stepz"),
        ([*tiny_bio, "--set", "stage1.steps"], "--set expects key=value"),
        ([*tiny_bio, "--set", "stage1=3"], "is a section"),
        (["train-bio", "--preset", "tiny", "--method", "sgd"], "unknown method 'sgd'"),
        ([*tiny_bio, "--tokenizer", "/no/such/tokenizer"], "--tokenizer local"),
        (["train-bio", "--preset", "tiny", "--method", "llama-pro", "--set", "methods.llama-pro.n=3"], "divisor"),
        ([*tiny_bio, "--set", "stage3.steps=true"], "stage3.steps expects an integer"),
        ([*tiny_bio, "--set", "stage1.steps=-5"], "stage1.steps must be >= 1"),
        ([*tiny_bio, "--set", "eval.dense_every=0"], "eval.dense_every must be >= 1"),
        ([*tiny_bio, "--set", "model.heads=0"], "model.heads must be >= 1"),
        ([*tiny_bio, "--set", "model.heads=3"], "not divisible"),
        ([*tiny_bio, "--set", "lr_scale.fft=abc"], "lr_scale.fft expects a number"),
        ([*tiny_bio, "--set", "lr_scale.foo=1"], "unknown method lr_scale.foo"),
        ([*tiny_bio, "--set", "methods.scale.tau=high"], "methods.scale.tau expects a number"),
        ([*tiny_bio, "--set", "methods.scale.tau=2"], "tau must lie in [-1, 1]"),
        ([*tiny_bio, "--set", "methods.lora.rank=0.5"], "methods.lora.rank expects an integer"),
        ([*tiny_bio, "--set", "methods.foo.x=1"], "unknown method methods.foo"),
        ([*tiny_bio, "--set", "stage1.lr=nan"], "stage1.lr expects a number"),
        ([*tiny_bio, "--set", "stage2.schedule=cos"], "must be one of constant, cosine, linear"),
        ([*tiny_bio, "--set", "data=huge"], "config key data must be one of"),
        ([*tiny_bio, "--set", "data_overrides.n_people=5"], "exceeds n_people"),
        ([*tiny_bio, "--set", "data_overrides.n_peple=5"], "unknown config key data_overrides.n_peple"),
        ([*tiny_bio, "--set", "checkpoint.keep=0"], "checkpoint.keep must be >= 1"),
        ([*tiny_bio, "--set", "model.vocab=10"], "smaller than the tokenizer"),
        ([*tiny_bio, "--stop-after", "0"], "--stop-after must be a step in 1..1,000,000,000"),
        ([*tiny_bio, "--out", str(fx / "afile")], "is a file"),
        ([*tiny_bio, "--checkpoints", str(fx / "afile" / "c")], "is a file"),
        ([*tiny_bio, "--device", "tpu"], "device"),
        *([([*tiny_bio, "--device", "cuda"], "CUDA is not available")] if NO_CUDA else []),
        # train-cpt
        ([*tiny_cpt, "--set", f"data.path={fx / 'missing'}"], "does not exist"),
        ([*tiny_cpt, "--set", "train.seq_len=65"], "exceeds the model's 64 positions"),
        ([*tiny_cpt, "--set", "train.batch=3", "--set", "train.micro_batch=2"], "multiple of micro_batch"),
        ([*tiny_cpt, "--set", "lr.fft=abc"], "lr.fft expects a number"),
        ([*tiny_cpt, "--set", "lr.foo=1"], "unknown method lr.foo"),
        ([*tiny_cpt, "--set", "lr.fft=-1"], "lr.fft must be > 0"),
        ([*tiny_cpt, "--set", "train.warmup_ratio=1.5"], "train.warmup_ratio must be < 1"),
        ([*tiny_cpt, "--set", "eval.every=-1"], "eval.every must be >= 0"),
        ([*tiny_cpt, "--set", "train.schedule=cosine_with_restarts"], "must be one of"),
        ([*tiny_cpt, "--set", "builtin.heldout=999"], "heldout"),
        ([*tiny_cpt, "--set", "model.kv_heads=3"], "kv_heads"),
        ([*tiny_cpt, "--set", f"base={fx / 'nope'}"], "does not exist"),
        ([*tiny_cpt, "--set", "base="], "base is empty"),
        (["train-cpt", "--preset", "tiny", "--method", "scale-route", "--set", "methods.scale.hidden_up=20"],
         "not a multiple of head_dim"),
        ([*tiny_cpt, "--stop-after", "-1"], "--stop-after must be a step in 1..1,000,000,000"),
        ([*local_cpt, "--set", "old_eval.text_column=body"], "no text column"),
        ([*tiny_cpt, "--out", str(fx / "afile")], "is a file"),
        *([([*tiny_cpt, "--device", "cuda"], "CUDA is not available")] if NO_CUDA else []),
        # eval-ppl
        (["eval-ppl", "--model", str(fx / "nope"), "--dataset", "builtin:en"], "does not exist"),
        (["eval-ppl", "--model", str(fx / "scale_no_tokenizer"), "--dataset", "builtin:en"], "no tokenizer files"),
        (["eval-ppl", "--model", str(fx / "badjson"), "--dataset", "builtin:en"], "config"),
        ([*ppl[:3], "--dataset", str(fx / "missing")], "does not exist"),
        ([*ppl, "--seq-len", "100"], "exceeds the model's 64 positions"),
        ([*ppl, "--text-column", "body"], "no text column"),
        ([*ppl, "--batch", "0"], "--batch"),
        ([*ppl, "--skip", "-1"], "--skip"),
        ([*ppl[:3], "--dataset", "builtin:fr"], "builtin corpus has"),
        ([*ppl, "--out", str(fx / "afile" / "ppl.json")], "file"),
        *([([*ppl, "--device", "cuda"], "CUDA is not available")] if NO_CUDA else []),
        # eval-harness
        (["eval-harness", "--model", str(fx / "nope"), "--tasks", "kobest"], "does not exist"),
        (["eval-harness", "--model", str(fx / "plain"), "--tasks", "kobest", "--dtype", "float8"], "dtype"),
        (["eval-harness", "--model", str(fx / "plain"), "--tasks", "kobest", "--batch-size", "zero"], "batch"),
        (["eval-harness", "--model", str(fx / "plain"), "--tasks", "./no_such_folder"], "does not exist"),
        (["eval-harness", "--model", str(fx / "plain"), "--tasks", str(fx / "broken.yaml")], "broken.yaml cannot be read"),
        (["eval-harness", "--model", str(fx / "plain"), "--tasks", str(fx / "list.yaml")], "list.yaml cannot be read"),
        # huge numbers: bounded before any work
        (["eval-harness", "--model", str(fx / "plain"), "--tasks", "kobest", "--limit", "9223372036854775808"],
         "--limit must be at most"),
        (["eval-harness", "--model", str(fx / "plain"), "--tasks", "kobest", "--num-fewshot", "1000000"],
         "--num-fewshot must lie in 0..100"),
        (["eval-harness", "--model", str(fx / "plain"), "--tasks", "kobest", "--max-length", str(2**70)],
         "--max-length must lie in"),
        ([*ppl, "--take", "9223372036854775808"], "--take"),
        ([*ppl, "--skip", str(10**13)], "--skip"),
        ([*tiny_bio, "--set", "stage3.steps=9223372036854775807"], "stage3.steps must be <= 1000000000"),
        ([*tiny_bio, "--set", "stage3.steps=1000000000"], "would evaluate about"),
        ([*tiny_bio, "--set", "eval.every=99999999999"], "eval.every must be <= 1000000000"),
        ([*tiny_bio, "--set", "checkpoint.every=9223372036854775807"], "checkpoint.every must be <= 1000000000"),
        ([*tiny_cpt, "--set", "train.steps=1000000000", "--set", "eval.every=1"], "would evaluate about"),
        ([*tiny_cpt, "--set", "data.take=9223372036854775807"], "data.take must be <= 1000000000000"),
        (["study", "l_fp", "--preset", "tiny", "--values", "0..100000000000"], "more than the 1,000 runs"),
        (["study", "vocab", "--preset", "tiny", "--values", "0..1180591620717411303424"], "more than the 1,000 runs"),
        # study
        (["study", "depth", "--preset", "tiny"], "unknown study 'depth'"),
        (["study", "l_fp", "--preset", "tiny", "--values", "0..99"], "l_fp must lie in 0..2"),
        (["study", "l_fp", "--preset", "tiny", "--values", "a..b"], "integers or a range"),
        (["study", "tau", "--preset", "tiny", "--values", "0.5;2"], "tau must lie in [-1, 1]"),
        (["study", "init", "--preset", "tiny", "--values", "svd,ones"], "init must be"),
        (["study", "tau", "--preset", "tiny", "--set", "stage1.steps=-1"], "stage1.steps must be >= 1"),
        (["study", "tau", "--preset", "tiny", "--values", ";"], "have an empty value"),
        (["study", "tau", "--preset", "tiny", "--values", ""], "--values is empty"),  # not the default set
        ([*tiny_bio, "--set", "tokenizer="], "config key tokenizer is empty"),  # its default is not ""
        # plot
        (["plot", "--results", str(fx / "nope")], "does not exist"),
        (["plot", "--results", str(fx / "results_garbage"), "--out", "figs"], "unreadable result"),
        (["plot", "--results", str(fx / "results_notdict"), "--out", "figs"], "unreadable result"),
        (["plot", "--results", str(fx / "results_empty"), "--out", "figs"], "no finished runs"),
        (["plot", "--results", str(fx / "results_empty"), "--out", str(fx / "afile")], "is a file"),
        (["plot"], "no results folder"),
        (["plot", "--formats", "png,gif"], "--formats 'png,gif': give one or more of png, pdf, svg"),
        (["plot", "--formats", " , "], "give one or more of png, pdf, svg"),
        (["plot", "--dpi", "5"], "'--dpi': Input should be greater than or equal to 10"),
    ]


N_CASES = len(cases(Path("/fixtures")))  # the table's length (it depends on no fixture)


def test_enough_cases():
    assert N_CASES >= 60


@pytest.mark.parametrize("i", range(N_CASES))
def test_bad_input(i, fx, tmp_path, monkeypatch):
    args, phrase = cases(fx)[i]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    before = listing(fx, cwd)
    res = runner.invoke(app, args)
    out = res.output
    assert res.exit_code == 2, (args, res.exit_code, out, res.exception)
    assert "Traceback" not in out, out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), (args, out)
    assert phrase in lines[0], (args, phrase, lines[0])
    assert listing(fx, cwd) == before, args


def _valued_params() -> list[tuple[str, str]]:
    """(command, option or argument) for every parameter of every command that takes a value."""
    import typer

    group = typer.main.get_command(app)
    return [(name, p.opts[0] if p.param_type_name == "option" else "")
            for name, cmd in group.commands.items() for p in cmd.params if not getattr(p, "is_flag", False)]


@pytest.mark.parametrize("command, option", _valued_params())
def test_an_empty_value_is_refused_for_every_option(command, option, tmp_path, monkeypatch):
    """An empty value is never "not given" (`study tau --values ''` trained the default sweep; `--out ''` is the
    current folder): every option and argument of every command refuses it with one line."""
    monkeypatch.chdir(tmp_path)
    args = [command, option, ""] if option else [command, ""]
    res = runner.invoke(app, args)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, (args, res.output, res.exception)
    assert lines[0].startswith("error:") and f"{option or 'name'} is empty" in lines[0], (args, lines[0])
    assert list(tmp_path.iterdir()) == []


def test_upscale_of_a_model_larger_than_memory_is_refused_before_any_weight(tmp_path):
    """A random config of ~250B parameters: counted on the meta device and refused in one line, never allocated."""
    import json

    from typer.testing import CliRunner

    from scalecl.cli import app

    big = tmp_path / "big.json"
    big.write_text(json.dumps(dict(model_type="llama", hidden_size=4096, intermediate_size=16384, num_hidden_layers=1024,
                                   num_attention_heads=32, num_key_value_heads=8, vocab_size=32000)))
    res = CliRunner().invoke(app, ["upscale", "--random-config", str(big), "--hidden-up", "512", "--ffn-up", "128",
                                   "--out", str(tmp_path / "up")])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "GiB of float32 weights" in lines[0], res.output
    assert not (tmp_path / "up").exists()
