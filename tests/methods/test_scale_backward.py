"""The widened linears' hand-written backward against plain autograd over the concatenated matrices.

`_BlockLinear` skips the gradients of frozen blocks and of input channels that no trainable parameter
reaches. Every gradient the optimizer sees must still equal what autograd gives for the same forward built
from `full_weight()` and F.linear (the obvious implementation, written here as the reference). Checked in
float64 on every architecture case and variant, with every trainable tensor randomised so no block is zero.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F

from scalecl import ScaleConfig, scale_path, upscale
from scalecl.modeling.scale_layers import UpHead, UpLinear
from tests.conftest import make_base, random_batch, split_threshold

HU, FU = 32, 24
TOL = dict(rtol=1e-6, atol=1e-10)


def _reference_linear(self: UpLinear, x: torch.Tensor) -> torch.Tensor:
    st, b = self.state, self.full_bias()
    if st.mode == "route" and self.fork:
        xp, xa = x.chunk(2, dim=0)
        return torch.cat([F.linear(xp, self.full_weight(False), b), F.linear(xa, self.full_weight(), b)])
    return F.linear(x, self.full_weight(st.mode != "preserve"), b)


def _reference_head(self: UpHead, h: torch.Tensor) -> torch.Tensor:
    if self.state.mode != "route":
        return F.linear(h, torch.cat([self.weight, self.weight_up], dim=1))
    z, z_up = F.linear(h[..., : self.d], self.weight), F.linear(h[..., self.d :], self.weight_up)
    (zp, za), (zp_up, za_up) = z.chunk(2), z_up.chunk(2)
    keep = F.cosine_similarity(zp, za, dim=-1) > self.state.tau
    return torch.where(keep.unsqueeze(-1), (zp + za) / 2 + zp_up, za + za_up)


@contextmanager
def reference_autograd(monkeypatch):
    with monkeypatch.context() as mp:
        mp.setattr(UpLinear, "forward", _reference_linear)
        mp.setattr(UpHead, "forward", _reference_head)
        yield


def scaled64(case: str, variant: str, l_fp: int | None = 1, **kw):
    base = make_base(case).double()
    m = upscale(base, ScaleConfig(variant=variant, hidden_up=HU, ffn_up=FU, l_fp=l_fp, **kw))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in m.parameters():
            if p.requires_grad:  # no block left at its zero/identity init
                p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


def split_tau(m, ids) -> float:
    """A Route threshold that sends some tokens to each path."""
    d = m.config.hidden_size - HU
    head = m.get_output_embeddings()
    with torch.no_grad():
        with scale_path(m, "preserve"):
            hp = m(ids, output_hidden_states=True).hidden_states[-1][..., :d]
        with scale_path(m, "adapt"):
            ha = m(ids, output_hidden_states=True).hidden_states[-1][..., :d]
    return split_threshold(F.cosine_similarity(hp @ head.weight.T, ha @ head.weight.T, dim=-1))


def gradients(m, ids, **kw) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    m.zero_grad(set_to_none=True)
    loss = m(ids, labels=ids, **kw).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad}


def assert_same_gradients(m, monkeypatch, ids, **kw):
    loss, got = gradients(m, ids, **kw)
    with reference_autograd(monkeypatch):
        ref_loss, want = gradients(m, ids, **kw)
    torch.testing.assert_close(loss, ref_loss, **TOL)
    assert got.keys() == want.keys()
    for n in want:
        torch.testing.assert_close(got[n], want[n], **TOL, msg=lambda s, n=n: f"{n}: {s}")
    return got


@pytest.mark.parametrize("variant", ["preserve", "adapt", "route"])
def test_gradients_equal_plain_autograd(arch_case, variant, monkeypatch):
    m = scaled64(arch_case, variant, l_fp=None if variant == "preserve" else 1)
    ids = random_batch(m.config.vocab_size, seed=3)
    if variant == "route":
        m.scale_state.tau = split_tau(m, ids)
    got = assert_same_gradients(m, monkeypatch, ids)
    n_layers = m.config.num_hidden_layers
    st = m.scale_state
    assert st.const_preserve == n_layers + 1  # every original channel is constant on the preserve path ...
    assert st.const_adapt == (n_layers + 1 if variant == "preserve" else 1)  # ... and below l_fp on adapt
    assert all(g.abs().max() > 0 for n, g in got.items() if not n.endswith("w12")), "some block got no gradient"
    if variant == "route":
        assert 0.0 < st.preserve_mask.float().mean().item() < 1.0


@pytest.mark.parametrize("collab", [("attn",), ("mlp",)])
def test_gradients_equal_plain_autograd_one_collab_module(collab, monkeypatch):
    for variant in ("adapt", "route"):
        m = scaled64("neox-sequential", variant, l_fp=1, collab=collab)
        ids = random_batch(m.config.vocab_size, seed=4)
        if variant == "route":
            m.scale_state.tau = split_tau(m, ids)
        assert_same_gradients(m, monkeypatch, ids)


def test_unfrozen_pretrained_tensor_gets_the_full_backward(arch_case, monkeypatch):
    """Train a pre-trained tensor of layer 0: nothing above it is constant any more, and its gradient is right."""
    m = scaled64(arch_case, "route", l_fp=2)
    lin = next(mod for mod in m.modules() if isinstance(mod, UpLinear))
    lin.weight.requires_grad_(True)
    if lin.bias is not None:
        lin.bias.requires_grad_(True)
    ids = random_batch(m.config.vocab_size, seed=6)
    m.scale_state.tau = split_tau(m, ids)
    got = assert_same_gradients(m, monkeypatch, ids)
    assert m.scale_state.const_preserve == 0 and m.scale_state.const_adapt == 0
    assert got[next(n for n, p in m.named_parameters() if p is lin.weight)].abs().max() > 0


def test_input_embeddings_that_require_grad_get_their_gradient(monkeypatch):
    m = scaled64("llama-gqa-untied", "adapt", l_fp=2)
    ids = random_batch(m.config.vocab_size, seed=8)
    grads = []
    for ctx in (None, reference_autograd(monkeypatch)):
        emb = m.get_input_embeddings()(ids).detach().requires_grad_(True)
        if ctx is None:
            m(inputs_embeds=emb, labels=ids).loss.backward()
        else:
            with ctx:
                m(inputs_embeds=emb, labels=ids).loss.backward()
        grads.append(emb.grad)
    assert m.scale_state.const_adapt == 0
    assert grads[0][..., : m.config.hidden_size - HU].abs().max() > 0
    torch.testing.assert_close(grads[0], grads[1], **TOL)


def test_frozen_embedding_input_gradient_is_skipped_not_wrong():
    """With everything pre-trained frozen, the original channels below l_fp carry no gradient at all."""
    m = scaled64("llama-gqa-untied", "adapt", l_fp=2)
    ids = random_batch(m.config.vocab_size, seed=9)
    seen = []
    layer0 = m.model.layers[0]
    layer0.register_full_backward_hook(lambda mod, gin, gout: seen.append(gout[0].detach()))
    m(ids, labels=ids).loss.backward()
    d = m.config.hidden_size - HU
    assert m.scale_state.const_adapt == 2
    assert seen and seen[0][..., d:].abs().max() > 0  # the new channels do carry gradient down to layer 0


def test_autocast_bf16_matches_plain_autograd(monkeypatch):
    """Under CPU autocast the operands are cast like F.linear's; gradients arrive in the parameters' dtype."""
    m = scaled64("neox-parallel", "route", l_fp=1).float()
    ids = random_batch(m.config.vocab_size, seed=10)
    out = []
    for ctx in (None, reference_autograd(monkeypatch)):
        m.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if ctx is None:
                loss = m(ids, labels=ids).loss
            else:
                with ctx:
                    loss = m(ids, labels=ids).loss
        loss.backward()
        out.append({n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad})
    for n, g in out[0].items():
        assert g.dtype == torch.float32, n
        rel = (g - out[1][n]).norm() / out[1][n].norm().clamp_min(1e-12)
        assert rel < 0.05, f"{n}: relative gradient difference {rel:.3g} under bf16 autocast"


def test_activation_checkpointing_gives_the_same_gradients():
    """Blocks recomputed in the backward (transformers' activation checkpointing) give the same gradients,
    Route's doubled batch included: the fork hook runs outside the checkpointed forward."""
    m = scaled64("llama-gqa-untied", "route", l_fp=1)
    ids = random_batch(m.config.vocab_size, seed=12)
    m.scale_state.tau = split_tau(m, ids)
    m.train()
    _, plain = gradients(m, ids, use_cache=False)
    m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    runs = []
    m.model.layers[2].mlp.register_forward_pre_hook(lambda mod, args: runs.append(args[0].shape[0]))
    _, ckpt = gradients(m, ids, use_cache=False)
    assert runs == [2 * ids.shape[0]] * 2  # forked block: run on the doubled batch, then recomputed
    for n in plain:
        torch.testing.assert_close(ckpt[n], plain[n], **TOL, msg=lambda s, n=n: f"{n}: {s}")
