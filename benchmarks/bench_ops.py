"""Operations a QA training step dispatches, FFT against SCALE-Route (a CPU proxy for a GPU step bound by launches).

On one H200 the biography QA step (48 x 32 tokens, Pythia-160M's shape, bf16) took 37.4 ms for FFT and 70.8 ms for
SCALE-Route with the `gpu` preset's options (benchmarks/results/gpu_20261128): far from the GPU's arithmetic, near
the time the host takes to dispatch the step's operations one by one. This counts them on a CPU: the top-level
aten operations of one forward and backward under bf16 autocast (torch.profiler; operations called by another
operation are not counted again), per model, with the most frequent. The optimizer is left out (a CPU AdamW runs
per parameter where a GPU's fused AdamW is one call). Seconds on a CPU are not the GPU's and are not reported.

    python benchmarks/bench_ops.py --json benchmarks/results/ops_qa_step.json
    python benchmarks/bench_ops.py --tiny --json /tmp/ops.json      # toy sizes (the test)
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch
from bench_gpu import PYTHIA_160M, PYTHIA_TINY, ROUTE_GPU, build, qa_batch  # benchmarks/bench_gpu.py
from machine import provenance  # benchmarks/machine.py
from torch.profiler import ProfilerActivity, profile

from scalecl import ScaleConfig
from scalecl.compute.loss import step_loss


def count_ops(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> collections.Counter:
    """Top-level aten operations of one forward (bf16 autocast, the loss a CUDA run uses for this model) and its
    backward, after one unprofiled step."""
    loss_fn = step_loss(model, "auto", torch.device("cuda", 0))  # the loss a GPU run resolves (nothing runs there)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(model, loss_fn.host(batch))
        loss.backward()

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::")
                               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, type=Path, help="where to write the counts")
    ap.add_argument("--tiny", action="store_true", help="toy sizes")
    a = ap.parse_args()
    shape = PYTHIA_TINY if a.tiny else PYTHIA_160M
    route = ScaleConfig(variant="route", **(dict(hidden_up=64, ffn_up=32, l_fp=1) if a.tiny else ROUTE_GPU))
    batch = qa_batch(shape["vocab_size"], 4 if a.tiny else 48, 16 if a.tiny else 32, torch.Generator().manual_seed(0))
    cpu = torch.device("cpu")
    res: dict = {"provenance": provenance(), "shape": "tiny" if a.tiny else "pythia-160m, QA 48 x 32", "models": {}}
    for name, scale in (("fft", None), ("scale-route", route)):
        ops = count_ops(build("gpt_neox", shape, cpu, scale), batch)
        res["models"][name] = {"ops": sum(ops.values()), "most": dict(ops.most_common(12))}
        print(f"{name:12s} {sum(ops.values()):6d} operations per forward and backward", flush=True)
    m = res["models"]
    res["route_over_fft"] = round(m["scale-route"]["ops"] / m["fft"]["ops"], 3)
    print(f"SCALE-Route / FFT: {res['route_over_fft']}x the operations")
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
