"""Stage 3's evaluation against its training at the `cpu` bio preset, on a cached base (no stage trains here).

Usage (from the repository root, where the default stage cache `cache/` lives; stage cache keys contain the
cache path as given, so pass it as the runs that filled it did):
    OMP_NUM_THREADS=1 python3 benchmarks/bench_eval.py --cache cache --seed 1 --methods scale-route,fft \
        --json benchmarks/results/eval_share.json

For each method: the stage-3 model (stage 2 + the method), then rounds in which one evaluation of the
stage-3 slices (Task 0 held-out and Task 1, what `BioExperiment.evaluate` runs at every evaluation step) by
the plain path (`qa_accuracy(fast=False)`: batches in order, padded, logits everywhere, no_grad) and by the
fast path alternate with a block of training steps, all in one process. The evaluation share of stage 3 is
then evaluations x eval time / (that + steps x step time) with the preset's schedule (73 evaluations, 600
steps).

The floor: one fast evaluation's floating-point operations are counted (torch's FlopCounterMode: matrix
products and attention), and a large float32 matrix product (1024 x 1024 x 1024) is timed at the same thread
count as the machine's matmul rate. Evaluations at that rate would take evaluations x FLOPs / rate; with the
training steps as measured, that gives the least share of stage 3 evaluation could reach without evaluating
less (`floor_share`). The model's own products are far smaller than 1024, so the real floor is higher.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch


def matmul_gflops(repeats: int = 7, n: int = 1024) -> float:
    """Median GFLOP/s of an n x n x n float32 matrix product at the current thread count."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times) / 1e9


def evaluation_flops(evaluate) -> int:
    """Floating-point operations of one call of evaluate(), as torch counts them (products and attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        evaluate()
    return counter.get_total_flops()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default="cache")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--methods", default="scale-route,fft")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10, help="training steps per round")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import scalecl.experiments.bio as bio
    from scalecl.compute.machine import provenance, tune_cpu_allocator
    from scalecl.evaluation.qa import qa_accuracy
    from scalecl.experiments import load_preset
    from scalecl.experiments.base import Paths
    from scalecl.methods import get_method
    from scalecl.training.fit import Runtime
    from scalecl.training.loop import TrainPlan, train

    tune_cpu_allocator()
    rc = load_preset("bio", "cpu", [f"seed={args.seed}"])
    exp = bio.BioExperiment(rc, "cpu", Paths(out=Path("/nonexistent"), cache=Path(args.cache)))
    real = bio.cached_stage

    def cached_only(run, *a, **k):  # never train stage 1 or 2 here
        if not (run.final_dir / "scalecl.json").exists():
            sys.exit(f"error: {run.final_dir} is not cached; run `scalecl train-bio --set seed={args.seed}` first")
        return real(run, *a, **k)

    bio.cached_stage = cached_only
    runtime = Runtime(say=print)
    exp.prepare(runtime)
    exp.stages(runtime)
    n_evals, n_steps = len(rc.eval.steps(rc.stage3.steps)), rc.stage3.steps
    peak = matmul_gflops()
    out = {"date": provenance()["date"], "commit": provenance().get("commit"), "threads": torch.get_num_threads(),
           "matmul_gflops": peak,
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "evaluations": n_evals, "steps": n_steps,
           "load_before": os.getloadavg(), "methods": {}}
    for name in args.methods.split(","):
        method = get_method(name, **rc.method_options(name))
        model = exp.build(method)
        batches = exp.batches(method, runtime)
        plan = exp.plan(method, runtime)
        rows: dict[str, list[float]] = {"plain": [], "fast": [], "step": []}
        same = True
        for r in range(args.rounds + 1):  # round 0 warms up
            for how in ("plain", "fast") if r % 2 else ("fast", "plain"):
                t = time.perf_counter()
                recs = [qa_accuracy(model, qa, rc.eval.batch, method=method, fast=how == "fast")
                        for qa in exp.slices.values()]
                if r:
                    rows[how].append(time.perf_counter() - t)
                if how == "plain":
                    plain = recs
                else:
                    fast = recs
            same &= all(f["acc"] == p["acc"] for f, p in zip(fast, plain, strict=True))
            t = time.perf_counter()
            train(model, batches, TrainPlan(args.steps, plan.optim, accum=plan.accum))
            if r:
                rows["step"].append((time.perf_counter() - t) / args.steps)
        med = {k: statistics.median(v) for k, v in rows.items()}
        share = {how: n_evals * med[how] / (n_evals * med[how] + n_steps * med["step"]) for how in ("plain", "fast")}
        flops = evaluation_flops(lambda m=model, me=method: [qa_accuracy(m, qa, rc.eval.batch, method=me)
                                                             for qa in exp.slices.values()])
        floor_s = flops / (peak * 1e9)  # one evaluation at the large-matmul rate
        floor_share = n_evals * floor_s / (n_evals * floor_s + n_steps * med["step"])
        out["methods"][name] = {"rounds": rows, "median_s": med, "eval_share": share, "same_accuracy": same,
                                "speedup": med["plain"] / med["fast"], "eval_flops": flops,
                                "eval_gflops_achieved": flops / med["fast"] / 1e9, "floor_eval_s": floor_s,
                                "floor_share": floor_share}
        print(f"{name}: evaluation plain {med['plain']:.3f} s, fast {med['fast']:.3f} s ({med['plain'] / med['fast']:.2f}x); "
              f"step {med['step']:.3f} s; share of stage 3: plain {share['plain']:.0%}, fast {share['fast']:.0%}; "
              f"same hard accuracy in every round: {same}; an evaluation is {flops / 1e9:.1f} GFLOP, "
              f"{flops / med['fast'] / 1e9:.0f} GFLOP/s achieved against a {peak:.0f} GFLOP/s matmul: floor "
              f"{floor_s:.3f} s, share at best {floor_share:.0%}")
    out["load_after"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
