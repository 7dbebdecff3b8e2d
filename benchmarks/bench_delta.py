"""Full against delta checkpoints: size on disk and load time, per method.

Paper-like: Llama-3.2-1B with the paper's CPT options (SCALE +256 hidden / +1024 FFN, l_fp=3 for Adapt and Route;
Freeze k=3; LLaMA Pro n=4). Sizes only, counted on the meta device from the tensors each checkpoint holds (float32,
as the suite saves; safetensors headers left out): no 1B weights are allocated.

Real: a SmolLM2-135M-shaped Llama (hidden 576, 30 layers, 9 heads, 3 KV heads, FFN 1536, vocabulary 49,152, tied
embeddings) with random weights and the `real` preset's options (SCALE +192 / +192, l_fp=6; Freeze k=6; LLaMA Pro
n=6). The base is saved as a suite checkpoint; per method the full and the delta checkpoint are written, their
files measured, and `load_model` of each timed (medians of --repeats, one process). A full load verifies its
files' hashes; a delta load loads the base (its files unverified), checks the digest of the base tensors it takes,
verifies and loads the delta. Every delta is checked to load to the full checkpoint's tensors, bit for bit.

    python3 benchmarks/bench_delta.py --repeats 5 --json benchmarks/results/delta_checkpoints.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from shapes import LLAMA_1B, SMOLLM2  # benchmarks/shapes.py
from transformers import AutoConfig

from scalecl.methods import get_method
from scalecl.models.build import model_from_config
from scalecl.training.checkpoint import load_model, save_model
from scalecl.training.delta import skeleton_split, unique_state

TINY = dict(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
PAPER_METHODS = {"freeze": {"k": 3}, "llama-pro": {"n": 4}, "scale-preserve": {"hidden_up": 256, "ffn_up": 1024},
                 "scale-adapt": {"hidden_up": 256, "ffn_up": 1024, "l_fp": 3},
                 "scale-route": {"hidden_up": 256, "ffn_up": 1024, "l_fp": 3}}
REAL_METHODS = {"freeze": {"k": 6}, "llama-pro": {"n": 6}, "scale-preserve": {"hidden_up": 192, "ffn_up": 192},
                "scale-adapt": {"hidden_up": 192, "ffn_up": 192, "l_fp": 6},
                "scale-route": {"hidden_up": 192, "ffn_up": 192, "l_fp": 6}}
TINY_METHODS = {"freeze": {"k": 2}, "llama-pro": {"n": 3}, "scale-preserve": {"hidden_up": 32, "ffn_up": 32},
                "scale-adapt": {"hidden_up": 32, "ffn_up": 32, "l_fp": 2},
                "scale-route": {"hidden_up": 32, "ffn_up": 32, "l_fp": 2}}


def counted(config: dict, methods: dict) -> list[dict]:
    """Bytes of the full and the delta checkpoint per method, from parameter counts on the meta device."""
    rows = []
    for name, opts in methods.items():
        model, split = skeleton_split(get_method(name, **opts), config, torch.float32)
        state = unique_state(model)
        full = sum(t.numel() for t in state.values()) * 4
        delta = sum(state[n].numel() for n in split.trained) * 4
        rows.append({"method": name, "options": opts, "full_bytes": full, "delta_bytes": delta,
                     "ratio": delta / full, "base_tensors_taken": len(split.from_base)})
    return rows


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def folder_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def measured(config: dict, methods: dict, repeats: int, root: Path) -> tuple[float, list[dict]]:
    """Write the base, then per method the full and the delta checkpoint; their sizes and load times."""
    base_dir = save_model(model_from_config(AutoConfig.for_model(**config), seed=0), root / "base",
                          base_model="random weights")
    base_load = median_time(lambda: load_model(base_dir, verify=False), repeats)
    rows = []
    for name, opts in methods.items():
        method = get_method(name, **opts)
        model = method.apply(load_model(base_dir))
        torch.manual_seed(1)
        with torch.no_grad():  # as after training: every trainable tensor away from its start
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(0.01 * torch.randn_like(p))
        t = time.perf_counter()
        full = save_model(model, root / f"{name}-full", method, base_model=str(base_dir))
        full_save = time.perf_counter() - t
        t = time.perf_counter()
        delta = save_model(model, root / f"{name}-delta", method, base_model=str(base_dir), delta=True)
        delta_save = time.perf_counter() - t
        del model
        a, b = load_model(full).state_dict(), load_model(delta).state_dict()
        same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        del a, b
        row = {"method": name, "options": opts, "full_bytes": folder_bytes(full), "delta_bytes": folder_bytes(delta),
               "full_save_s": full_save, "delta_save_s": delta_save,
               "full_load_s": median_time(lambda: load_model(full), repeats),  # noqa: B023 (called at once)
               "delta_load_s": median_time(lambda: load_model(delta), repeats),  # noqa: B023
               "delta_equals_full": same}
        row["ratio"] = row["delta_bytes"] / row["full_bytes"]
        rows.append(row)
        print(f"  {name}: {row['full_bytes'] / 1e6:,.1f} MB -> {row['delta_bytes'] / 1e6:,.1f} MB "
              f"({100 * row['ratio']:.0f}%); load {row['full_load_s']:.2f} s full, {row['delta_load_s']:.2f} s delta; "
              f"bit-identical: {same}", flush=True)
    return base_load, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--real", choices=("smollm2", "tiny"), default="smollm2",
                    help="the model saved and loaded: SmolLM2-135M's shapes, or a tiny Llama (tests)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    paper = counted(LLAMA_1B, PAPER_METHODS)
    print("Llama-3.2-1B, paper options (counted, float32):")
    for r in paper:
        print(f"  {r['method']}: {r['full_bytes'] / 1e9:.2f} GB -> {r['delta_bytes'] / 1e9:.2f} GB "
              f"({100 * r['ratio']:.0f}%)")
    config, methods = (SMOLLM2, REAL_METHODS) if args.real == "smollm2" else (TINY, TINY_METHODS)
    print(f"{args.real} (written and loaded, medians of {args.repeats}):", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        base_load, real = measured(config, methods, args.repeats, Path(tmp))
    print(f"  base alone: load_model(verify=False) {base_load:.2f} s")
    if args.json:
        doc = {"argv": sys.argv, "torch": torch.__version__, "threads": torch.get_num_threads(),
               "paper_llama_3_2_1b": paper, "real": {"model": args.real, "config": config, "repeats": args.repeats,
                                                     "base_load_unverified_s": base_load, "rows": real}}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
