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


# ---------------------------------------------------------------------------------------------------------
# issue 43: the default device, the chunked loss, the whole model compiled, fixed-shape evaluation, on CUDA


def test_the_default_device_is_this_process_gpu_and_a_run_needs_no_device(tmp_path):
    """pick_device() is cuda:N (torch.cuda.set_device accepts it), and train-bio without --device runs to the end
    on the GPU (it stopped before its first step with 'Expected a torch.device with a specified index')."""
    import json

    from typer.testing import CliRunner

    from scalecl.cli import app
    from scalecl.compute.machine import pick_device

    dev = pick_device()
    assert dev.type == "cuda" and dev.index is not None
    torch.cuda.set_device(dev)
    args = ["train-bio", "--preset", "tiny", "--method", "fft", "--out", str(tmp_path / "o"), "--cache",
            str(tmp_path / "c"), "--checkpoints", str(tmp_path / "k"), "--set", "stage1.steps=4", "--set",
            "stage2.steps=2", "--set", "stage3.steps=2", "--set", "eval.every=2"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output[-3000:]
    (result,) = [json.loads(p.read_text()) for p in (tmp_path / "o").rglob("result.json")]
    assert result["speed"]["peak"]["device"] == torch.cuda.get_device_name(dev)


def _lm_batch(vocab: int, b: int = 8, t: int = 256) -> dict:
    ids = batch(vocab, b, t)
    labels = ids.clone()
    labels[:, : t // 4] = -100  # a prompt without loss
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


@pytest.mark.parametrize("kind, tied", [("neox", False), ("llama", True)])
def test_the_chunked_loss_agrees_in_bf16_and_holds_less(kind, tied):
    """compute.loss=chunked against the model's own loss under bf16 autocast: loss and gradients within bf16
    rounding, and a lower peak (a 32,768-row head over 8 x 256 tokens)."""
    import copy

    from scalecl.compute.loss import ModelLoss, step_loss

    arch, kw = SHAPES[kind]
    model = model_from_config(tiny_config(arch, **(kw | {"vocab_size": 32768, "tie_word_embeddings": tied})),
                              seed=0).cuda()
    plain = copy.deepcopy(model)
    b = {k: v.cuda() for k, v in _lm_batch(32768).items()}
    chunked = step_loss(model, "chunked", torch.device("cuda"))
    chunked.chunk = 256  # 256 positions of logits at a time (a 32,768-row head fits 2,048 in one chunk)
    out = {}
    for name, m, loss in (("model", plain, ModelLoss()), ("chunked", model, chunked)):
        m.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            value = loss(m, loss.host({k: v for k, v in b.items()}))
        value.backward()
        out[name] = (value.item(), {n: p.grad.float() for n, p in m.named_parameters()}, torch.cuda.max_memory_allocated())
    assert out["chunked"][0] == pytest.approx(out["model"][0], rel=1e-2)
    for n, g in out["model"][1].items():
        scale = g.abs().max().item() + 1e-6
        assert (out["chunked"][1][n] - g).abs().max().item() <= 5e-2 * scale, n
    assert out["chunked"][2] < out["model"][2]


@pytest.mark.parametrize("variant, mode", [("fft", "model"), ("route", "model"), ("fft", "graphs")])
def test_the_whole_model_compiled_trains_the_eager_numbers(variant, mode):
    """compute.compile=model (inductor) or graphs (CUDA graphs) against eager, three bf16 steps: the same losses
    within bf16 rounding; the run is not left eager by a compile failure (nor stopped by a replay overwriting a
    loss the loop still holds)."""
    import copy
    from itertools import repeat

    from scalecl.compute.loss import step_loss
    from scalecl.compute.perf import compile_failure, compile_model
    from scalecl.training.loop import Hooks, TrainPlan, train

    torch._dynamo.reset()
    if variant == "fft":
        eager = model_from_config(tiny_config(*SHAPES["neox"][:1], **SHAPES["neox"][1]), seed=0).cuda()
    else:
        _, eager = models("neox", "route", l_fp=2)
    compiled = copy.deepcopy(eager)
    compile_model(compiled, mode)
    b = _lm_batch(eager.config.vocab_size, 4, 128)
    losses = []
    for m in (eager, compiled):
        torch.manual_seed(0)
        plan = TrainPlan(3, OptimConfig(lr=1e-3, schedule="constant"), autocast=torch.bfloat16,
                         loss=step_loss(m, "auto", torch.device("cuda")))
        losses.append(train(m, repeat(b), plan, hooks=Hooks()))
    assert compile_failure(compiled) is None
    assert losses[1] == pytest.approx(losses[0], rel=2e-2)


def test_fixed_shape_evaluation_agrees_on_cuda():
    """The fixed-shape evaluation a compiled model gets equals the length-grouped one (float32, TF32 off)."""
    from scalecl.data.biography import ATTRIBUTES, generate_people, preset, qa_pairs
    from scalecl.data.tokenizer import train_bio_tokenizer
    from scalecl.evaluation.qa import encode_qa, qa_accuracy

    people = generate_people(preset("tiny"))
    tok = train_bio_tokenizer(people)
    pairs = qa_pairs(people, 0, 40)
    qa = encode_qa(tok, pairs.prompts, pairs.answers, pairs.attributes, ATTRIBUTES)
    model = model_from_config(tiny_config("gpt_neox", vocab_size=len(tok)), seed=3).cuda()
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        grouped = qa_accuracy(model, qa, batch_size=64, exact=True)
        fixed = qa_accuracy(model, qa, batch_size=64, exact=True, fast="fixed")
    finally:
        torch.set_float32_matmul_precision(precision)
    assert fixed["acc"] == grouped["acc"] and fixed["exact_match"] == grouped["exact_match"]
    assert fixed["soft_acc"] == pytest.approx(grouped["soft_acc"], abs=1e-5)
