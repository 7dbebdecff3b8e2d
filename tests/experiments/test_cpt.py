"""Continual pre-training end to end on tiny random Llama / GPT-NeoX models and local text.

What must hold (issue #5): SCALE-Preserve's representation cosine stays 1 while FFT's falls; resuming
after a stop reproduces the uninterrupted run exactly; a 2-process torchrun (gloo) run matches a
1-process run with the same global batch; bad input is one line, exit 2, nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.data.batches import RankBatches
from scalecl.data.corpus import CorpusSpec, PackedChunks, iter_texts
from scalecl.experiments import load_preset
from scalecl.experiments.config import PAPER_CPT_LR
from scalecl.methods import METHOD_ORDER
from scalecl.models.build import model_from_config, tiny_config
from scalecl.training.loop import OptimConfig, TrainPlan, train
from scalecl.training.record import checkpoint_dir
from tests.conftest import local_sets, records, run

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_preserve_keeps_the_representation_fft_does_not(tmp_path, local, arch):
    """Paper Fig. 4a: SCALE-Preserve's original-channel final hidden state never moves (cos 1 within 1e-5)."""
    results = run(tmp_path, local_sets(local, arch, "lr.fft=3e-3", "lr.scale-preserve=1e-2"),
                  ["fft", "scale-preserve", "llama-pro"])
    assert [r["method"] for r in results] == ["fft", "llama-pro", "scale-preserve"]
    pres, fft = records(tmp_path / "out", "scale-preserve"), records(tmp_path / "out", "fft")
    assert [r["step"] for r in pres] == [0, 3, 6]
    assert all(abs(r["rep_cos"] - 1.0) <= 1e-5 for r in pres)
    assert pres[-1]["new/ppl"] < pres[0]["new/ppl"]  # while it learns the new domain
    assert fft[0]["rep_cos"] == pytest.approx(1.0, abs=1e-6) and fft[-1]["rep_cos"] < 1.0 - 1e-4
    assert records(tmp_path / "out", "llama-pro")[0]["rep_cos"] == pytest.approx(1.0, abs=1e-5)  # identity blocks
    assert pres[-1]["up_norm"] > pres[0]["up_norm"] and "up_norm/w12" not in pres[0]  # no W12 trains
    assert "up_norm" not in fft[0]
    for r in results:  # every method starts from the same base function and evaluation sets
        assert r["summary"]["old_ppl_start"] == pytest.approx(results[0]["summary"]["old_ppl_start"], rel=1e-5)


@pytest.mark.parametrize("method", ["scale-route", "lora"])
def test_resume_after_a_stop_reproduces_the_uninterrupted_run(tmp_path, local, method):
    sets = local_sets(local, "llama", "train.micro_batch=2", "checkpoint.every=2", "checkpoint.keep=1")
    (full,) = run(tmp_path / "a", sets, [method])
    assert run(tmp_path / "b", sets, [method], stop_after=3) == []
    (ckpts,) = [p for p in (tmp_path / "b" / "runs" / "cpt").iterdir() if not p.name.startswith(".")]  # .lock
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000003"]  # keep=1 pruned step 2
    assert not list((tmp_path / "b" / "out").glob("*/result.json"))
    (resumed,) = run(tmp_path / "b", sets, [method], resume=True)
    assert resumed["summary"]["final_loss"] == full["summary"]["final_loss"]  # exactly, on CPU
    assert records(tmp_path / "b" / "out", method) == records(tmp_path / "a" / "out", method)
    assert resumed["accumulation"] == 2 and resumed["final"]["step"] == 6


def test_gradient_accumulation_matches_one_big_batch(local):
    spec = CorpusSpec(str(local / "corpus" / "ko"))
    from scalecl.data.tokenizer import load_tokenizer

    tok = load_tokenizer(str(local / "llama"))
    out = []
    for micro in (4, 2, 1):
        model = model_from_config(tiny_config("llama", vocab_size=len(tok)), seed=0)
        batches = RankBatches(PackedChunks(lambda: iter_texts(spec), tok, 32, loop=True), micro)
        plan = TrainPlan(4, OptimConfig(lr=1e-3, warmup_steps=1, schedule="linear"), accum=4 // micro)
        losses = train(model, batches, plan)
        out.append((losses, torch.cat([p.detach().flatten() for p in model.parameters()])))
    for losses, params in out[1:]:
        torch.testing.assert_close(losses, out[0][0], rtol=1e-5, atol=0)  # fp32 summation order only
        torch.testing.assert_close(params, out[0][1], rtol=1e-4, atol=1e-6)


@pytest.mark.xdist_group("torchrun")  # conftest.GROUPS: one 2-process run at a time
@pytest.mark.slow
def test_two_process_torchrun_matches_one_process(tmp_path, local):
    """torchrun --nproc_per_node 2 (gloo on CPU): same global batch, same numbers within float tolerance."""
    sets = local_sets(local, "llama", "train.micro_batch=2")
    single = {r["method"]: r for r in run(tmp_path / "one", sets, ["fft", "scale-route"])}
    assert all(r["accumulation"] == 2 for r in single.values())
    two = tmp_path / "two"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "scalecl.cli",
           "train-cpt", "--preset", "tiny", "--method", "fft,scale-route", "--out", str(two / "out"), "--cache",
           str(two / "cache"), "--checkpoints", str(two / "runs"), "--device", "cpu"]
    cmd += [x for s in sets for x in ("--set", s)]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for method in single:
        (res,) = [json.loads(p.read_text()) for p in (two / "out").glob(f"tiny-{method}-*/result.json")]
        assert res["processes"] == 2 and res["accumulation"] == 1 and res["micro_batch"] == 2
        for a, b in zip(records(two / "out", method), records(tmp_path / "one" / "out", method), strict=True):
            assert a["step"] == b["step"]
            for key in ("loss", "old/ppl", "new/ppl", "rep_cos"):  # tolerance: fp32 reduction order over 6 steps
                if b[key] is None:  # the loss of step 0 (nothing trained yet): both runs must agree on that
                    assert a[key] is None, (method, a["step"], key)
                else:
                    assert a[key] == pytest.approx(b[key], rel=1e-4), (method, a["step"], key)


@pytest.mark.xdist_group("torchrun")  # conftest.GROUPS: one 2-process run at a time
def test_two_process_run_builds_the_builtin_base_on_rank_0(tmp_path):
    """Uncached builtin corpus and base under torchrun: rank 0 builds them while rank 1 waits, then both train."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "scalecl.cli",
           "train-cpt", "--preset", "tiny", "--method", "lora", "--out", str(tmp_path / "out"), "--cache",
           str(tmp_path / "cache"), "--checkpoints", str(tmp_path / "runs"), "--device", "cpu",
           "--set", "pretrain.steps=4", "--set", "train.steps=2", "--set", "eval.every=1"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (res,) = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("tiny-lora-*/result.json")]
    assert res["processes"] == 2 and res["base"]["cached"] is False and res["final"]["step"] == 2
    assert proc.stdout.count("wrote") == 1  # only rank 0 writes and reports


def test_tiny_preset_end_to_end_with_builtin_corpus_and_eval_ppl(tmp_path, monkeypatch):
    """The offline command: stand-in corpus, cached base, metrics.jsonl + result.json, skip, eval-ppl."""
    descs: list[str] = []
    import scalecl.training.fit as fit_module

    real = fit_module.train
    monkeypatch.setattr(fit_module, "train", lambda *a, **k: descs.append(a[2].desc) or real(*a, **k))
    args = ["train-cpt", "--preset", "tiny", "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache"),
            "--checkpoints", str(tmp_path / "runs"), "--set", "pretrain.steps=10", "--set", "train.steps=4"]
    res = runner.invoke(app, [*args, "--method", "scale-route"])
    assert res.exit_code == 0, res.output
    assert descs == ["pre-train base", "cpt: scale-route"]
    res = runner.invoke(app, [*args, "--method", "fft,scale-route"])
    assert res.exit_code == 0, res.output
    assert descs[2:] == ["cpt: fft"] and "finished run found" in res.output  # base cached, route skipped
    (d,) = (tmp_path / "out").glob("tiny-scale-route-*")
    assert sorted(p.name for p in d.iterdir()) == [".scalecl-run-files.json",  # what the run wrote (fingerprints)
                                                   "metrics.jsonl", "result.json", "train_log.jsonl"]
    recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 4]
    for r in recs:
        assert {"old/ppl", "new/ppl", "rep_cos", "up_norm", "up_norm/w12", "old/route_preserve",
                "new/route_adapt"} <= set(r)
        assert r["new/route_preserve"] + r["new/route_adapt"] == pytest.approx(1.0)
    result = json.loads((d / "result.json").read_text())
    assert result["base"]["cached"] is False and result["provenance"]["torch"] == torch.__version__
    assert result["summary"]["new_ppl_end"] == recs[-1]["new/ppl"]
    corpus = next((tmp_path / "cache" / "cpt").glob("corpus-*"))
    res = runner.invoke(app, ["eval-ppl", "--model", str(checkpoint_dir(result, d)), "--dataset", str(corpus / "ko"),
                              "--split", "test", "--take", "30", "--seq-len", "64", "--json",
                              "--out", str(tmp_path / "ppl.json")])
    assert res.exit_code == 0, res.output
    ppl = json.loads((tmp_path / "ppl.json").read_text())
    assert json.loads(res.stdout) == json.loads(json.dumps(ppl, default=str))
    assert ppl["ppl"] == pytest.approx(recs[-1]["new/ppl"], rel=1e-6) and ppl["seq_len"] == 64
    assert ppl["tokens"] == result["data"]["new_eval"]["tokens"] and 0 <= ppl["route_preserve"] <= 1
    res = runner.invoke(app, ["eval-ppl", "--model", str(checkpoint_dir(result, d)), "--dataset", str(corpus / "ko"),
                              "--split", "test", "--take", "30", "--seq-len", "64"])
    assert res.exit_code == 0 and res.stdout.startswith(f"ppl {ppl['ppl']:.4f}"), res.output
    # without --seq-len: the length the run trained at, recorded in its checkpoint (the training's own number)
    assert json.loads((checkpoint_dir(result, d) / "scalecl.json").read_text())["train_seq_len"] == 64
    res = runner.invoke(app, ["eval-ppl", "--model", str(checkpoint_dir(result, d)), "--dataset", str(corpus / "ko"),
                              "--split", "test", "--take", "30", "--json"])
    assert res.exit_code == 0, res.output
    default = json.loads(res.stdout)
    assert default["seq_len"] == 64 and "trained at" in default["seq_len_from"] and default["ppl"] == ppl["ppl"]
    assert "eval-ppl: 64 tokens per sequence (the length it was trained at" in res.stderr


def _bad_cases(local: Path, tmp: Path):
    empty = tmp / "empty.jsonl"
    empty.write_text("")
    nocol = tmp / "nocol.jsonl"
    nocol.write_text('{"body": "x"}\n')
    return [
        (local_sets(local, "llama", f"data.path={tmp / 'missing'}"), "does not exist"),
        (local_sets(local, "llama", f"data.path={nocol}", "data.split=train"), "no text column 'text'"),
        (local_sets(local, "llama", f"old_eval.path={empty}", "old_eval.split=train"), "is empty"),
        (local_sets(local, "llama", "train.seq_len=65"), "exceeds the model's 64 positions"),
        (local_sets(local, "llama", "train.batch=3", "train.micro_batch=2"), "multiple of micro_batch"),
        (["data.path=/nonexistent/corpus"], "does not exist"),  # builtin base: fails before generating anything
        (["train.seq_len=65"], "exceeds the model's 64 positions"),
    ]


@pytest.mark.parametrize("case", range(7))
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, local, case):
    sets, msg = _bad_cases(local, tmp_path)[case]
    dirs = [tmp_path / n for n in ("out", "cache", "runs")]
    args = ["train-cpt", "--preset", "tiny", "--method", "fft", "--out", str(dirs[0]), "--cache", str(dirs[1]),
            "--checkpoints", str(dirs[2])]
    res = runner.invoke(app, args + [x for s in sets for x in ("--set", s)])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], res.output
    assert not any(d.exists() for d in dirs)


def test_eval_ppl_bad_input(tmp_path, local):
    for args, msg in ((["--dataset", str(tmp_path / "nope")], "does not exist"),
                      (["--dataset", str(local / "corpus" / "ko"), "--seq-len", "100"], "exceeds the model's 64"),
                      (["--dataset", str(local / "corpus" / "ko"), "--text-column", "body"], "no text column")):
        res = runner.invoke(app, ["eval-ppl", "--model", str(local / "llama"), *args])
        assert res.exit_code == 2 and res.output.startswith("error:") and msg in res.output, res.output
    res = runner.invoke(app, ["eval-ppl", "--model", str(tmp_path / "nomodel"), "--dataset", "builtin:en"])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_presets_and_paper_numbers():
    paper = load_preset("cpt", "paper")
    assert paper.lr == PAPER_CPT_LR == {"fft": 1e-5, "lora": 1e-5, "freeze": 1e-5, "llama-pro": 2e-4,
                                        "scale-preserve": 1e-3, "scale-adapt": 1e-3, "scale-route": 1e-3}
    assert paper.base == "meta-llama/Llama-3.2-1B" and (paper.data.path, paper.data.name) == (
        "HuggingFaceFW/fineweb-2", "kor_Hang")
    assert (paper.old_eval.path, paper.old_eval.name, paper.old_eval.take) == (
        "HuggingFaceFW/fineweb-edu", "sample-10BT", 30_000)
    assert (paper.new_eval.split, paper.train.batch, paper.train.seq_len, paper.train.warmup_ratio) == (
        "test", 512, 8192, 0.06)
    assert paper.method_options("scale-preserve") == {"hidden_up": 256, "ffn_up": 1024}
    assert paper.method_options("scale-route") == {"hidden_up": 256, "ffn_up": 1024, "l_fp": 3}
    assert [paper.method_options(m) for m in ("lora", "freeze", "llama-pro")] == [{"rank": 256}, {"k": 3}, {"n": 4}]
    from scalecl.experiments.budget import llama_32_1b_config
    from scalecl.methods import get_method

    for name in METHOD_ORDER:  # every paper option fits Llama-3.2-1B
        get_method(name, **paper.method_options(name)).check(llama_32_1b_config())
    cpu = load_preset("cpt", "cpu")
    assert cpu.base == "builtin" and cpu.data.path == "builtin:ko" and cpu.dtype == "float32"
    assert load_preset("bio", "cpu").stage1.steps == 5000  # the bio presets still load


def test_cpu_bf16_autocast_runs_close_to_float32_under_its_own_name(tmp_path, local):
    """compute.cpu_bf16: the GPU path's bf16 autocast on a CPU. Its losses differ from float32 (autocast is on) by
    bf16 rounding only; the run is named apart (its numerics) and records the precision it computed in."""
    from scalecl.compute.perf import autocast_dtype

    assert autocast_dtype("bfloat16", torch.device("cpu")) is None  # a CPU computes in float32 unless asked
    assert autocast_dtype("float32", torch.device("cpu"), cpu_bf16=True) == torch.bfloat16
    assert autocast_dtype("float32", torch.device("cuda"), cpu_bf16=True) is None  # a GPU follows dtype
    sets = local_sets(local, "llama")
    run(tmp_path / "a", sets, ["scale-route"])
    run(tmp_path / "b", [*sets, "compute.cpu_bf16=true"], ["scale-route"])
    (da,), (db,) = ([p for p in (tmp_path / x / "out").glob("tiny-*") if p.is_dir()] for x in "ab")
    fp32, bf16 = (json.loads((d / "result.json").read_text()) for d in (da, db))
    assert da.name != db.name
    assert bf16["run"]["numerics"] == {"device": "cpu", "cpu_threads": 1, "autocast": "bfloat16"}
    assert fp32["run"]["numerics"] == {"device": "cpu", "cpu_threads": 1}
    assert (fp32["speed"]["precision"], bf16["speed"]["precision"]) == ("fp32", "bf16")
    a, b = ([json.loads(x)["loss"] for x in (d / "train_log.jsonl").read_text().splitlines()] for d in (da, db))
    assert len(a) == len(b) == 6 and a != b
    assert max(abs(x - y) / x for x, y in zip(a, b, strict=True)) < 0.02  # bf16 rounding, not another run


def test_final_heldout_evaluation_scores_whole_sets_as_eval_ppl_does(tmp_path, local):
    """eval.final_take: the base once and each final model on every held-out document, at the training length
    and at the model's context; the final model's numbers are eval-ppl's on its checkpoint; off by default and
    then no part of a run's name."""
    from scalecl.common.errors import ScaleclError
    from scalecl.experiments.config import CorpusConfig
    from scalecl.experiments.eval_ppl import eval_ppl

    small = ("old_eval.take=10", "new_eval.take=10")  # the slices evaluated during training
    fft, route = run(tmp_path / "a", local_sets(local, "llama", *small, "eval.final_take=0"), ["fft", "scale-route"])
    (plain,) = run(tmp_path / "b", local_sets(local, "llama", *small), ["fft"])
    assert "heldout" not in plain and Path(plain["checkpoint"]).parent.name != Path(fft["checkpoint"]).parent.name
    assert plain["final"] == fft["final"]  # a measurement only: the run trains the same
    corpus = local / "corpus"
    for split, lang in (("old", "en"), ("new", "ko")):
        docs = len((corpus / lang / "test.jsonl").read_text().splitlines())
        for r in (fft, route):
            h = r["heldout"]
            assert h["lengths"] == [32, 64] and h["train_seq_len"] == 32  # the local bases' 64 positions
            assert h[split]["documents"] == docs > r["data"][f"{split}_eval"]["documents"]
            for n in ("32", "64"):
                at = h[split]["at"][n]
                assert at["start"] == fft["heldout"][split]["at"][n]["start"]  # the base, scored once
                assert at["end"]["seq_len"] == int(n) and at["end"]["tokens"] == at["tokens"]
                rec = eval_ppl(r["checkpoint"], CorpusConfig(path=str(corpus / lang), split="test"), int(n), 3,
                               tmp_path / "cache")
                assert rec["ppl"] == pytest.approx(at["end"]["ppl"], rel=1e-5) and rec["tokens"] == at["tokens"]
        assert fft["heldout"][split]["at"]["32"]["start"]["ppl"] != fft["heldout"][split]["at"]["32"]["end"]["ppl"]
    assert 0 < route["heldout"]["old"]["at"]["64"]["end"]["route_preserve"] <= 1
    with pytest.raises(ScaleclError, match="eval.final_context=65 exceeds the model's 64 positions"):
        run(tmp_path / "c", local_sets(local, "llama", "eval.final_take=0", "eval.final_context=65"), ["fft"])
    assert not (tmp_path / "c" / "out").exists()
