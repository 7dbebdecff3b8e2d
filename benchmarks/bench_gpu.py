"""GPU step measurements of issue #14: SCALE's step costs at Llama-3.2-1B shapes, our step against
transformers.Trainer's, MFU, and block against concatenated products. Random-init models, no downloads.

Every configuration is trained by scalecl.training.loop.train (the loop every experiment uses: bf16 autocast,
fused AdamW, TF32, pinned batches, host reads every `--steps` steps) on one fixed batch: `--steps` warm-up
steps, then `--steps` timed steps whose wall time, divided by the steps, is the step time (the GPU runs
ahead of the host inside a window, so this is the device's step time). Configurations run one after
another, each freed before the next (a 1.5B-parameter FFT with its AdamW state takes ~25 GB).

    python benchmarks/bench_gpu.py --out gpu_check/bench.json          # on a GPU (~4 minutes on an H100)
    python benchmarks/bench_gpu.py --tiny --device cpu --out x.json    # every step at toy sizes (dry run)

Targets (printed with the measured value and PASS/FAIL; n/a where a number cannot be had, e.g. on CPU):
  Route / Adapt <= 1.15 and Adapt / FFT-of-the-same-shape <= 1.0 at Llama-3.2-1B shapes (+256/+1024,
  only the top layer collaborating, as bench_scale.py); our FFT step <= transformers.Trainer's on the same
  model and batch; Pythia-160M-shape stage-1 step (96 x 512 tokens) >= 40% MFU in bf16.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from contextlib import contextmanager
from itertools import repeat
from pathlib import Path

import torch

from scalecl import ScaleConfig, upscale
from scalecl.compute.machine import provenance
from scalecl.compute.perf import configure_device, model_flops, peak_tflops
from scalecl.models.build import model_from_config, tiny_config
from scalecl.training.loop import Hooks, OptimConfig, TrainPlan, train

# Llama-3.2-1B: d 2048, 16 layers, 32 heads of 64, 8 KV heads, SwiGLU 8192, vocab 128,256, tied embeddings
LLAMA_1B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=8192, vocab_size=128256, max_position_embeddings=8192, tie_word_embeddings=True,
                head_dim=64, rope_theta=500000.0)
LLAMA_TINY = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  intermediate_size=256, vocab_size=512, max_position_embeddings=256, tie_word_embeddings=True,
                  head_dim=64)
PYTHIA_160M = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                   vocab_size=50304, max_position_embeddings=2048, rotary_pct=0.25, use_parallel_residual=True,
                   tie_word_embeddings=False)
PYTHIA_TINY = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512,
                   vocab_size=512, max_position_embeddings=256, rotary_pct=0.25, tie_word_embeddings=False)
TARGETS = {  # name: (comparison, bound)
    "route_over_adapt": ("<=", 1.15),
    "adapt_over_fft_same_shape": ("<=", 1.0),
    "ours_over_trainer_fft": ("<=", 1.0),
    "pythia160m_stage1_mfu": (">=", 0.40),
}


def widened_kw(kw: dict, hu: int, fu: int) -> dict:
    """The config of a plain model with a SCALE model's widened shapes (FFT of the same shape)."""
    hd = kw["head_dim"]
    group = kw["num_attention_heads"] // kw["num_key_value_heads"]
    return dict(kw, hidden_size=kw["hidden_size"] + hu, num_attention_heads=kw["num_attention_heads"] + hu // hd,
                num_key_value_heads=kw["num_key_value_heads"] + hu // hd // group,
                intermediate_size=kw["intermediate_size"] + fu)


def build(arch: str, kw: dict, device: torch.device, scale: ScaleConfig | None = None):
    with torch.device(device):  # parameters born on the device (no host copy of 1.2B parameters)
        model = model_from_config(tiny_config(arch, **kw), seed=0)
    if scale is not None:
        model = upscale(model, scale, inplace=True)
    return model.to(device)


@contextmanager
def env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def our_step(model, batch: dict, steps: int, device: torch.device, autocast) -> dict:
    """Step time of scalecl.training.loop.train: `steps` warm-up steps, then `steps` timed in one host window."""
    rows: list[dict] = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    oc = OptimConfig(lr=1e-5, schedule="constant", clip=1.0)
    plan = TrainPlan(2 * steps, oc, autocast=autocast, sync_every=steps)
    train(model, repeat(batch), plan, hooks=Hooks(on_log=rows.extend), flops=model_flops(model),
          peak_tflops=peak_tflops(device, autocast)["tflops"])
    timed = rows[steps:]
    out = {"step_s": statistics.mean(r["seconds"] for r in timed), "tokens_per_s": timed[-1]["tokens_per_s"],
           "model_tflops": timed[-1]["model_tflops"], "mfu": timed[-1]["mfu"],
           "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
           "params": sum(p.numel() for p in model.parameters())}
    if device.type == "cuda":
        out["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return out


def trainer_step(model, batch: dict, steps: int, device: torch.device, bf16: bool, out_dir: Path) -> dict:
    """Step time of transformers.Trainer on the same model and batch (fused AdamW, bf16, TF32, clip 1)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Fixed(torch.utils.data.Dataset):  # the batch's rows, as many as the steps read (a sampler shuffles them)
        def __len__(self) -> int:
            return batch["input_ids"].shape[0] * 2 * steps

        def __getitem__(self, i: int) -> dict:
            return {k: v[i % v.shape[0]] for k, v in batch.items()}

    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step in (steps, 2 * steps):
                sync(device)
                marks.append(time.perf_counter())

    args = TrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=batch["input_ids"].shape[0], max_steps=2 * steps,
        learning_rate=1e-5, lr_scheduler_type="constant", bf16=bf16, tf32=device.type == "cuda" or None,
        optim="adamw_torch_fused" if device.type == "cuda" else "adamw_torch", max_grad_norm=1.0,
        logging_strategy="no", save_strategy="no", report_to=[], dataloader_num_workers=0,
        use_cpu=device.type == "cpu", disable_tqdm=True, seed=0,
    )
    Trainer(model=model, args=args, train_dataset=Fixed(), callbacks=[Clock()]).train()
    return {"step_s": (marks[1] - marks[0]) / steps}


def preservation_diff(arch: str, kw: dict, device: torch.device, autocast, ids: torch.Tensor, hu: int, fu: int) -> dict:
    """Max |logits - base logits| of SCALE-Preserve under each products setting (0 = bit-identical)."""
    base = build(arch, kw, device)
    wide = upscale(base, ScaleConfig(variant="preserve", hidden_up=hu, ffn_up=fu, init=("rnd", "zero")))
    out = {}
    with torch.no_grad(), torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
        ref = base(ids).logits.float()
        for mode in ("blocks", "concat"):
            wide.scale_state.products = mode  # SCALECL_SCALE_PRODUCTS is read once, when a model is built
            out[mode] = (wide(ids).logits.float() - ref).abs().max().item()
    del base, wide
    return out


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def verdict(value: float | None, op: str, bound: float) -> str:
    if value is None:
        return "n/a"
    return "PASS" if (value <= bound if op == "<=" else value >= bound) else "FAIL"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (the CPU dry run of gpu_check.sh)")
    ap.add_argument("--steps", type=int, default=10, help="warm-up steps, then as many timed steps")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--hidden-up", type=int, default=256)
    ap.add_argument("--ffn-up", type=int, default=1024)
    ap.add_argument("--pythia-batch", type=int, default=96, help="Pythia-160M stage-1 batch (x 512 tokens)")
    ap.add_argument("--skip-trainer", action="store_true")
    ap.add_argument("--out", required=True, help="JSON file to write")
    a = ap.parse_args()
    device = torch.device(a.device)
    if a.tiny:
        a.seq, a.batch, a.hidden_up, a.ffn_up, a.pythia_batch, a.steps = 32, 2, 128, 64, 4, min(a.steps, 2)
    configure_device(device, tf32=True)
    autocast = torch.bfloat16 if device.type == "cuda" else None
    llama, pythia = (LLAMA_TINY, PYTHIA_TINY) if a.tiny else (LLAMA_1B, PYTHIA_160M)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, llama["vocab_size"], (a.batch, a.seq), generator=g)
    batch = {"input_ids": ids, "labels": ids}
    L = llama["num_hidden_layers"]
    res: dict = {"provenance": provenance(), "device": str(device), "settings": vars(a),
                 "peak": peak_tflops(device, autocast), "configs": {}}
    cfgs = res["configs"]

    def scale(variant: str, l_fp: int | None) -> ScaleConfig:
        return ScaleConfig(variant=variant, hidden_up=a.hidden_up, ffn_up=a.ffn_up, l_fp=l_fp, init=("rnd", "zero"))

    plan = [  # name, products, how to build
        ("fft_same_shape", "blocks", lambda: build("llama", widened_kw(llama, a.hidden_up, a.ffn_up), device)),
        ("adapt", "blocks", lambda: build("llama", llama, device, scale("adapt", L - 1))),
        ("route", "blocks", lambda: build("llama", llama, device, scale("route", L - 1))),
        ("adapt_concat", "concat", lambda: build("llama", llama, device, scale("adapt", L - 1))),
        ("route_concat", "concat", lambda: build("llama", llama, device, scale("route", L - 1))),
        ("route_lfp3", "blocks", lambda: build("llama", llama, device, scale("route", min(3, L - 1)))),
        ("adapt_lfp3", "blocks", lambda: build("llama", llama, device, scale("adapt", min(3, L - 1)))),
        ("fft_base_shape", "blocks", lambda: build("llama", llama, device)),
    ]
    for name, products, make in plan:
        with env("SCALECL_SCALE_PRODUCTS", products):
            t = time.perf_counter()
            model = make()
            cfgs[name] = our_step(model, batch, a.steps, device, autocast) | {"products": products}
            print(f"{name:16s} {cfgs[name]['step_s']:.4f} s/step  MFU {cfgs[name]['mfu']}  "
                  f"({time.perf_counter() - t:.0f} s)", flush=True)
            del model
            free(device)
    if not a.skip_trainer:
        model = build("llama", llama, device)
        try:  # another transformers version may refuse an argument: record it, keep the other numbers
            with tempfile.TemporaryDirectory() as tmp:  # Trainer wants an output folder; it writes nothing here
                cfgs["trainer_fft_base_shape"] = trainer_step(model, batch, a.steps, device, autocast is not None,
                                                              Path(tmp))
            print(f"trainer FFT      {cfgs['trainer_fft_base_shape']['step_s']:.4f} s/step", flush=True)
        except Exception as e:  # noqa: BLE001
            res["trainer_error"] = f"{type(e).__name__}: {e}"
            print(f"trainer FFT failed: {res['trainer_error']}", flush=True)
        del model
        free(device)
    p_ids = torch.randint(0, pythia["vocab_size"], (a.pythia_batch, 512 if not a.tiny else 64), generator=g)
    model = build("gpt_neox", pythia, device)
    cfgs["pythia160m_stage1"] = our_step(model, {"input_ids": p_ids, "labels": p_ids}, a.steps, device, autocast)
    print(f"pythia stage 1   {cfgs['pythia160m_stage1']['step_s']:.4f} s/step  MFU {cfgs['pythia160m_stage1']['mfu']}",
          flush=True)
    del model
    free(device)
    res["preservation_max_abs_diff"] = preservation_diff("llama", llama, device, autocast, ids[:1, :256].to(device),
                                                         a.hidden_up, a.ffn_up)
    free(device)

    def ratio(x: str, y: str) -> float | None:
        return round(cfgs[x]["step_s"] / cfgs[y]["step_s"], 3) if x in cfgs and y in cfgs else None

    res["ratios"] = {
        "route_over_adapt": ratio("route", "adapt"),
        "adapt_over_fft_same_shape": ratio("adapt", "fft_same_shape"),
        "ours_over_trainer_fft": ratio("fft_base_shape", "trainer_fft_base_shape"),
        "route_concat_over_route": ratio("route_concat", "route"),
        "adapt_concat_over_adapt": ratio("adapt_concat", "adapt"),
        "route_over_adapt_lfp3": ratio("route_lfp3", "adapt_lfp3"),
    }
    faster = {}
    for k in ("adapt", "route"):
        r = res["ratios"][f"{k}_concat_over_{k}"]
        faster[k] = None if r is None else "concat" if r < 1 else "blocks"
    res["products_faster"] = faster
    measured = dict(res["ratios"], pythia160m_stage1_mfu=cfgs["pythia160m_stage1"]["mfu"])
    res["targets"] = {k: {"measured": measured[k], "target": f"{op} {bound}", "verdict": verdict(measured[k], op, bound)}
                      for k, (op, bound) in TARGETS.items()}
    for k, t in res["targets"].items():
        print(f"TARGET {k}: measured {t['measured']} (target {t['target']}): {t['verdict']}", flush=True)
    print(f"products: faster on this device: {faster}; preservation max |diff| {res['preservation_max_abs_diff']}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
