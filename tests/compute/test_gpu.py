"""SCALE's guarantees on a CUDA device, in the precisions a GPU run uses (pytest -m gpu; skipped without CUDA).

- Preservation in bf16 (autocast): the original channels of every preserved layer, and the logits, are
  bit-identical to the base model's (torch.equal): the block products compute exactly the base's products.
- Route equals two separate passes (preserve, adapt) combined by Eq. 5: to 1e-5 in float32 (TF32 off), and
  within bf16 rounding (2e-2) under bf16 autocast, where the doubled batch may pick other GEMM kernels.
- One fused-AdamW training step under bf16 autocast leaves every frozen tensor bit-identical.

benchmarks/gpu_check.sh runs these first.
"""

from __future__ import annotations

import pytest
import torch

from scalecl import ScaleConfig, scale_path, upscale
from scalecl.models.build import model_from_config, tiny_config
from scalecl.training.loop import OptimConfig, make_optimizer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# realistic enough for the GEMM kernels a GPU picks: d=512, 4 layers, head_dim 64
SHAPES = {
    "neox": ("gpt_neox", dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048,
                              vocab_size=4096, max_position_embeddings=512)),
    "llama": ("llama", dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                            intermediate_size=1536, vocab_size=4096, max_position_embeddings=512)),
}
HU, FU = 128, 128  # 2 new heads of 64 (Llama: one KV head, GQA group 2)


def models(kind: str, variant: str, l_fp: int | None = None):
    arch, kw = SHAPES[kind]
    base = model_from_config(tiny_config(arch, **kw), seed=0).cuda()
    wide = upscale(base, ScaleConfig(variant=variant, hidden_up=HU, ffn_up=FU, l_fp=l_fp)).cuda()
    return base, wide


def batch(vocab: int, b: int = 4, t: int = 256) -> torch.Tensor:
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(0)).cuda()


@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize("variant", ["preserve", "adapt", "route"])
def test_bf16_preservation_is_bit_identical(kind, variant, monkeypatch):
    monkeypatch.setenv("SCALECL_SCALE_PRODUCTS", "blocks")
    base, wide = models(kind, variant, None if variant == "preserve" else 2)
    d, ids = base.config.hidden_size, batch(base.config.vocab_size)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        hb = base(ids, output_hidden_states=True)
        path = scale_path(wide, "preserve") if variant == "route" else scale_path(wide, "adapt")
        with path:  # Route's preserve path; Adapt and Preserve as they run (W12 zero at init)
            hw = wide(ids, output_hidden_states=True)
    for i, (a, b) in enumerate(zip(hw.hidden_states, hb.hidden_states, strict=True)):
        assert torch.equal(a[..., :d], b), f"layer output {i}: max diff {(a[..., :d] - b).abs().max().item()}"
    assert torch.equal(hw.logits, hb.logits)


def _route_check(wide, ids, tol: dict, autocast: bool) -> float:
    """Route's logits against Eq. 5 applied to two separate passes; returns the fraction routed to preserve."""
    d = wide.config.hidden_size - HU
    head = wide.get_output_embeddings()
    ctx = torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast)
    with torch.no_grad(), ctx:
        with scale_path(wide, "preserve"):
            hp = wide(ids, output_hidden_states=True).hidden_states[-1].float()
        with scale_path(wide, "adapt"):
            ha = wide(ids, output_hidden_states=True).hidden_states[-1].float()
        w, wu = head.weight.float(), head.weight_up.float()
        zp, za = hp[..., :d] @ w.T, ha[..., :d] @ w.T
        cos = torch.nn.functional.cosine_similarity(zp, za, dim=-1)
        tau = cos.flatten().median().item()
        wide.scale_state.tau = tau
        got = wide(ids).logits.float()
    want = torch.where((cos > tau).unsqueeze(-1), (zp + za) / 2 + hp[..., d:] @ wu.T, za + ha[..., d:] @ wu.T)
    clear = (cos - tau).abs() > 1e-2  # tokens whose decision no rounding can flip
    assert clear.float().mean() > 0.5
    torch.testing.assert_close(got[clear], want[clear], **tol)
    return (cos > tau).float().mean().item()


@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize("products", ["blocks", "concat"])
def test_route_equals_two_separate_passes(kind, products, monkeypatch):
    monkeypatch.setenv("SCALECL_SCALE_PRODUCTS", products)
    _, wide = models(kind, "route", l_fp=2)
    with torch.no_grad():  # separate the two paths, as training would
        for m in wide.modules():
            if hasattr(m, "w12") and m.w12.requires_grad:
                m.w12.normal_(0, 0.02)
    ids = batch(wide.config.vocab_size)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        frac = _route_check(wide, ids, dict(rtol=1e-5, atol=1e-5), autocast=False)
    finally:
        torch.set_float32_matmul_precision(precision)
    assert 0.0 < frac < 1.0
    _route_check(wide, ids, dict(rtol=2e-2, atol=2e-2), autocast=True)


@pytest.mark.parametrize("kind", list(SHAPES))
def test_bf16_fused_adamw_step_keeps_frozen_tensors(kind):
    _, wide = models(kind, "route", l_fp=2)
    frozen = {n: p.detach().clone() for n, p in wide.named_parameters() if not p.requires_grad}
    opt, _ = make_optimizer(wide, OptimConfig(lr=1e-2, weight_decay=0.1), 10)
    assert opt.defaults.get("fused") or all(g.get("fused") for g in opt.param_groups)
    ids = batch(wide.config.vocab_size)
    wide.train()
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = wide(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for n, p in wide.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n
