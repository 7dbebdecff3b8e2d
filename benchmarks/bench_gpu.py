"""GPU step measurements (issues 14 and 43): the biography steps at Pythia-160M's shape, SCALE-Route's stage-3 step
against FFT's, our Llama-3.2-1B-shape step against transformers.Trainer's, and block against concatenated products.
Random-init models, no downloads.

Every configuration is trained by scalecl.training.loop.train as a run trains (bf16 autocast, fused AdamW, TF32,
pinned batches, host reads every `--steps` steps), prepared as scalecl.training.fit prepares it (SDPA, compute.compile,
compute.loss: "auto" = the whole model compiled and the chunked loss on CUDA), on one fixed batch: `--steps` warm-up
steps (compiling happens there: their window is `warmup_s`), then `--steps` timed steps whose wall time, divided by
the steps, is the step time (the GPU runs ahead of the host inside a window). Configurations run one after another,
each freed before the next.

    python benchmarks/bench_gpu.py --out gpu_check/bench.json             # on a GPU (~3 minutes)
    python benchmarks/bench_gpu.py --full --out gpu_check/bench.json      # + SCALE at 1B shapes, products (~6 min)
    python benchmarks/bench_gpu.py --tiny --device cpu --out x.json       # every step at toy sizes (dry run)

Targets of issue 43 (printed with the measured value and PASS/FAIL; n/a where a number cannot be had, e.g. CPU):
  Pythia-160M stage-1 step (96 x 512 tokens, 50,304 rows) >= 45% MFU in bf16; the QA step (48 x 32 tokens, the
  stage-2/3 step of FFT) <= 15 ms; SCALE-Route's stage-3 step <= 1.25x FFT's; our 1B-shape FFT step >= 1.2x as fast
  as transformers.Trainer's on the same model and batch.
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
from scalecl.compute.loss import step_loss
from scalecl.compute.machine import pick_device, provenance
from scalecl.compute.perf import (
    compile_failure,
    compile_mode,
    compile_model,
    configure_device,
    ensure_sdpa,
    model_flops,
    peak_tflops,
)
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
# the `gpu` biography preset's SCALE-Route (scalecl/presets/bio_gpu.toml): +128 hidden, +128 FFN, top layer routing
ROUTE_GPU = dict(hidden_up=128, ffn_up=128, l_fp=11)
BACKEND = ["inductor"]  # torch.compile's backend: the dry run on a CPU traces without generating code ("eager")
TARGETS = {  # name: (comparison, bound), issue 43
    "pythia160m_stage1_mfu": (">=", 0.45),
    "qa_step_ms": ("<=", 15.0),
    "route_over_fft_stage3": ("<=", 1.25),
    "ours_over_trainer_speed": (">=", 1.2),  # Trainer's step time / ours
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


def qa_batch(vocab: int, rows: int, seq: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """A QA-shaped batch: rows of 2/3 to all of `seq` real tokens (right-padded), the loss on the last 6 of each
    (answer + EOS), as scalecl.evaluation.qa.qa_train_batch builds them."""
    ids = torch.randint(0, vocab, (rows, seq), generator=g)
    real = torch.randint(2 * seq // 3, seq + 1, (rows,), generator=g)
    pos = torch.arange(seq)[None]
    mask = pos < real[:, None]
    labels = torch.where(mask & (pos >= real[:, None] - 6), ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "attention_mask": mask.long(), "labels": labels}


def our_step(model, batch: dict, steps: int, device: torch.device, autocast, how: tuple[str, str] = ("auto", "auto")
             ) -> dict:
    """Step time of scalecl.training.loop.train, the model prepared as fit prepares it with compute.compile and
    compute.loss `how`: `steps` warm-up steps (compiling included: warmup_s), then `steps` timed in one window."""
    rows: list[dict] = []
    ensure_sdpa(model)
    compile_model(model, compile_mode(how[0], device), backend=BACKEND[0])
    loss = step_loss(model, how[1], device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    oc = OptimConfig(lr=1e-5, schedule="constant", clip=1.0)
    plan = TrainPlan(2 * steps, oc, autocast=autocast, sync_every=steps, loss=loss)
    train(model, repeat(batch), plan, hooks=Hooks(on_log=rows.extend), flops=model_flops(model),
          peak_tflops=peak_tflops(device, autocast)["tflops"])
    timed = rows[steps:]
    step_s = statistics.mean(r["seconds"] for r in timed)
    out = {"step_s": step_s, "step_ms": round(1000 * step_s, 3), "tokens_per_s": timed[-1]["tokens_per_s"],
           "model_tflops": timed[-1]["model_tflops"], "mfu": timed[-1]["mfu"],
           "warmup_s": round(sum(r["seconds"] for r in rows[:steps]), 2),
           "compile": compile_mode(how[0], device), "compile_failed": compile_failure(model),
           "loss": loss.describe(), "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
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
    step_s = (marks[1] - marks[0]) / steps
    return {"step_s": step_s, "step_ms": round(1000 * step_s, 3)}


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
    torch._dynamo.reset()  # each configuration compiles its own model


def verdict(value: float | None, op: str, bound: float) -> str:
    if value is None:
        return "n/a"
    return "PASS" if (value <= bound if op == "<=" else value >= bound) else "FAIL"


def measure(cfgs: dict, name: str, make, batch: dict, a, how=("auto", "auto"), products: str = "blocks") -> None:
    """Train one configuration (our_step), record it under `name`, print one line, free it."""
    if a.only and name not in a.only:
        return
    if how[0] == "graphs" and a.dev.type != "cuda":  # CUDA graphs: nothing to measure elsewhere (the dry run)
        cfgs[name] = {"skipped": "CUDA graphs need a CUDA device"}
        return
    with env("SCALECL_SCALE_PRODUCTS", products):
        t, model = time.perf_counter(), None
        try:
            model = make()
            cfgs[name] = our_step(model, batch, a.steps, a.dev, a.autocast, how) | {"products": products}
        except Exception as e:  # noqa: BLE001 - one configuration's failure is recorded, the others still run
            cfgs[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        c = cfgs[name]
        a.save()  # a check stopped at its time limit keeps what was measured
        print(f"{name:28s} {c.get('step_ms')} ms/step  MFU {c.get('mfu')}  peak {c.get('peak_mem_gib')} GiB  "
              f"warm-up {c.get('warmup_s')} s  {c.get('error', '')} ({time.perf_counter() - t:.0f} s)", flush=True)
        del model
        free(a.dev)


def pythia_configs(cfgs: dict, a, pythia: dict, g: torch.Generator, part: str) -> None:
    """Stage 1 (96 x 512 packed tokens) as a run trains it (compute.compile=auto compiles a 3,500-step stage, the
    chunked loss), and as the issue measured it (eager, the model's own loss); the QA step (48 x 32, stages 2-3) of
    FFT and of the preset's SCALE-Route as a run trains them (auto does not compile a 1,000-step stage), and FFT's
    compiled and as the issue measured it. `part`: "targets", the configurations the targets read (measured first,
    so a check stopped at its time limit has them); "levers", the QA step compiled and as CUDA graphs, FFT's and
    Route's (what the QA and Route targets wait on); "rest", the others."""
    seq = 64 if a.tiny else 512
    ids = torch.randint(0, pythia["vocab_size"], (a.pythia_batch, seq), generator=g)
    s1 = {"input_ids": ids, "labels": ids}
    neox = lambda: build("gpt_neox", pythia, a.dev)  # noqa: E731
    qa = qa_batch(pythia["vocab_size"], a.qa_rows, a.qa_seq, g)
    route = ScaleConfig(variant="route", **(dict(hidden_up=64, ffn_up=32, l_fp=1) if a.tiny else ROUTE_GPU))
    routed = lambda: build("gpt_neox", pythia, a.dev, route)  # noqa: E731
    if part == "targets":
        measure(cfgs, "pythia160m_stage1", neox, s1, a, ("model", "auto"))  # as the preset's stage 1 runs
        measure(cfgs, "qa_fft", neox, qa, a, ("off", "auto"))  # as stages 2-3 run
        measure(cfgs, "qa_route", routed, qa, a, ("off", "auto"))
        return
    if part == "levers":
        measure(cfgs, "qa_fft_compiled", neox, qa, a, ("model", "auto"))
        measure(cfgs, "qa_fft_graphs", neox, qa, a, ("graphs", "auto"))
        measure(cfgs, "qa_route_compiled", routed, qa, a, ("model", "auto"))  # SCALE traced as one graph
        measure(cfgs, "qa_route_graphs", routed, qa, a, ("graphs", "auto"))
        return
    measure(cfgs, "pythia160m_stage1_eager", neox, s1, a, ("off", "model"))
    measure(cfgs, "qa_fft_eager", neox, qa, a, ("off", "model"))
    measure(cfgs, "pythia160m_stage1_compiled_chunked", neox, s1, a, ("model", "chunked"))
    measure(cfgs, "pythia160m_stage1_chunked", neox, s1, a, ("off", "chunked"))
    for extra in a.fused:
        measure(cfgs, f"pythia160m_stage1_{extra}", neox, s1, a, ("model", extra))


def llama_configs(cfgs: dict, res: dict, a, llama: dict, batch: dict, targets_only: bool) -> None:
    """Our FFT step at Llama-3.2-1B shapes (the defaults) against Trainer's (`targets_only`); else our step eager
    with the chunked loss and, with --full, SCALE's Adapt and Route and the products settings as issue 14 measured
    them."""
    L = llama["num_hidden_layers"]

    def scale(variant: str, l_fp: int | None) -> ScaleConfig:
        return ScaleConfig(variant=variant, hidden_up=a.hidden_up, ffn_up=a.ffn_up, l_fp=l_fp, init=("rnd", "zero"))

    base = lambda: build("llama", llama, a.dev)  # noqa: E731
    if targets_only:
        measure(cfgs, "fft_base_shape", base, batch, a, ("model", "auto"))  # as a CPT run of >= 2,000 steps trains
        if not a.skip_trainer and (not a.only or "trainer_fft_base_shape" in a.only):
            trainer(cfgs, res, a, base, batch)
        return
    measure(cfgs, "fft_base_shape_eager_chunked", base, batch, a, ("off", "auto"))
    if a.full:
        measure(cfgs, "fft_same_shape", lambda: build("llama", widened_kw(llama, a.hidden_up, a.ffn_up), a.dev),
                batch, a)
        for name, variant, l_fp, products in (("adapt", "adapt", L - 1, "blocks"), ("route", "route", L - 1, "blocks"),
                                              ("adapt_concat", "adapt", L - 1, "concat"),
                                              ("route_concat", "route", L - 1, "concat"),
                                              ("route_lfp3", "route", min(3, L - 1), "blocks"),
                                              ("adapt_lfp3", "adapt", min(3, L - 1), "blocks")):
            measure(cfgs, name, lambda v=variant, lf=l_fp: build("llama", llama, a.dev, scale(v, lf)), batch, a,
                    products=products)


def trainer(cfgs: dict, res: dict, a, base, batch: dict) -> None:
    """transformers.Trainer's step on the same model and batch (another transformers version may refuse an
    argument: the error is recorded and the other numbers kept)."""
    model = base()
    try:
        with tempfile.TemporaryDirectory() as tmp:  # Trainer wants an output folder; it writes nothing here
            cfgs["trainer_fft_base_shape"] = trainer_step(model, batch, a.steps, a.dev, a.autocast is not None,
                                                          Path(tmp))
        print(f"trainer FFT                  {cfgs['trainer_fft_base_shape']['step_ms']} ms/step", flush=True)
    except Exception as e:  # noqa: BLE001
        res["trainer_error"] = f"{type(e).__name__}: {e}"
        print(f"trainer FFT failed: {res['trainer_error']}", flush=True)
    a.save()
    del model
    free(a.dev)


def summarise(res: dict, show: bool = True) -> None:
    """Ratios and the issue's targets, from the configurations measured so far (`show`: print one line each)."""
    cfgs = res["configs"]

    def step(x: str) -> float | None:
        return cfgs.get(x, {}).get("step_s")

    def ratio(x: str, y: str) -> float | None:
        return round(step(x) / step(y), 3) if step(x) and step(y) else None

    res["ratios"] = {
        "route_over_fft_stage3": ratio("qa_route", "qa_fft"),
        "ours_over_trainer_speed": ratio("trainer_fft_base_shape", "fft_base_shape"),
        "stage1_over_eager": ratio("pythia160m_stage1", "pythia160m_stage1_eager"),
        "stage1_compiled_chunked_over_compiled": ratio("pythia160m_stage1_compiled_chunked", "pythia160m_stage1"),
        "qa_over_issue_eager": ratio("qa_fft", "qa_fft_eager"),
        "qa_compiled_over_qa": ratio("qa_fft_compiled", "qa_fft"),
        "qa_graphs_over_qa": ratio("qa_fft_graphs", "qa_fft"),
        "route_over_fft_compiled": ratio("qa_route_compiled", "qa_fft_compiled"),
        "route_over_fft_graphs": ratio("qa_route_graphs", "qa_fft_graphs"),
        "ours_eager_over_trainer_speed": ratio("trainer_fft_base_shape", "fft_base_shape_eager_chunked"),
        "route_over_adapt": ratio("route", "adapt"),
        "adapt_over_fft_same_shape": ratio("adapt", "fft_same_shape"),
        "route_concat_over_route": ratio("route_concat", "route"),
        "adapt_concat_over_adapt": ratio("adapt_concat", "adapt"),
        "route_over_adapt_lfp3": ratio("route_lfp3", "adapt_lfp3"),
    }
    res["products_faster"] = {k: None if res["ratios"][f"{k}_concat_over_{k}"] is None else
                              "concat" if res["ratios"][f"{k}_concat_over_{k}"] < 1 else "blocks"
                              for k in ("adapt", "route")}
    measured = {"pythia160m_stage1_mfu": cfgs.get("pythia160m_stage1", {}).get("mfu"),
                "qa_step_ms": cfgs.get("qa_fft", {}).get("step_ms"),
                "route_over_fft_stage3": res["ratios"]["route_over_fft_stage3"],
                "ours_over_trainer_speed": res["ratios"]["ours_over_trainer_speed"]}
    if res["device"].startswith("cpu"):  # a CPU's times say nothing about the targets (the dry run)
        measured = dict.fromkeys(measured)
    res["targets"] = {k: {"measured": measured[k], "target": f"{op} {bound}", "verdict": verdict(measured[k], op, bound)}
                      for k, (op, bound) in TARGETS.items()}
    for k, t in res["targets"].items() if show else ():
        print(f"TARGET {k}: measured {t['measured']} (target {t['target']}): {t['verdict']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available)")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (the CPU dry run of gpu_check.sh)")
    ap.add_argument("--full", action="store_true", help="also SCALE at 1B shapes and the products settings")
    ap.add_argument("--steps", type=int, default=10, help="warm-up steps, then as many timed steps")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--hidden-up", type=int, default=256)
    ap.add_argument("--ffn-up", type=int, default=1024)
    ap.add_argument("--pythia-batch", type=int, default=96, help="Pythia-160M stage-1 batch (x 512 tokens)")
    ap.add_argument("--qa-rows", type=int, default=48)
    ap.add_argument("--qa-seq", type=int, default=32)
    ap.add_argument("--fused", default="auto", help="also stage 1 with these fused losses (liger, cce; comma-"
                    "separated); auto: those installed, on CUDA (carried wheels: benchmarks/gpu_wheels.sh)")
    ap.add_argument("--skip-trainer", action="store_true")
    ap.add_argument("--only", default="", help="measure only these configurations (comma-separated names, as in "
                    "bench.json; --full's too), in the bench's order; no preservation check")
    ap.add_argument("--out", required=True, help="JSON file to write")
    a = ap.parse_args()
    a.dev = pick_device(a.device)
    if a.fused == "auto":
        import importlib.util

        a.fused = ",".join(k for k, mod in (("liger", "liger_kernel"), ("cce", "cut_cross_entropy"))
                           if a.dev.type == "cuda" and importlib.util.find_spec(mod) is not None)
    a.fused = [x for x in a.fused.split(",") if x]
    a.only = {x for x in a.only.split(",") if x}
    a.full = a.full or bool(a.only)
    if a.tiny:
        a.seq, a.batch, a.hidden_up, a.ffn_up, a.pythia_batch, a.steps = 32, 2, 128, 64, 4, min(a.steps, 2)
        a.qa_rows, a.qa_seq = 4, 16
        if a.dev.type == "cpu":  # inductor's C++ kernels take minutes to build on a small CPU: trace only
            BACKEND[0] = "eager"
    configure_device(a.dev, tf32=True)
    a.autocast = torch.bfloat16 if a.dev.type == "cuda" else None
    llama, pythia = (LLAMA_TINY, PYTHIA_TINY) if a.tiny else (LLAMA_1B, PYTHIA_160M)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, llama["vocab_size"], (a.batch, a.seq), generator=g)
    res: dict = {"provenance": provenance(), "device": str(a.dev), "settings": {k: str(v) for k, v in vars(a).items()},
                 "peak": peak_tflops(a.dev, a.autocast), "configs": {}}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every configuration, targets included: a bench stopped at its limit keeps them
        summarise(res, show=False)
        Path(a.out).write_text(json.dumps(res, indent=2, default=str) + "\n")

    a.save = save
    batch = {"input_ids": ids, "labels": ids}
    # what the targets read first, then what the QA and Route targets wait on, then the 1B target, then the rest
    pythia_configs(res["configs"], a, pythia, g, "targets")
    pythia_configs(res["configs"], a, pythia, g, "levers")
    llama_configs(res["configs"], res, a, llama, batch, targets_only=True)
    pythia_configs(res["configs"], a, pythia, g, "rest")
    llama_configs(res["configs"], res, a, llama, batch, targets_only=False)
    if not a.only:
        res["preservation_max_abs_diff"] = preservation_diff("llama", llama, a.dev, a.autocast,
                                                             ids[:1, :256].to(a.dev), a.hidden_up, a.ffn_up)
    summarise(res)
    a.save()


if __name__ == "__main__":
    main()
