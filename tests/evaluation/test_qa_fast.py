"""The fast first-token evaluation (length groups, prompt-only inputs, head at the scored position,
inference_mode) gives the numbers of the plain one (batches in order, padded, logits at every position) for
every method on both architectures, including Route's per-token and per-answer mechanism metrics."""

from __future__ import annotations

import pytest
import torch

from scalecl.data.biography import generate_people, preset, qa_pairs
from scalecl.evaluation.qa import eval_batches, qa_accuracy, qa_train_batch
from scalecl.methods import get_method
from scalecl.models.build import model_from_config, tiny_config
from tests.conftest import method_cases

METHODS = method_cases(l_fp=1, llama_pro={"n": 1})  # the shared case table (tests/conftest.py)
# Hard accuracy and exact match are counts: equal. Float numbers (soft accuracy, Route's routing fractions,
# router scores, never-target shares) may differ in float32's last bits: an unpadded batch runs SDPA's causal
# kernel where a padded one runs the masked kernel, and per-token fractions are summed in another order. The
# largest difference seen here is 1.4e-6, on a router cosine of these deliberately scrambled models (plain
# batches of 7, 64 and 240 rows differ among themselves by up to 3e-8). Real runs record 6 digits.
ATOL = 2e-6
COUNTS = ("acc", "exact_match")


def _model(arch: str, name: str, vocab: int):
    """A tiny model with the method applied and every trainable tensor moved off its initialisation, so
    the methods' new parts (LoRA's B, SCALE's W12 and new columns) change the outputs."""
    torch.manual_seed(0)
    method = get_method(name, **METHODS[name])
    model = method.apply(model_from_config(tiny_config(arch, vocab_size=vocab), seed=3))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return method, model


def _same(fast: dict[str, float], plain: dict[str, float]) -> None:
    assert fast.keys() == plain.keys()
    for k, v in plain.items():
        if k.split("/")[0] in COUNTS:
            assert fast[k] == v, k
        else:
            assert fast[k] == pytest.approx(v, abs=ATOL, rel=0), k


@pytest.mark.parametrize("arch", ["gpt_neox", "llama"])
@pytest.mark.parametrize("name", list(METHODS))
def test_fast_equals_plain(tiny_qa, arch, name):
    tok, qa = tiny_qa
    method, model = _model(arch, name, len(tok))
    if name == "scale-route":  # both paths taken, and the never-target shares measured
        first = qa_accuracy(model, qa, batch_size=64, method=method, fast=False)
        model.scale_state.tau = first["answer/route_score/q50"]
        never = torch.zeros(len(tok), dtype=torch.bool)
        never[torch.randperm(len(tok), generator=torch.Generator().manual_seed(2))[: len(tok) // 3]] = True
        model.scale_state.never_rows = never
    for batch, kw in ((64, {"method": method}), (7, {"method": method}), (50, {"exact": True})):
        plain = qa_accuracy(model, qa, batch_size=batch, fast=False, **kw)
        fast = qa_accuracy(model, qa, batch_size=batch, **kw)
        _same(fast, plain)
        if batch != 7:  # fixed shapes (compiled models): padded rows and tokens
            _same(qa_accuracy(model, qa, batch_size=batch, fast="fixed", **kw), plain)
    if name == "scale-route":
        got = qa_accuracy(model, qa, batch_size=64, method=method)
        assert 0.2 < got["answer/route_preserve"] < 0.8
        assert {"route_preserve", "answer/route_preserve", "answer/never_share_adapt/mean"} <= got.keys()
        assert 0.0 < got["route_preserve"] < 1.0


def test_accuracy_is_not_trivial(tiny_qa):
    """The comparison above would hold for a constant metric too: here the fast path sees a model that knows
    some answers (the targets planted as the argmax) and one that does not."""
    tok, qa = tiny_qa
    _, model = _model("gpt_neox", "fft", len(tok))
    base = qa_accuracy(model, qa, batch_size=32)
    head = model.get_output_embeddings()
    target = qa.ids[torch.arange(len(qa)), qa.prompt_len]
    with torch.no_grad():
        head.bias = torch.nn.Parameter(torch.zeros(len(tok))) if head.bias is None else head.bias
        head.bias[target.unique()] = 1e4 * (torch.arange(len(target.unique())) == 0).float()
    planted = qa_accuracy(model, qa, batch_size=32)
    want = (target == target.unique()[0]).float().mean().item()
    assert planted["acc"] == pytest.approx(want) and planted["acc"] != base["acc"]
    _same(planted, qa_accuracy(model, qa, batch_size=32, fast=False))


def test_routed_model_trains_after_fast_evaluation(tiny_qa):
    """inference_mode leaves nothing behind that a later training step cannot use (Route's cached Gram
    matrix is first built inside an evaluation)."""
    tok, qa = tiny_qa
    method, model = _model("llama", "scale-route", len(tok))
    qa_accuracy(model, qa, batch_size=64, method=method)
    model.train()
    loss = model(**qa_train_batch(qa, torch.arange(8))).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert any(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_eval_batches_are_built_once_and_unpadded(tiny_qa):
    _, qa = tiny_qa
    plan = eval_batches(qa, 32, whole=False)
    assert plan is eval_batches(qa, 32, whole=False)  # kept on the set: built once per run
    assert sorted(torch.cat([b.rows for b in plan]).tolist()) == list(range(len(qa)))
    for b in plan:
        assert (b.prompt_len == b.ids.shape[1]).all() and len(b.rows) <= 32
    for b in eval_batches(qa, 32, whole=True):
        assert (b.total_len == b.ids.shape[1]).all()
        assert torch.equal(b.ids, qa.ids[b.rows, : b.ids.shape[1]])


def test_fixed_shape_evaluation_runs_one_shape(tiny_qa):
    """fast="fixed" (where the model is compiled): every forward is batch x fixed_width(qa), whatever the lengths
    and however many rows are left, so a compiled model compiles once."""
    from scalecl.evaluation.qa import fixed_width

    tok, qa = tiny_qa
    method, model = _model("llama", "scale-route", len(tok))
    shapes = []
    model.register_forward_pre_hook(lambda m, args, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    for kw in ({"method": method}, {"exact": True}, {}):
        qa_accuracy(model, qa, batch_size=64, fast="fixed", **kw)  # 240 rows: 3 batches of 64 and one of 48
    width = fixed_width(qa)
    assert width % 16 == 0 and width >= qa.ids.shape[1]
    assert set(shapes) == {(64, width)} and len(shapes) >= 12
    shapes.clear()
    model.compile(backend="eager")  # a compiled model gets the fixed shapes by default
    qa_accuracy(model, qa, batch_size=64, method=method)
    assert set(shapes) == {(64, width)}


def test_compiled_training_batches_keep_the_sets_width(tiny_qa):
    """qa_batches(whole_width=True), what a compiled stage trains on: every batch is the set's width (one shape),
    with the same rows, tokens and labels as the batch cut to its longest row, the rest padding (masked,
    unlabelled); a model's loss on it is the same to float32 rounding."""
    from itertools import islice

    from scalecl.evaluation.qa import qa_batches

    tok, qa = tiny_qa
    cut, whole = (list(islice(qa_batches(qa, 2, seed=5, whole_width=w), 40)) for w in (False, True))
    assert {b["input_ids"].shape for b in whole} == {(2, qa.ids.shape[1])}
    assert len({b["input_ids"].shape[1] for b in cut}) > 1  # cut batches vary: a compiled model would recompile
    _, model = _model("llama", "fft", len(tok))
    for c, w in zip(cut, whole, strict=True):
        t = c["input_ids"].shape[1]
        assert all(torch.equal(w[k][:, :t], c[k]) for k in c)
        assert not w["attention_mask"][:, t:].any() and (w["labels"][:, t:] == -100).all()
        with torch.no_grad():
            assert model(**w).loss.item() == pytest.approx(model(**c).loss.item(), rel=1e-5)


def test_encode_qa_equals_tokenising_each_string(tiny_qa):
    """The batched encoding (distinct answers once, numpy fill) gives the ids of tokenising every prompt and
    answer by itself through the tokenizer's Python interface."""
    tok, qa = tiny_qa
    pairs = qa_pairs(generate_people(preset("tiny")), 0, 40)
    seqs = [tok(p, add_special_tokens=False)["input_ids"] + tok(a, add_special_tokens=False)["input_ids"]
            + [tok.eos_token_id] for p, a in zip(pairs.prompts, pairs.answers, strict=True)]
    assert qa.ids.shape == (len(seqs), max(map(len, seqs)))
    for i, s in enumerate(seqs):
        assert qa.ids[i, : len(s)].tolist() == s and (qa.ids[i, len(s):] == tok.pad_token_id).all()
        assert qa.total_len[i] == len(s)
        assert qa.prompt_len[i] == len(tok(pairs.prompts[i], add_special_tokens=False)["input_ids"])


def test_cached_encoding_reads_back_what_it_encoded(tiny_qa, tmp_path):
    """The pre-training encoding cache: a miss encodes (rendering the texts) and writes; a hit reads the same ids
    without rendering; a damaged entry is one error naming it."""
    from scalecl.common.errors import ScaleclError
    from scalecl.data.tokenizer import cached_encoding, encode_plain

    tok, _ = tiny_qa
    texts = [" Ann Lee was born in Paris.", " Bo Chan works for Acme.", ""]
    folder = tmp_path / "encoded-x"
    first = cached_encoding(tok, lambda: texts, folder)
    want = encode_plain(tok, texts)
    assert [d.tolist() for d in first] == want and (folder / "ids.npy").exists()
    again = cached_encoding(tok, lambda: pytest.fail("a hit renders nothing"), folder)
    assert [d.tolist() for d in again] == want
    (folder / "offsets.npy").write_bytes(b"junk")
    with pytest.raises(ScaleclError, match="encoded-x"):
        cached_encoding(tok, lambda: texts, folder)


def test_bench_trainer_runs_the_same_computation_on_both_sides(tmp_path):
    """benchmarks/bench_trainer.py (stage-1 case, 3 steps): the suite's loop and transformers.Trainer see the
    same batches, weights and optimizer, so their losses agree; timings are not asserted."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_trainer.py"
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(script), "--cases", "stage1", "--blocks", "1", "--steps", "3", "--json",
                    str(out)], check=True, capture_output=True, text=True, cwd=tmp_path)
    case = json.loads(out.read_text())["cases"]["stage1"]
    assert case["max_loss_difference"] < 1e-4
    assert case["tokens_per_step"] == 8 * 128 and len(case["paired_ratios"]) == 1
