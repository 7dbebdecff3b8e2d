"""The chunked linear cross-entropy (compute.loss, scalecl.compute.loss) equals the model's own loss.

- float32: loss and every gradient equal plain cross-entropy to 1e-5, with labels of -100 (prompt and padding),
  chunks that do not divide the positions, a head bias, and a head tied to the embedding;
- bf16 autocast (on the CPU here): within bf16 rounding of the model's own loss and gradients;
- where it cannot apply (SCALE's head, FSDP) the model's own loss runs; on a CPU "auto" is the model's own loss.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from scalecl.compute.loss import (
    HeadLoss,
    ModelLoss,
    chunk_positions,
    linear_cross_entropy,
    resolve_loss,
    select_labelled,
    step_loss,
)
from scalecl.compute.perf import compile_model, whole_model_compiled
from scalecl.models.build import model_from_config, tiny_config
from tests.conftest import ARCH_CASES, make_base, method_cases

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 7, 64, None])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_cross_entropy_equals_plain_cross_entropy(chunk, bias):
    g = torch.Generator().manual_seed(0)
    n, d, v = 50, 16, 97
    h = torch.randn(n, d, generator=g, requires_grad=True)
    w = (torch.randn(v, d, generator=g) * 0.3).requires_grad_()
    b = torch.randn(v, generator=g).requires_grad_() if bias else None
    y = torch.randint(0, v, (n,), generator=g)
    want = F.cross_entropy(F.linear(h, w, b), y)
    want_grads = torch.autograd.grad(want * 3, [t for t in (h, w, b) if t is not None])
    got = linear_cross_entropy(h, w, b, y, chunk)
    got_grads = torch.autograd.grad(got * 3, [t for t in (h, w, b) if t is not None])  # a scaled loss (accumulation)
    torch.testing.assert_close(got, want, **TOL)
    for a, e in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, e, **TOL)
    with torch.no_grad():  # no gradient wanted: the loss alone
        torch.testing.assert_close(linear_cross_entropy(h, w, b, y, chunk), want.detach(), **TOL)


def test_only_the_wanted_gradients_are_made():
    h = torch.randn(8, 4, requires_grad=True)
    w = torch.randn(11, 4)  # a frozen head
    y = torch.randint(0, 11, (8,))
    loss = linear_cross_entropy(h, w, None, y, 3)
    loss.backward()
    torch.testing.assert_close(h.grad, torch.autograd.grad(F.cross_entropy(h @ w.t(), y), h)[0], **TOL)
    assert w.grad is None


def test_select_labelled_is_the_shifted_ignore_index_mask():
    labels = torch.tensor([[-100, -100, 5, 6, -100], [1, 2, -100, 3, 4]])
    rows, targets = select_labelled(labels)
    flat = F.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)  # position t predicts label t + 1
    keep = (flat != -100).nonzero().flatten()
    assert rows.tolist() == keep.tolist() and targets.tolist() == flat[keep].tolist()


def _labels(ids: torch.Tensor) -> torch.Tensor:
    """QA-like labels: -100 on a prompt of 5 tokens and on each row's padding."""
    labels = ids.clone()
    labels[:, :5] = -100
    labels[0, 12:] = -100
    labels[2, 9:] = -100
    return labels


def _loss_and_grads(model, loss, batch):
    model.zero_grad(set_to_none=True)
    value = loss(model, loss.host(dict(batch)))
    value.backward()
    return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("case", list(ARCH_CASES))
def test_the_step_loss_equals_the_models_own_loss_and_gradients(case):
    """Untied and tied heads (llama-gqa-tied: the head is the embedding), -100 labels, float32, chunks of 5."""
    model = make_base(case)
    plain = copy.deepcopy(model)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.config.vocab_size, (3, 16), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": _labels(ids)}
    loss = step_loss(model, "chunked", torch.device("cpu"))
    assert isinstance(loss, HeadLoss)
    loss.chunk = 5
    got, got_g = _loss_and_grads(model, loss, batch)
    want, want_g = _loss_and_grads(plain, ModelLoss(), batch)
    torch.testing.assert_close(got, want, **TOL)
    assert got_g.keys() == want_g.keys()
    for n in want_g:
        torch.testing.assert_close(got_g[n], want_g[n], **TOL, msg=n)
    if case == "llama-gqa-tied":
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    # the head is an nn.Linear with the same state: every other forward is unchanged
    assert isinstance(model.get_output_embeddings(), torch.nn.Linear)
    assert model.state_dict().keys() == plain.state_dict().keys()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, plain(ids).logits, rtol=0, atol=0)


def test_bf16_autocast_agrees_within_bf16_rounding():
    model = model_from_config(tiny_config("gpt_neox", vocab_size=256), seed=0)
    plain = copy.deepcopy(model)
    ids = torch.randint(0, 256, (4, 24), generator=torch.Generator().manual_seed(5))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": _labels(ids)}
    loss = step_loss(model, "chunked", torch.device("cpu"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, got_g = _loss_and_grads(model, loss, batch)
        want, want_g = _loss_and_grads(plain, ModelLoss(), batch)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    for n in want_g:  # bf16 products: relative to each gradient's size
        scale = want_g[n].abs().max().item() + 1e-6
        assert (got_g[n] - want_g[n]).abs().max().item() <= 3e-2 * scale, n


def test_where_the_chunked_loss_cannot_apply_the_models_own_runs():
    from scalecl.methods import get_method

    device = torch.device("cpu")
    assert resolve_loss("auto", device) == "model" and resolve_loss("auto", torch.device("cuda", 0)) == "chunked"
    # a whole model compiled keeps its own loss on CUDA (inductor fuses it: 101.6 against 146.5 ms on one H200)
    assert resolve_loss("auto", torch.device("cuda", 0), compiled=True) == "model"
    assert resolve_loss("chunked", torch.device("cuda", 0), compiled=True) == "chunked"  # asked for: kept
    assert isinstance(step_loss(make_base("neox-parallel"), "auto", device), ModelLoss)  # CPU: as before
    cuda = torch.device("cuda", 0)  # only resolves the kind here: nothing runs on it
    assert isinstance(step_loss(make_base("neox-parallel"), "auto", cuda), HeadLoss)  # eager: chunked
    whole, blocks = make_base("neox-parallel"), make_base("neox-parallel")
    compile_model(whole, "model", backend="eager")
    compile_model(blocks, "blocks", backend="eager")
    assert whole_model_compiled(whole) and not whole_model_compiled(blocks)
    assert type(step_loss(whole, "auto", cuda)) is ModelLoss  # the whole model compiled: its own loss
    assert isinstance(step_loss(blocks, "auto", cuda), HeadLoss)  # blocks compiled: the head runs eagerly
    opts = method_cases(l_fp=2)["scale-route"]
    route = get_method("scale-route", **opts).apply(make_base("llama-gqa-untied"))
    assert type(step_loss(route, "chunked", device)) is ModelLoss  # SCALE's head is its own
    lora = get_method("lora", rank=4).apply(make_base("llama-gqa-untied"))
    assert isinstance(step_loss(lora, "chunked", device), HeadLoss)  # through peft's wrapper
    soft = model_from_config(tiny_config("gemma2"), seed=0)  # soft-capped logits: not the head's output
    assert type(step_loss(soft, "chunked", device)) is ModelLoss

    class Averaged(torch.nn.Module):  # a module that does more with the logits than return them (an ensemble)
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def get_output_embeddings(self):
            return self.inner.get_output_embeddings()

    assert type(step_loss(Averaged(make_base("neox-parallel")), "chunked", device)) is ModelLoss


def test_chunk_positions_bound_the_logits_held():
    assert chunk_positions(50304) == (1 << 26) // 50304
    assert chunk_positions(50304) >= 48 * 16  # a QA step's labelled positions (answer + EOS): one chunk
    assert chunk_positions(10**9) == 16
