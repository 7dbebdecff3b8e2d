"""Speed options on CPU (issue #14): what they must not change, and what they report.

- SCALECL_SCALE_PRODUCTS=concat computes what the block products compute (1e-5, fp32), forward and backward;
- models run attention through SDPA, widened ones included, and agree with eager attention (1e-5);
- activation checkpointing and torch.compile (compute.*) train the same numbers as the plain step;
- model FLOPs, peaks and MFU follow the documented definition; the per-step log and result.json carry them;
- bad compute settings are one `error:` line before any work.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from scalecl import get_method, load_model, save_model
from scalecl.cli import app
from scalecl.compute.perf import (
    PEAK_TFLOPS,
    ModelFlops,
    device_kind,
    model_flops,
    peak_tflops,
    sync_every,
)
from scalecl.experiments.config import ComputeConfig
from scalecl.models.build import model_from_config, tiny_config
from scalecl.training.loop import Hooks, OptimConfig, TrainPlan, train
from tests.conftest import local_sets, make_base, random_batch, records, run, split_threshold

TOL = dict(rtol=1e-5, atol=1e-5)


def _widened(case: str, variant: str):
    base = make_base(case)
    hu = 32  # a multiple of head_dim (NeoX 16) and of Llama's GQA group in channels (4 x 8)
    l_fp = None if variant == "preserve" else 1
    return base, get_method(f"scale-{variant}", hidden_up=hu, ffn_up=16, l_fp=l_fp).apply(base)


def _grads(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("variant", ["preserve", "adapt", "route"])
def test_concat_products_equal_block_products(arch_case, variant, monkeypatch):
    base, m = _widened(arch_case, variant)
    ids = random_batch(m.config.vocab_size, seed=5)
    if variant == "route":
        from scalecl.methods.scale import scale_path

        with torch.no_grad(), scale_path(m, "preserve"):
            hp = m(ids, output_hidden_states=True).hidden_states[-1]
        with torch.no_grad(), scale_path(m, "adapt"):
            ha = m(ids, output_hidden_states=True).hidden_states[-1]
        m.scale_state.tau = split_threshold(m.lm_head.logit_cosine(hp[..., :64], ha[..., :64]))
    m.train()
    logits_b, grads_b = _grads(m, ids)
    m.scale_state.products = "concat"  # SCALECL_SCALE_PRODUCTS, as read when a model is built
    logits_c, grads_c = _grads(m, ids)
    torch.testing.assert_close(logits_c, logits_b, **TOL)
    assert grads_c.keys() == grads_b.keys()
    for n in grads_b:
        torch.testing.assert_close(grads_c[n], grads_b[n], **TOL, msg=lambda s, n=n: f"{n}: {s}")
    if variant == "preserve":  # the base function, within the tolerance of a longer summation
        with torch.no_grad():
            torch.testing.assert_close(m.eval()(ids).logits, base(ids).logits, **TOL)


def test_bad_products_setting_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALECL_SCALE_PRODUCTS", "fused")
    res = CliRunner().invoke(app, ["train-cpt", "--preset", "tiny", "--out", str(tmp_path / "o"), "--cache",
                                   str(tmp_path / "c"), "--checkpoints", str(tmp_path / "k")])
    assert res.exit_code == 2 and res.output.startswith("error:") and "SCALECL_SCALE_PRODUCTS" in res.output
    assert not (tmp_path / "c").exists()


def test_sdpa_everywhere_and_widened_models_agree_with_eager(tmp_path):
    for kind in ("gpt_neox", "llama"):
        base = model_from_config(tiny_config(kind))
        assert base.config._attn_implementation == "sdpa"
        m = get_method("scale-route", hidden_up=32, ffn_up=16, l_fp=1).apply(base)
        save_model(m, tmp_path / kind, get_method("scale-route", hidden_up=32, ffn_up=16, l_fp=1))
        loaded = load_model(tmp_path / kind)
        assert m.config._attn_implementation == loaded.config._attn_implementation == "sdpa"
        ids = random_batch(m.config.vocab_size, seed=3)
        mask = torch.ones_like(ids)
        mask[0, -5:] = 0  # right padding: SDPA gets an explicit mask, doubled at Route's fork
        with torch.no_grad():
            sdpa = m(ids, attention_mask=mask).logits
            m.set_attn_implementation("eager")
            eager = m(ids, attention_mask=mask).logits
        torch.testing.assert_close(sdpa[mask.bool()], eager[mask.bool()], **TOL)


@pytest.mark.slow
def test_activation_checkpointing_trains_the_same_numbers(tmp_path, local):
    sets = local_sets(local, "llama", "train.steps=3", "eval.every=3")
    plain = run(tmp_path / "a", sets, ["scale-route", "lora"])
    ckpt = run(tmp_path / "b", [*sets, "compute.activation_checkpointing=true"], ["scale-route", "lora"])
    for a, b in zip(plain, ckpt, strict=True):
        assert b["speed"]["parallel"]["activation_checkpointing"] is True
        assert a["speed"]["parallel"]["activation_checkpointing"] is False
        for x, y in zip(records(tmp_path / "a" / "out", a["method"]), records(tmp_path / "b" / "out", b["method"]),
                        strict=True):
            for key in ("loss", "old/ppl", "new/ppl"):
                assert (x[key] is None and y[key] is None) or y[key] == pytest.approx(x[key], rel=1e-5), key


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("g++") and not shutil.which("c++"), reason="inductor needs a C++ compiler")
@pytest.mark.parametrize("value, mode", [("true", "blocks"), ("model", "model")])
def test_compiled_models_train_the_same_numbers(tmp_path, local, value, mode):
    """compute.compile: every decoder block (true, as before) or the whole model through torch.compile (inductor
    on CPU); same numbers to 1e-4."""
    sets = local_sets(local, "llama", "train.steps=2", "eval.every=2")
    (plain,) = run(tmp_path / "a", sets, ["scale-route"])
    (compiled,) = run(tmp_path / "b", [*sets, f"compute.compile={value}"], ["scale-route"])
    assert compiled["speed"]["parallel"]["compile"] == mode
    for x, y in zip(records(tmp_path / "a" / "out", "scale-route"), records(tmp_path / "b" / "out", "scale-route"),
                    strict=True):
        for key in ("loss", "old/ppl", "new/ppl"):
            assert (x[key] is None and y[key] is None) or y[key] == pytest.approx(x[key], rel=1e-4), key
    model = load_model(compiled["checkpoint"])  # compiled in place: names and checkpoint unchanged
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == compiled["trainable_params"]


def test_model_flops_follow_the_definition():
    cfg = tiny_config("llama", tie_word_embeddings=True)  # V=128, d=64, 3 layers, 8 heads of 8
    m = model_from_config(cfg)
    emb = cfg.vocab_size * cfg.hidden_size
    total = sum(p.numel() for p in m.parameters())  # the tied table counted once
    f = model_flops(m)
    assert f.matmul_params == total - emb + emb  # lookups excluded, the tied head's product included
    assert (f.layers, f.attn_width) == (3, 64)
    assert f.per_token(16) == 6 * f.matmul_params + 12 * 3 * 64 * 16
    untied = model_from_config(tiny_config("llama", tie_word_embeddings=False))
    assert model_flops(untied).matmul_params == sum(p.numel() for p in untied.parameters()) - emb
    wide = get_method("scale-adapt", hidden_up=32, ffn_up=16).apply(untied)
    fw = model_flops(wide)  # the widened shape, zero W12 included; new embedding columns are lookups
    wide_emb = cfg.vocab_size * (cfg.hidden_size + 32)
    assert fw.matmul_params == sum(p.numel() for p in wide.parameters()) - wide_emb
    assert fw.attn_width == 64 + 32
    lora = get_method("lora", rank=4).apply(model_from_config(tiny_config("llama", tie_word_embeddings=False)))
    assert model_flops(lora).matmul_params == sum(p.numel() for p in lora.parameters()) - emb


def test_peaks_and_precision():
    assert device_kind("NVIDIA H100 80GB HBM3") == "H100 SXM"
    assert device_kind("NVIDIA H100 PCIe") == "H100 PCIe" and device_kind("NVIDIA H100 NVL") == "H100 NVL"
    assert device_kind("NVIDIA H200") == "H200" and device_kind("NVIDIA H200 NVL") == "H200 NVL"
    assert device_kind("NVIDIA A100-SXM4-80GB") == "A100" and device_kind("NVIDIA A100 80GB PCIe") == "A100"
    assert device_kind("NVIDIA GeForce RTX 4090") is None and device_kind(None) is None
    assert PEAK_TFLOPS["H100 SXM"]["bf16"] == 989.4 and PEAK_TFLOPS["A100"]["bf16"] == 312.0
    cpu = peak_tflops(torch.device("cpu"), None)
    assert cpu["tflops"] is None and cpu["precision"] == "fp32"
    assert sync_every(ComputeConfig(), torch.device("cpu")) == 1
    assert sync_every(ComputeConfig(), torch.device("cuda")) == 50
    assert sync_every(ComputeConfig(sync_every=7), torch.device("cuda")) == 7


def test_mfu_in_the_step_log():
    m = model_from_config(tiny_config("llama"))
    rows = []
    flops = model_flops(m)
    batches = iter(lambda: {"input_ids": torch.randint(0, 128, (2, 16)), "labels": torch.randint(0, 128, (2, 16))},
                   None)
    train(m, batches, TrainPlan(3, OptimConfig(lr=1e-3), sync_every=2), hooks=Hooks(on_log=rows.extend), flops=flops,
          peak_tflops=0.5)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        want = 32 * flops.per_token(16) / r["seconds"] / 1e12
        assert r["model_tflops"] == pytest.approx(want, rel=1e-3, abs=1e-4)
        assert r["mfu"] == pytest.approx(r["model_tflops"] / 0.5, rel=1e-3, abs=1e-4)
    rows.clear()
    train(m, batches, TrainPlan(1, OptimConfig(lr=1e-3)), hooks=Hooks(on_log=rows.extend), flops=flops, peak_tflops=None)
    assert rows[0]["mfu"] is None and rows[0]["model_tflops"] > 0
    assert ModelFlops(10, 1, 4).to_dict() == {"matmul_params": 10, "layers": 1, "attn_width": 4}


def test_result_records_speed(tmp_path, local):
    (res,) = run(tmp_path, local_sets(local, "llama", "train.steps=2", "eval.every=2"), ["fft"])
    s = res["speed"]
    assert s["steps_timed"] == 2 and s["tokens"] == 2 * 4 * 32 and s["tokens_per_s"] > 0
    assert s["model_flops_per_token"]["definition"].startswith("6N + 12 L H Q T")
    assert s["mfu"] is None and s["peak"]["tflops"] is None  # CPU: no peak
    assert s["parallel"] == {"mode": "single", "processes": 1, "asked": "ddp", "activation_checkpointing": False,
                             "compile": "off", "attention": "sdpa"}  # compute.compile=auto: off on a CPU
    assert s["scale_products"] == "blocks" and s["sync_every"] == 1
    assert s["loss"] == {"name": "model"}  # compute.loss=auto: the model's own on a CPU
    d = next((tmp_path / "out").glob("tiny-fft-*"))
    log = [json.loads(x) for x in (d / "train_log.jsonl").read_text().splitlines()]
    assert all("model_tflops" in r and r["mfu"] is None for r in log)


@pytest.mark.parametrize("sets,msg", [
    (["compute.parallel=zero"], "compute.parallel must be one of ddp, fsdp"),
    (["compute.sync_every=-1"], "compute.sync_every must be >= 0"),
    (["compute.compile=maybe"], "compute.compile must be one of True, False, auto, model, graphs, blocks, off"),
    (["compute.loss=fused"], "compute.loss must be one of auto, model, chunked, liger, cce"),
    (["compute.loss=liger"], "compute.loss=liger needs liger-kernel"),  # not installed here (it needs Triton)
])
def test_bad_compute_settings_are_one_line(tmp_path, sets, msg):
    for cmd in ("train-cpt", "train-bio"):
        res = CliRunner().invoke(app, [cmd, "--preset", "tiny", "--out", str(tmp_path / "o"), "--cache",
                                       str(tmp_path / "c"), *[x for s in sets for x in ("--set", s)]])
        assert res.exit_code == 2 and res.output.startswith("error:") and msg in res.output, res.output
        assert not (tmp_path / "c").exists()


def test_bio_micro_batch_must_divide_and_compile_needs_a_compiler(tmp_path, monkeypatch):
    res = CliRunner().invoke(app, ["train-bio", "--preset", "tiny", "--out", str(tmp_path / "o"), "--cache",
                                   str(tmp_path / "c"), "--set", "compute.micro_batch=3"])
    assert res.exit_code == 2 and "must be a multiple of processes x compute.micro_batch" in res.output, res.output
    monkeypatch.setattr(shutil, "which", lambda name: None)
    res = CliRunner().invoke(app, ["train-bio", "--preset", "tiny", "--out", str(tmp_path / "o"), "--cache",
                                   str(tmp_path / "c"), "--set", "compute.compile=true", "--device", "cpu"])
    assert res.exit_code == 2 and "needs a C++ compiler" in res.output, res.output
    assert not (tmp_path / "c").exists()


def test_a_batch_already_on_the_gpu_is_not_pinned():
    """The loop pins host batches on their way to CUDA; a tensor already on a device cannot be pinned (a GPU test
    gave it batches made on the GPU: "cannot pin 'torch.cuda.LongTensor'"). Tensors stand in for CUDA ones."""
    from unittest import mock

    from scalecl.training.loop import _to_device

    cuda = torch.device("cuda", 0)
    on_gpu = mock.Mock(device=cuda)
    on_gpu.pin_memory.side_effect = RuntimeError("cannot pin 'torch.cuda.LongTensor'")
    host = mock.Mock(device=torch.device("cpu"))
    out = _to_device({"input_ids": on_gpu, "labels": host}, cuda)
    on_gpu.to.assert_called_once_with(cuda)
    assert not on_gpu.pin_memory.called and out["input_ids"] is on_gpu.to.return_value
    host.pin_memory.assert_called_once_with()  # a host tensor: pinned, then copied without blocking
    host.pin_memory.return_value.to.assert_called_once_with(cuda, non_blocking=True)
    cpu = torch.arange(3)
    assert _to_device({"x": cpu}, torch.device("cpu"))["x"] is cpu
