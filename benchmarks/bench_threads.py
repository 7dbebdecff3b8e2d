"""CPU thread settings for a small training job: intra-op threads x OpenMP wait policy x competing load.

Times a fixed number of AdamW training steps of the `bio` cpu-preset model shape (GPT-NeoX, d=128, 4 layers,
4 heads, FFN 512, context 128, batch 8, vocabulary 1,000) under each combination of
  threads      1, 2, or torch's default (OMP_NUM_THREADS unset),
  wait policy  libgomp's default (spin ~3 ms before sleeping) or OMP_WAIT_POLICY=PASSIVE (sleep at once),
  competition  none; `burner`: one busy-looping process (another user's single-threaded job);
               `copy`: a second copy of the same workload with the same settings (two jobs at once).
OMP_* variables are read when torch loads its OpenMP runtime, so every setting runs in a fresh subprocess
(this script with --worker). Each round runs every setting once, in a shuffled order, so that a change in
the machine's other load spreads over all settings; the table gives the median over
rounds of each run's median step time, plus CPU seconds per step (a spinning runtime burns CPU that a
competing process needed). The raw JSON goes to benchmarks/results/.

    python3 benchmarks/bench_threads.py                      # the full grid, 3 rounds
    python3 benchmarks/bench_threads.py --threads 1,default --wait PASSIVE --compete none,copy --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from machine import interleave_options, interleaved, loadavg  # benchmarks/machine.py

REPO = Path(__file__).resolve().parents[1]
# anything that changes threading, stripped from the environment so "default" means torch's own default
THREAD_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS", "OMP_PROC_BIND",
              "OMP_PLACES", "OMP_DYNAMIC", "KMP_BLOCKTIME", "KMP_AFFINITY", "SCALECL_CPU_DEFAULTS")


def worker(a: argparse.Namespace) -> None:
    """One training job at the thread settings in its environment; prints JSON (or 'ready' and loops)."""
    import torch

    from scalecl.compute.machine import tune_cpu_allocator
    from scalecl.models.build import model_from_config, tiny_config

    tune_cpu_allocator()  # as the `scalecl` command does
    config = tiny_config("gpt_neox", vocab_size=a.vocab, hidden_size=128, num_hidden_layers=4,
                         num_attention_heads=4, intermediate_size=512, max_position_embeddings=128)
    model = model_from_config(config, seed=0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, a.vocab, (8, 128), generator=g) for _ in range(4)]

    def step(i: int) -> None:
        ids = batches[i % len(batches)]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in range(a.warmup):
        step(i)
    if a.forever:  # the competing copy: signal readiness, then train until the parent stops it
        print("ready", flush=True)
        i = 0
        while True:
            step(i)
            i += 1
    times, cpu = [], []
    for i in range(a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step(i)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(json.dumps({"threads": torch.get_num_threads(), "step_s": times, "cpu_s": cpu}), flush=True)


def child_env(threads: str, wait: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    env["PYTHONPATH"] = str(REPO)
    if threads != "default":
        env["OMP_NUM_THREADS"] = threads
    if wait != "default":
        env["OMP_WAIT_POLICY"] = wait
    return env


def run_one(a: argparse.Namespace, threads: str, wait: str, compete: str) -> dict:
    env = child_env(threads, wait)
    me = [sys.executable, str(Path(__file__).resolve()), "--worker", "--vocab", str(a.vocab),
          "--warmup", str(a.warmup)]
    rival = None
    if compete == "burner":
        rival = subprocess.Popen([sys.executable, "-c", "while True: pass"], env=env)
        time.sleep(0.5)
    elif compete == "copy":
        rival = subprocess.Popen([*me, "--forever"], env=env, stdout=subprocess.PIPE, text=True)
        if rival.stdout.readline().strip() != "ready":
            raise RuntimeError("competing copy did not start")
    load = loadavg()
    try:
        proc = subprocess.run([*me, "--steps", str(a.steps)], env=env, capture_output=True, text=True,
                              timeout=a.timeout, check=True)
    finally:
        if rival is not None:
            rival.terminate()
            rival.wait()
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"threads_in_effect": out["threads"], "median_step_s": statistics.median(out["step_s"]),
            "cpu_per_step_s": statistics.median(out["cpu_s"]), "step_s": out["step_s"], "loadavg_before": load}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="1,2,default")
    p.add_argument("--wait", default="default,PASSIVE")
    p.add_argument("--compete", default="none,burner,copy")
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--vocab", type=int, default=1000)
    interleave_options(p, timeout=600)
    a = p.parse_args()
    if a.worker:
        return worker(a)

    grid = [(t, w, c) for c in a.compete.split(",") for t in a.threads.split(",") for w in a.wait.split(",")]
    runs: dict[tuple, list[dict]] = {k: [] for k in grid}
    start, load0 = datetime.now(UTC), loadavg()
    for r, k in interleaved(grid, a.rounds, a.seed):
        res = run_one(a, *k)
        runs[k].append(res)
        print(f"round {r + 1}/{a.rounds}  threads={k[0]:<7} wait={k[1]:<7} compete={k[2]:<6} "
              f"{res['median_step_s'] * 1e3:7.1f} ms/step  cpu {res['cpu_per_step_s'] * 1e3:7.1f} ms/step  "
              f"load {res['loadavg_before']}", flush=True)
    results = [{"threads": t, "wait": w, "compete": c, "threads_in_effect": runs[t, w, c][0]["threads_in_effect"],
                "median_step_s": statistics.median(x["median_step_s"] for x in runs[t, w, c]),
                "cpu_per_step_s": statistics.median(x["cpu_per_step_s"] for x in runs[t, w, c]),
                "runs": runs[t, w, c]} for t, w, c in grid]
    import torch

    try:
        cpu_model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                         if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu_model = platform.processor()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=REPO).stdout.strip()
    except OSError:
        commit = None
    doc = {"date": start.isoformat(timespec="seconds"), "commit": commit,
           "machine": {"cpu": cpu_model, "cpus": os.cpu_count(), "platform": platform.platform(),
                       "python": platform.python_version(), "torch": torch.__version__},
           "loadavg_start": load0, "loadavg_end": loadavg(), "args": {k: v for k, v in vars(a).items()
                                                                       if k not in ("worker", "forever", "out")},
           "results": results}
    out = a.out or REPO / "benchmarks" / "results" / f"threads_{start:%Y%m%d_%H%M}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")

    best = min(r["median_step_s"] for r in results)
    print(f"\nmedian ms per step (CPU ms per step), x = relative to the fastest; load {load0} -> {doc['loadavg_end']}")
    print("| threads | wait policy | " + " | ".join(a.compete.split(",")) + " |")
    print("|---|---|" + "---:|" * len(a.compete.split(",")))
    for t in a.threads.split(","):
        for w in a.wait.split(","):
            cells = [next(r for r in results if (r["threads"], r["wait"], r["compete"]) == (t, w, c))
                     for c in a.compete.split(",")]
            print(f"| {t} | {w} | " + " | ".join(f"{r['median_step_s'] * 1e3:.0f} ({r['cpu_per_step_s'] * 1e3:.0f}) "
                                                 f"x{r['median_step_s'] / best:.1f}" for r in cells) + " |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
