"""Every folder `scalecl.load_model` loads is taken by every command with `--model`.

One model of each kind, every trained tensor moved off its start: SCALE-Route saved by the suite (full), the
transformers way (`save_pretrained`, `Trainer.save_model`) and as a delta; Freeze and LLaMA Pro as full and delta
checkpoints. `eval-ppl`, `eval-harness` and `train-cpt` give each folder the numbers of the suite's full
checkpoint of the same model (SCALE folders train on as their own method); `upscale` and `prepare` take the plain
ones (a delta of Freeze or LLaMA Pro) as a base and refuse the SCALE ones in one line, as they refuse the suite's
own SCALE checkpoint; `merge` writes a delta as its full checkpoint and refuses SCALE in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from scalecl import load_model, save_model
from scalecl.cli import app
from scalecl.methods import get_method
from scalecl.models.build import model_from_config, tiny_config

runner = CliRunner()
ROUTE = {"hidden_up": 32, "ffn_up": 16, "l_fp": 1}
SCALE_KINDS = ("route_hf", "route_trainer", "route_delta")  # each the model of route_full


def _moved(model):
    """Every trainable tensor moved off its start (so that a folder loaded wrongly cannot give the same numbers)."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> dict[str, Path]:
    from transformers import Trainer, TrainingArguments

    from scalecl.data.bilingual import (
        BilingualConfig,
        english_biographies,
        split_documents,
        train_bpe_tokenizer,
    )

    root = tmp_path_factory.mktemp("folders")
    cfg = BilingualConfig(people=30, heldout=6, texts=2)
    texts = english_biographies(cfg)
    (root / "corpus").mkdir()
    for split, docs in split_documents(texts, cfg, "en").items():
        (root / "corpus" / f"{split}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tok = train_bpe_tokenizer(texts, vocab_size=300)
    config = tiny_config("llama", vocab_size=len(tok), max_position_embeddings=64, eos_token_id=tok.eos_token_id)
    out = {"root": root, "corpus": root / "corpus"}
    out["base"] = save_model(model_from_config(config), root / "base", base_model="random tiny llama", tokenizer=tok)
    for name, opts in (("scale-route", ROUTE), ("freeze", {"k": 1}), ("llama-pro", {"n": 3})):
        method = get_method(name, **opts)
        torch.manual_seed(0)
        model = _moved(method.apply(load_model(out["base"])))
        key = name.split("-")[-1]
        out[f"{key}_full"] = save_model(model, root / f"{key}_full", method, base_model=str(out["base"]), tokenizer=tok)
        out[f"{key}_delta"] = save_model(model, root / f"{key}_delta", method, base_model=str(out["base"]),
                                         tokenizer=tok, delta=True)
        if name == "scale-route":
            model.save_pretrained(root / "route_hf")
            tok.save_pretrained(root / "route_hf")
            args = TrainingArguments(output_dir=str(root / "trainer"), report_to=[], use_cpu=True)
            Trainer(model=model, args=args, processing_class=tok).save_model(str(root / "route_trainer"))
            out["route_hf"], out["route_trainer"] = root / "route_hf", root / "route_trainer"
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "mc.jsonl").write_text("".join(json.dumps({"q": d[:60], "choices": [" a", " b", " c"], "label": i % 3})
                                            + "\n" for i, d in enumerate(texts[:6])))
    (tasks / "local_mc.yaml").write_text(
        f"task: local_mc\ndataset_path: json\ndataset_name: null\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tasks / 'mc.jsonl'}\n  cache_dir: {root / 'hf_cache'}\noutput_type: multiple_choice\n"
        'test_split: test\ndoc_to_text: "{{q}}"\ndoc_to_target: "{{label}}"\ndoc_to_choice: "{{choices}}"\n'
        "metric_list:\n  - metric: acc\n")
    out["tasks"] = tasks / "local_mc.yaml"
    return out


def _ok(args: list[str]):
    res = runner.invoke(app, args)
    assert res.exit_code == 0, (args, res.output, res.exception)
    return res


def _one_error(args: list[str], phrase: str) -> None:
    res = runner.invoke(app, args)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), (args, res.output)
    assert phrase in lines[0], lines[0]


def _ppl(fx, tmp: Path, model: str) -> dict:
    out = tmp / f"{Path(model).name}.json"
    _ok(["eval-ppl", "--model", model, "--dataset", str(fx["corpus"]), "--split", "test", "--seq-len", "32",
         "--batch", "4", "--cache", str(tmp / "cache"), "--out", str(out)])
    return json.loads(out.read_text())


def test_every_kind_of_folder_loads_as_its_full_checkpoint(fx):
    """The premise: load_model gives each folder's model, bit for bit."""
    for kind, full in [(k, "route_full") for k in SCALE_KINDS] + [("freeze_delta", "freeze_full"),
                                                                   ("pro_delta", "pro_full")]:
        a, b = load_model(fx[kind]).state_dict(), load_model(fx[full]).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), kind


@pytest.mark.parametrize("kind", [*SCALE_KINDS, "freeze_delta", "pro_delta"])
def test_eval_ppl_takes_it_with_the_full_checkpoints_number(fx, tmp_path, kind):
    full = {"freeze_delta": "freeze_full", "pro_delta": "pro_full"}.get(kind, "route_full")
    got, want = _ppl(fx, tmp_path, str(fx[kind])), _ppl(fx, tmp_path, str(fx[full]))
    assert got["method"] == want["method"] and got["tokens"] == want["tokens"] > 0
    assert got["ppl"] == want["ppl"], (kind, got["ppl"], want["ppl"])
    assert got["ppl"] != _ppl(fx, tmp_path, str(fx["base"]))["ppl"]  # the trained model, not its base


def _harness(fx, tmp: Path, model: str) -> dict:
    out = tmp / "harness"
    _ok(["eval-harness", "--model", model, "--tasks", str(fx["tasks"]), "--limit", "6", "--batch-size", "2",
         "--device", "cpu", "--bootstrap-iters", "0", "--out", str(out)])
    (run,) = [d for d in out.iterdir() if d.name.startswith(Path(model).name + "-")]
    return json.loads((run / "lm_eval_results.json").read_text())["results"]["local_mc"]


@pytest.mark.parametrize("kind", ["route_hf", "route_delta"])
def test_eval_harness_takes_it_with_the_full_checkpoints_scores(fx, tmp_path, kind):
    got, want = _harness(fx, tmp_path, str(fx[kind])), _harness(fx, tmp_path, str(fx["route_full"]))
    assert got["acc,none"] == want["acc,none"]


def _cpt(fx, tmp: Path, model: str, method: str) -> dict:
    c = str(fx["corpus"])
    out = tmp / "runs"
    _ok(["train-cpt", "--preset", "tiny", "--method", method, "--model", model, "--data", c, "--old-eval", c,
         "--new-eval", c, "--set", "old_eval.split=test", "--set", "new_eval.split=test", "--set", "train.seq_len=32",
         "--set", "train.batch=4", "--set", "train.steps=2", "--set", "eval.every=2", "--set", "eval.rep_batch=2",
         "--out", str(out), "--cache", str(tmp / "cache"), "--checkpoints", str(tmp / "ck")])
    (run,) = [d for d in out.iterdir() if (d / "result.json").exists()]
    return json.loads((run / "result.json").read_text())


@pytest.mark.slow  # two tiny runs each: about 40 s on 2 shared cores
@pytest.mark.parametrize("kind, method, same_as", [
    ("route_hf", "scale-route", "route_full"),
    ("route_delta", "scale-route", "route_full"),
    ("freeze_delta", "fft", "freeze_full"),
])
def test_train_cpt_takes_it_as_the_full_checkpoint(fx, tmp_path, kind, method, same_as):
    """A SCALE folder trains on as its own method; a Freeze delta is a plain base like its full checkpoint: the
    same metrics at every evaluation as the full checkpoint's run."""
    got = _cpt(fx, tmp_path / "a", str(fx[kind]), method)
    want = _cpt(fx, tmp_path / "b", str(fx[same_as]), method)
    assert got["method"] == method
    for key in ("old_ppl_start", "old_ppl_end", "new_ppl_end", "final_loss"):
        assert got["summary"][key] == want["summary"][key], key
    assert got["summary"]["old_ppl_end"] != got["summary"]["old_ppl_start"]  # it trained


def test_train_cpt_says_which_method_a_scale_folder_trains_as(fx, tmp_path):
    c = str(fx["corpus"])
    _one_error(["train-cpt", "--preset", "tiny", "--method", "fft", "--model", str(fx["route_hf"]), "--data", c,
                "--old-eval", c, "--new-eval", c, "--out", str(tmp_path / "r"), "--cache", str(tmp_path / "c"),
                "--checkpoints", str(tmp_path / "k")], "it trains on as scale-route only")


@pytest.mark.parametrize("kind, full", [("freeze_delta", "freeze_full"), ("pro_delta", "pro_full")])
def test_upscale_and_prepare_take_a_plain_delta_as_their_full_checkpoint(fx, tmp_path, kind, full):
    for cmd in (["upscale", "--hidden-up", "32", "--ffn-up", "16"], ["prepare", "--method", "fft"]):
        a, b = tmp_path / f"{cmd[0]}-a", tmp_path / f"{cmd[0]}-b"
        _ok([*cmd, "--model", str(fx[kind]), "--out", str(a)])
        _ok([*cmd, "--model", str(fx[full]), "--out", str(b)])
        ma, mb = load_model(a), load_model(b)
        ids = torch.tensor([[1, 5, 9, 14, 3]])
        assert torch.equal(ma(ids).logits, mb(ids).logits), cmd
        base = load_model(fx[full])(ids).logits
        torch.testing.assert_close(ma(ids).logits, base, rtol=0, atol=1e-5)  # the trained model, its function kept
        assert ma.config.num_hidden_layers == load_model(fx[full]).config.num_hidden_layers


@pytest.mark.parametrize("kind", ["route_full", *SCALE_KINDS])
@pytest.mark.parametrize("cmd", [["upscale", "--hidden-up", "32"], ["prepare", "--method", "fft"]])
def test_upscale_and_prepare_refuse_scale_in_one_line(fx, tmp_path, kind, cmd):
    _one_error([*cmd, "--model", str(fx[kind]), "--out", str(tmp_path / "o")], "not a plain model")
    assert not (tmp_path / "o").exists()


def test_merge_writes_a_delta_as_its_full_checkpoint_and_refuses_scale(fx, tmp_path):
    _ok(["merge", "--model", str(fx["pro_delta"]), "--out", str(tmp_path / "m")])
    a, b = load_model(tmp_path / "m").state_dict(), load_model(fx["pro_full"]).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for kind in ("route_full", "route_hf"):
        _one_error(["merge", "--model", str(fx[kind]), "--out", str(tmp_path / kind)], "cannot be merged")
