"""The biography experiment end to end on the tiny preset (shortened), plus its metric and data plumbing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import scalecl.experiments.bio_data as bio_data
import scalecl.training.fit as fit_module
from scalecl.cli import app
from scalecl.data.batches import packed_batches
from scalecl.data.biography import ATTRIBUTES, generate_people, preset, qa_pairs
from scalecl.evaluation.qa import qa_accuracy, qa_train_batch
from scalecl.experiments import load_preset
from scalecl.models.build import model_from_config, tiny_config
from scalecl.training.loop import TrainPlan
from scalecl.training.optim import OptimConfig
from tests.conftest import tiny_qa_of

runner = CliRunner()
FAST = ["--set", "stage1.steps=30", "--set", "stage2.steps=5", "--set", "stage3.steps=12",
        "--set", "eval.dense_until=6", "--set", "eval.dense_every=3", "--set", "eval.every=6"]


@pytest.fixture(scope="module")
def calls():
    """Record every training stage that runs (by its progress description)."""
    seen: list[str] = []
    real = fit_module.train

    def spy(model, batches, plan, **kwargs):
        seen.append(plan.desc)
        return real(model, batches, plan, **kwargs)

    fit_module.train = spy
    yield seen
    fit_module.train = real


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bio")
    return root / "out", root / "cache", root / "ckpt"


def invoke(dirs, *args):
    out, cache, ckpt = dirs
    res = runner.invoke(app, ["train-bio", "--preset", "tiny", "--out", str(out), "--cache", str(cache),
                              "--checkpoints", str(ckpt), *FAST, *args])
    assert res.exit_code == 0, res.output
    return res


def run_dir(out, method):
    (d,) = [p for p in out.iterdir() if p.name.startswith(f"tiny-{method}-")]
    return d


@pytest.mark.xdist_group("test_bio.dirs")  # one worker, in order: the second finds the first's runs
def test_tiny_end_to_end_fft_then_route_reuses_stages(dirs, calls):
    invoke(dirs, "--method", "fft")
    assert calls == ["stage 1: pre-train", "stage 2: Task 0 QA", "stage 3: fft"]
    res = invoke(dirs, "--method", "scale-route")
    assert calls[3:] == ["stage 3: scale-route"]  # stages 1-2 came from the cache: no stage-1 step ran
    assert "biography: hard first-token accuracy" in res.output.replace("\n", " ")

    out = dirs[0]
    for method in ("fft", "scale-route"):
        d = run_dir(out, method)
        assert sorted(p.name for p in d.iterdir()) == [".scalecl-run-files.json",  # what the run wrote (fingerprints)
                                                       "metrics.jsonl", "result.json", "train_log.jsonl"]
        lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        rc = load_preset("bio", "tiny", FAST[1::2])
        assert [r["step"] for r in lines] == rc.eval.steps(12) == [0, 3, 6, 12]
        log = [json.loads(x) for x in (d / "train_log.jsonl").read_text().splitlines()]
        assert [r["step"] for r in log] == list(range(1, 13))
        assert all(r["grad_norm"] > 0 and r["tokens"] > 0 and r["lr"] > 0 for r in log)
        assert [r["loss"] for r in lines[1:]] == [log[s - 1]["loss"] for s in (3, 6, 12)]
        for r in lines:
            for split in ("task0", "task1"):
                assert 0.0 <= r[f"{split}/acc"] <= 1.0 and 0.0 <= r[f"{split}/soft_acc"] <= 1.0
                assert all(f"{split}/acc/{a}" in r for a in ATTRIBUTES)
            if method == "scale-route":
                assert 0.0 <= r["route_preserve"] <= 1.0
                assert r["route_preserve"] + r["route_adapt"] == pytest.approx(1.0)
        result = json.loads((d / "result.json").read_text())
        assert result["method"] == method and result["preset"] == "tiny"
        assert result["config"]["stage1"]["steps"] == 30
        assert set(result["wall_s"]) == {"data", "stage1", "stage2", "stage3", "stage3_eval", "total", "phases"}
        phases = result["wall_s"]["phases"]  # a partition of the process's time up to result.json
        assert sum(phases.values()) == pytest.approx(result["wall_s"]["total"], abs=0.1 * len(phases))
        assert result["run"]["name"] == d.name and result["run"]["method"] == method
        assert result["stages_cached"] == {"stage1": method != "fft", "stage2": method != "fft"}
        assert result["summary"]["task0_start"] == lines[0]["task0/acc"]
        assert result["summary"]["task0_min"] == min(r["task0/acc"] for r in lines)
        for split in ("task0_heldout", "task1"):
            assert {"acc", "soft_acc", "exact_match"} <= set(result["final"][split])
        assert result["provenance"]["torch"] == torch.__version__
    fft = json.loads((run_dir(out, "fft") / "result.json").read_text())
    route = json.loads((run_dir(out, "scale-route") / "result.json").read_text())
    # paper Sec. 5.1: Route trains at 10x the FFT learning rate
    assert route["lr"] == pytest.approx(10 * fft["lr"])
    # a function-preserving method starts where FFT starts: same stage-2 model, same slices
    assert route["summary"]["task0_start"] == fft["summary"]["task0_start"]


@pytest.mark.xdist_group("test_bio.dirs")  # one worker, in order: the second finds the first's runs
def test_finished_run_is_skipped_unless_forced(dirs, calls):
    n = len(calls)
    res = invoke(dirs, "--method", "fft")
    assert len(calls) == n and "finished run found" in res.output
    invoke(dirs, "--method", "fft", "--force")
    assert calls[n:] == ["stage 3: fft"]


@pytest.mark.parametrize("args,msg", [
    (["--preset", "huge"], "unknown preset 'huge'"),
    (["--set", "stage1.stepz=3"], "unknown config key stage1.stepz"),
    (["--set", "stage1.steps"], "--set expects key=value"),
    (["--method", "sgd"], "unknown method 'sgd'"),
    (["--tokenizer", "/no/such/tokenizer"], "tokenizer path /no/such/tokenizer does not exist"),
    (["--tokenizer", "/no/such/tokenizer"], "--tokenizer local"),
    (["--set", "methods.llama-pro.n=3"], "positive divisor"),
])
def test_bad_input_one_line(tmp_path, args, msg):
    res = runner.invoke(app, ["train-bio", "--preset", "tiny", "--out", str(tmp_path / "o"), "--cache",
                              str(tmp_path / "c"), "--method", "llama-pro", *args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("error:") and msg in lines[-1], res.output
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def qa20(tiny_people):
    """(tokenizer, pairs, encoded QA) of 20 tiny people."""
    return tiny_qa_of(tiny_people, 20)


def test_batched_accuracy_equals_per_item_loop(qa20):
    tok, pairs, qa = qa20
    model = model_from_config(tiny_config("gpt_neox", vocab_size=len(tok)), seed=3)
    got = qa_accuracy(model, qa, batch_size=7, exact=True)
    hard, soft, exact = [], [], []
    with torch.no_grad():
        for p, a in zip(pairs.prompts, pairs.answers, strict=True):
            p_ids = tok(p, add_special_tokens=False)["input_ids"]
            a_ids = tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            logits = model(torch.tensor([p_ids + a_ids])).logits[0]
            first = logits[len(p_ids) - 1]
            hard.append(first.argmax().item() == a_ids[0])
            soft.append(first.softmax(-1)[a_ids[0]].item())
            gen = model.generate(torch.tensor([p_ids]), max_new_tokens=len(a_ids), do_sample=False,
                                 pad_token_id=tok.pad_token_id, eos_token_id=None)[0, len(p_ids):].tolist()
            exact.append(gen == a_ids)
    assert got["acc"] == pytest.approx(np.mean(hard))
    assert got["soft_acc"] == pytest.approx(np.mean(soft), abs=1e-6)
    assert got["exact_match"] == pytest.approx(np.mean(exact))


def test_qa_loss_covers_answer_and_eos_only(qa20):
    tok, pairs, qa = qa20
    b = qa_train_batch(qa, torch.arange(4))
    for i in range(4):
        n_ans = len(tok(pairs.answers[i], add_special_tokens=False)["input_ids"]) + 1
        labelled = b["labels"][i][b["labels"][i] != -100].tolist()
        assert len(labelled) == n_ans and labelled[-1] == tok.eos_token_id
        assert tok.decode(labelled[:-1]) == pairs.answers[i]


def test_packing_keeps_every_token_and_reshuffles():
    """Each epoch is the documents (+ EOS) in a fresh order, cut into full chunks: no token lost or repeated."""
    docs = [[i] * (i % 5 + 1) for i in range(3, 40)]
    context, batch = 8, 2
    it = packed_batches(docs, eos=1, context=context, batch=batch, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(2):
        stream = [t for i in rng.permutation(len(docs)) for t in docs[i] + [1]]
        n_chunks = len(stream) // context
        n_batches = n_chunks // batch
        got = torch.cat([next(it)["input_ids"] for _ in range(n_batches)]).flatten().tolist()
        assert got == stream[: n_batches * batch * context]
        assert len(stream) - len(got) < (batch + 1) * context  # only the tail that fills no batch is dropped
    first = [t for i in np.random.default_rng(0).permutation(len(docs)) for t in docs[i]]
    second = [t for i in rng.permutation(len(docs)) for t in docs[i]]
    assert first != second


def test_same_seed_same_stage1(tmp_path):
    rc = load_preset("bio", "tiny", ["stage1.steps=3", "stage2.steps=1"])
    data = bio_data.prepare_data(rc, tmp_path)
    blobs = []
    for _ in range(2):
        torch.manual_seed(rc.seed)
        m = model_from_config(bio_data.base_model_config(rc, data.tokenizer), seed=rc.seed)
        from scalecl.evaluation.qa import qa_batches
        from scalecl.training.loop import train

        train(m, qa_batches(data.qa["task0_train"], 8, rc.seed), TrainPlan(3, OptimConfig.of(rc.stage1, rc.stage1.lr)))
        blobs.append(b"".join(p.detach().numpy().tobytes() for p in m.parameters()))
    assert blobs[0] == blobs[1]


def test_a_given_tokenizer_directory_is_used(tmp_path):
    """--tokenizer DIR: a byte-level BPE tokenizer without a pad token (like Pythia's) works end to end."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from scalecl.data.biography import biographies

    people = generate_people(preset("tiny"))
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    qa = qa_pairs(people)
    backend.train_from_iterator(biographies(people) + qa.prompts + qa.answers, trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>").save_pretrained(tmp_path / "bpe")
    rc = load_preset("bio", "tiny", [f"tokenizer={tmp_path / 'bpe'}"])
    data = bio_data.prepare_data(rc, tmp_path / "cache")
    assert data.tokenizer_dir == str(tmp_path / "bpe") and len(data.tokenizer) <= 600
    assert data.tokenizer.pad_token_id == data.tokenizer.eos_token_id
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("tokenizer-*"))
    b = qa_train_batch(data.qa["task1"], torch.arange(3))
    assert (b["labels"] != -100).sum() > 3


def test_routing_at_the_answer_position_matches_two_explicit_paths(qa20):
    """answer/route_preserve and the router-score quantiles are those of cos(Z_preserve, Z_adapt) at the scored
    position (the last prompt token), computed here from the two paths' full logits."""
    from scalecl.evaluation.qa import QUANTILES
    from scalecl.methods import get_method
    from scalecl.methods.scale import scale_path

    tok, _, qa = qa20
    method = get_method("scale-route", hidden_up=32, ffn_up=32, l_fp=1)
    model = method.apply(model_from_config(tiny_config("gpt_neox", vocab_size=len(tok)), seed=3))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an adapt path that differs from the preserve path, as after training
        for name, p in model.named_parameters():
            if name.endswith("w12") and p.requires_grad:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    ids = qa.ids
    rows = torch.arange(len(qa))
    with torch.no_grad(), scale_path(model, "preserve"):
        zp = model(input_ids=ids).logits[rows, qa.prompt_len - 1]
    with torch.no_grad(), scale_path(model, "adapt"):
        za = model(input_ids=ids).logits[rows, qa.prompt_len - 1]
    cos = torch.nn.functional.cosine_similarity(zp.double(), za.double(), dim=-1)
    tau = cos.median().item()  # half the answers each way
    method.config = method.config.__class__(**{**method.config.to_dict(), "tau": tau})
    model.scale_state.tau = tau
    got = qa_accuracy(model, qa, batch_size=7, method=method)
    assert got["answer/route_preserve"] == pytest.approx((cos > tau).double().mean().item(), abs=1.0 / len(qa))
    assert 0.3 < got["answer/route_preserve"] < 0.7
    qs = torch.quantile(cos, torch.tensor(QUANTILES, dtype=torch.float64)).tolist()
    for q, want in zip(QUANTILES, qs, strict=True):
        assert got[f"answer/route_score/q{round(100 * q):02d}"] == pytest.approx(want, abs=1e-5)
    assert got["answer/route_score/mean"] == pytest.approx(cos.mean().item(), abs=1e-5)
    assert 0.0 <= got["route_preserve"] <= 1.0  # all tokens, as before


def test_never_target_share_at_the_answer_matches_two_explicit_paths(qa20):
    """answer/never_share_{preserve,adapt}: the share of each path's squared logit norm on rows never a target,
    at the scored position, equals the one computed from the two paths' full logits (the head's new columns
    start at zero, so a fresh model's full logits are the original channels' Z). Nothing is kept without the
    mask of never-target rows, and nothing while training (autograd on)."""
    from scalecl.methods import get_method
    from scalecl.methods.scale import scale_path

    tok, _, qa = qa20
    method = get_method("scale-route", hidden_up=32, ffn_up=32, l_fp=1)
    model = method.apply(model_from_config(tiny_config("gpt_neox", vocab_size=len(tok)), seed=3))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("w12") and p.requires_grad:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    assert not any("never_share" in k for k in qa_accuracy(model, qa, batch_size=7, method=method))
    never = torch.zeros(len(tok), dtype=torch.bool)
    never[torch.randperm(len(tok), generator=g)[: len(tok) // 3]] = True
    model.scale_state.never_rows = never
    model(input_ids=qa.ids[:2])  # a training-like forward (autograd on) keeps nothing
    assert model.scale_state.path_hidden is None
    rows = torch.arange(len(qa))
    got = qa_accuracy(model, qa, batch_size=7, method=method)
    for path in ("preserve", "adapt"):
        with torch.no_grad(), scale_path(model, path):
            z = model(input_ids=qa.ids).logits[rows, qa.prompt_len - 1].double()  # (N, V)
        share = z[:, never].square().sum(-1) / z.square().sum(-1)
        assert got[f"answer/never_share_{path}/mean"] == pytest.approx(share.mean().item(), abs=1e-5)
        assert got[f"answer/never_share_{path}/q50"] == pytest.approx(torch.quantile(share, 0.5).item(), abs=1e-5)
    assert got["answer/never_share_preserve/mean"] != pytest.approx(got["answer/never_share_adapt/mean"], abs=1e-4)
