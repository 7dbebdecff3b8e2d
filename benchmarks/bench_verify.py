"""What verifying a checkpoint on read costs next to loading it.

For each model size: write a checkpoint with `scalecl.save_model`, then time (medians of --repeats, in one
process) the whole-content hash of its files (`damage`, what `load_model` adds), `load_model` with
verification and `load_model(verify=False)`. Sizes: the biography `cpu` model after SCALE-Route, SmolLM2-135M
widened as the `real` preset does (random weights, its exact shapes), and optionally Llama-3.2-1B widened as
in the paper (--paper; about 6 GB on disk, needs ~14 GB of memory).

    python3 benchmarks/bench_verify.py --repeats 5 --json benchmarks/results/verify_cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from shapes import LLAMA_1B, SMOLLM2  # benchmarks/shapes.py

from scalecl.methods import get_method
from scalecl.models.build import model_from_config
from scalecl.training.checkpoint import find_damage, load_model, save_model

PYTHIA_CPU = dict(model_type="gpt_neox", vocab_size=1045, hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
                  num_attention_heads=8, max_position_embeddings=512)
CASES = {  # name: (base config, SCALE-Route widening)
    "bio cpu, SCALE-Route": (PYTHIA_CPU, dict(hidden_up=64, ffn_up=256, l_fp=1)),
    "SmolLM2-135M, SCALE-Route (real preset)": (SMOLLM2, dict(hidden_up=192, ffn_up=192, l_fp=6)),
    "Llama-3.2-1B, SCALE-Route (paper)": (LLAMA_1B, dict(hidden_up=256, ffn_up=1024, l_fp=3)),
}


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(name: str, config: dict, widen: dict, repeats: int, root: Path) -> dict:
    from transformers import AutoConfig

    base = model_from_config(AutoConfig.for_model(**config), seed=0)
    model = get_method("scale-route", **widen).apply(base)
    folder = save_model(model, root / name.split(",")[0].replace(" ", "_"))
    size = sum(p.stat().st_size for p in folder.iterdir())
    del base, model
    row = {"case": name, "bytes": size,
           "verify_s": median_time(lambda: find_damage(folder), repeats),
           "load_verified_s": median_time(lambda: load_model(folder), repeats),
           "load_unverified_s": median_time(lambda: load_model(folder, verify=False), repeats)}
    row["verify_share"] = row["verify_s"] / row["load_verified_s"]
    row["verify_GBps"] = size / row["verify_s"] / 1e9
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--paper", action="store_true", help="also Llama-3.2-1B widened as in the paper (~6 GB)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (config, widen) in CASES.items():
            if "paper" in name and not args.paper:
                continue
            rows.append(measure(name, config, widen, args.repeats if "paper" not in name else 3, Path(tmp)))
            r = rows[-1]
            print(f"{name}: {r['bytes'] / 1e6:,.0f} MB; verify {r['verify_s']:.3f} s ({r['verify_GBps']:.2f} GB/s); "
                  f"load {r['load_verified_s']:.3f} s verified, {r['load_unverified_s']:.3f} s not; "
                  f"verification {100 * r['verify_share']:.0f}% of a verified load", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv, "torch": torch.__version__, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
