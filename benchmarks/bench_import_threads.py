"""`import scalecl` in a plain script: do its CPU thread defaults reach torch, and what do they buy?

A script that imports scalecl before torch gets the `scalecl` command's CPU default (OMP_WAIT_POLICY=PASSIVE, set
before torch loads its OpenMP runtime); one that imports torch first gets a warning and torch's own spinning
threads; SCALECL_CPU_DEFAULTS=0 opts out. Each setting runs in a fresh subprocess (this script with --worker),
which times `upscale()` of a Llama model built from its config and a few training steps of the widened model:
  order        scalecl-first | torch-first | opt-out (scalecl first, SCALECL_CPU_DEFAULTS=0)
  competition  none; `copy`: a second copy of the same script and settings looping beside it (two jobs at once)
Threads: torch's default (one per core; OMP_NUM_THREADS unset). Each round runs every setting once in a shuffled
order; the table gives the median over rounds. Raw JSON goes to benchmarks/results/.

    python3 benchmarks/bench_import_threads.py --rounds 3
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from machine import interleave_options, interleaved, loadavg, provenance  # benchmarks/machine.py

REPO = Path(__file__).resolve().parents[1]
THREAD_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS", "OMP_PROC_BIND",
              "OMP_PLACES", "OMP_DYNAMIC", "KMP_BLOCKTIME", "KMP_AFFINITY", "SCALECL_CPU_DEFAULTS")
ORDERS = ("scalecl-first", "torch-first", "opt-out")


def workload(a: argparse.Namespace) -> dict:
    """upscale() once, then a.steps AdamW steps of the widened model; seconds for each part."""
    import torch

    from scalecl import ScaleConfig, upscale
    from scalecl.models.build import model_from_config, tiny_config

    config = tiny_config("llama", vocab_size=4096, hidden_size=a.hidden, num_hidden_layers=a.layers,
                         num_attention_heads=8, num_key_value_heads=4, intermediate_size=a.hidden * 3,
                         max_position_embeddings=256)
    base = model_from_config(config, seed=0)
    t0 = time.perf_counter()
    wide = upscale(base, ScaleConfig(variant="route", hidden_up=a.hidden // 4, ffn_up=a.hidden // 2,
                                     l_fp=a.layers - 1, tau=0.5))
    t_up = time.perf_counter() - t0
    params = [p for p in wide.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    ids = torch.randint(0, 4096, (4, 128), generator=torch.Generator().manual_seed(0))
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(a.steps):
        wide(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"upscale_s": t_up, "step_s": (time.perf_counter() - t0) / a.steps,
            "cpu_per_step_s": (time.process_time() - c0) / a.steps}


def worker(a: argparse.Namespace) -> None:
    """Import in the order asked, note what reached the environment, then run the workload (or loop it)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # import_module, so that no import sorter can change the order this setting is about
        for name in (["torch", "scalecl"] if a.order == "torch-first" else ["scalecl", "torch"]):
            importlib.import_module(name)
    import torch
    seen = {"omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "warned": any("too late for scalecl's CPU default" in str(w.message) for w in caught),
            "threads": torch.get_num_threads()}
    if a.forever:
        print("ready", flush=True)
        while True:
            workload(a)
    print(json.dumps({**seen, **workload(a)}), flush=True)


def child_env(order: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    env["PYTHONPATH"] = str(REPO)
    if order == "opt-out":
        env["SCALECL_CPU_DEFAULTS"] = "0"
    return env


def run_one(a: argparse.Namespace, order: str, compete: str) -> dict:
    me = [sys.executable, str(Path(__file__).resolve()), "--worker", "--order", order, "--hidden", str(a.hidden),
          "--layers", str(a.layers), "--steps", str(a.steps)]
    rival = None
    if compete == "copy":
        rival = subprocess.Popen([*me, "--forever"], env=child_env(order), stdout=subprocess.PIPE, text=True)
        if rival.stdout.readline().strip() != "ready":
            raise RuntimeError("competing copy did not start")
    load = loadavg()
    try:
        proc = subprocess.run(me, env=child_env(order), capture_output=True, text=True, timeout=a.timeout,
                              check=True)
    finally:
        if rival is not None:
            rival.terminate()
            rival.wait()
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "loadavg_before": load}


def summarize(runs: dict[tuple, list[dict]]) -> list[dict]:
    out = []
    for (order, compete), rs in runs.items():
        out.append({"order": order, "compete": compete, "omp_wait_policy": rs[0]["omp_wait_policy"],
                    "warned": rs[0]["warned"], "threads": rs[0]["threads"],
                    **{k: statistics.median(r[k] for r in rs) for k in ("upscale_s", "step_s", "cpu_per_step_s")},
                    "runs": rs})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--order", default=",".join(ORDERS), help="comma list of " + ", ".join(ORDERS))
    p.add_argument("--compete", default="none,copy", help="comma list of none, copy")
    p.add_argument("--hidden", type=int, default=512, help="the base model's width")
    p.add_argument("--layers", type=int, default=8, help="the base model's depth")
    p.add_argument("--steps", type=int, default=5, help="timed training steps of the widened model")
    interleave_options(p, timeout=900)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    grid = [(o, c) for c in a.compete.split(",") for o in a.order.split(",")]
    runs: dict[tuple, list[dict]] = {k: [] for k in grid}
    start, load0 = datetime.now(UTC), loadavg()
    for r, k in interleaved(grid, a.rounds, a.seed):
        res = run_one(a, *k)
        runs[k].append(res)
        print(f"round {r + 1}/{a.rounds}  {k[0]:<13} compete={k[1]:<4} upscale {res['upscale_s']:6.2f} s  "
              f"step {res['step_s'] * 1e3:7.0f} ms (cpu {res['cpu_per_step_s'] * 1e3:.0f})  "
              f"OMP_WAIT_POLICY={res['omp_wait_policy']} warned={res['warned']}  load {res['loadavg_before']}",
              flush=True)
    results = summarize(runs)
    doc = {"date": start.isoformat(timespec="seconds"), **provenance(), "loadavg_start": load0,
           "loadavg_end": loadavg(), "args": {k: v for k, v in vars(a).items() if k not in ("worker", "forever", "out")},
           "results": results}
    out = a.out or REPO / "benchmarks" / "results" / f"import_threads_{start:%Y%m%d_%H%M}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nmedians over {a.rounds} rounds; load {load0} -> {doc['loadavg_end']}")
    print("| import order | OMP_WAIT_POLICY | warned | competition | upscale() | step (CPU per step) |")
    print("|---|---|---|---|---:|---:|")
    for r in results:
        print(f"| {r['order']} | {r['omp_wait_policy'] or 'unset'} | {'yes' if r['warned'] else 'no'} | {r['compete']} "
              f"| {r['upscale_s']:.2f} s | {r['step_s'] * 1e3:.0f} ms ({r['cpu_per_step_s'] * 1e3:.0f} ms) |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
