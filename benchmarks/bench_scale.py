"""Train-step cost of the SCALE variants against full fine-tuning of a plain model of the same shapes.

Targets (issue #2): Route step <= 1.15x the Adapt step when only the top layer collaborates (l_fp = L-1);
Adapt step <= 1.05x the FFT step of a plain model built with the widened config. All configurations are
timed round-robin in one process (so drift hits them alike); in each round a configuration takes --settle
untimed steps and then one timed step, so the timed step runs in the steady state of a training run rather
than right after another model's step. Medians are reported.

    python benchmarks/bench_scale.py --arch llama --reps 11
    python benchmarks/bench_scale.py --arch llama --reps 11 --allocator default

--allocator tuned (the default) applies what the `scalecl` command applies at start-up
(`scalecl.compute.machine.tune_cpu_allocator`); `default` leaves glibc's thresholds alone.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from datetime import UTC, datetime

import torch

from scalecl import ScaleConfig, upscale
from scalecl.compute.machine import tune_cpu_allocator
from scalecl.models.build import model_from_config, tiny_config


def make_models(arch: str, hidden: int, layers: int, vocab: int, hu: int, fu: int):
    head = 64
    heads = hidden // head
    kw = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * hidden,
              vocab_size=vocab, max_position_embeddings=1024)
    wide_kw = dict(kw, hidden_size=hidden + hu, num_attention_heads=heads + hu // head, intermediate_size=4 * hidden + fu)
    if arch == "llama":
        kw.update(num_key_value_heads=heads // 2, tie_word_embeddings=False)  # GQA group of 2
        wide_kw.update(num_key_value_heads=(heads + hu // head) // 2, tie_word_embeddings=False, head_dim=head)
    base = model_from_config(tiny_config(arch, **kw))
    models = {"fft-plain-widened": model_from_config(tiny_config(arch, **wide_kw))}
    for variant in ("preserve", "adapt", "route"):
        l_fp = None if variant == "preserve" else layers - 1  # only the top layer collaborates
        models[variant] = upscale(base, ScaleConfig(variant=variant, hidden_up=hu, ffn_up=fu, l_fp=l_fp))
    return models


def step_fn(model, batch: torch.Tensor):
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)

    def step() -> float:
        t = time.perf_counter()
        loss = model(batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    return step, opt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="llama", choices=["llama", "gpt_neox"])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--hidden-up", type=int, default=128)
    ap.add_argument("--ffn-up", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--reps", type=int, default=11, help="timed steps per configuration (round-robin rounds)")
    ap.add_argument("--settle", type=int, default=1,
                    help="untimed steps of the same model before each timed step (a training run's steady state)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--allocator", default="tuned", choices=["tuned", "default"],
                    help="tuned: as the scalecl command runs (glibc keeps freed memory); default: glibc as is")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    a = ap.parse_args()
    tuned = tune_cpu_allocator() if a.allocator == "tuned" else False
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    models = make_models(a.arch, a.hidden, a.layers, a.vocab, a.hidden_up, a.ffn_up)
    batch = torch.randint(0, a.vocab, (a.batch, a.seq))
    steps = {k: step_fn(m, batch) for k, m in models.items()}
    for step, _ in steps.values():  # warm-up (allocator, optimizer state)
        step()
    times = {k: [] for k in steps}
    for _ in range(a.reps):
        for k, (step, _) in steps.items():
            for _ in range(a.settle):  # untimed steps first, so the timed one follows a step of the same model
                step()
            times[k].append(step())
    med = {k: statistics.median(v) for k, v in times.items()}
    state = {k: sum(t.numel() for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
             for k, (_, opt) in steps.items()}
    trainable = {k: sum(p.numel() for p in m.parameters() if p.requires_grad) for k, m in models.items()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit, "machine": f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}",
        "setting": vars(a), "malloc_tuned": tuned,
        "median_step_s": {k: round(v, 4) for k, v in med.items()},
        "route_over_adapt": round(med["route"] / med["adapt"], 3),
        "adapt_over_fft_plain": round(med["adapt"] / med["fft-plain-widened"], 3),
        "preserve_over_fft_plain": round(med["preserve"] / med["fft-plain-widened"], 3),
        "trainable_params": trainable,
        "optimizer_state_elems": state,
    }
    print(json.dumps(out, indent=2))
    for k in models:  # AdamW keeps exp_avg and exp_avg_sq: 2 elements per trainable parameter
        assert state[k] == 2 * trainable[k], f"{k}: optimizer state for frozen parameters"
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
