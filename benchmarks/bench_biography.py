"""Time the biography generator and local tokenizer at the cpu and paper presets.

Usage: python3 benchmarks/bench_biography.py [--repeats 7] [--paper-repeats 2] [--skip-paper]
The paper target: 200,000 people, 1M biography texts and 1.2M QA pairs in <= 30 s on 2 cores.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

from scalecl.data.biography import biographies, generate_people, preset, qa_pairs
from scalecl.data.tokenizer import first_answer_tokens, train_bio_tokenizer


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Wall seconds of one call (after a collection, so earlier garbage is not billed to it)."""
    gc.collect()
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def run_once(name: str, with_tokenizer: bool) -> dict[str, float]:
    """One full pass: people, all biographies, all QA, and optionally tokenizer training and first tokens."""
    cfg = preset(name)
    times: dict[str, float] = {}
    times["people"], people = timed(lambda: generate_people(cfg))
    times["biographies"], texts = timed(lambda: biographies(people))
    times["qa"], qa = timed(lambda: qa_pairs(people))
    times["data total"] = times["people"] + times["biographies"] + times["qa"]
    if with_tokenizer:
        times["train tokenizer"], tokenizer = timed(lambda: train_bio_tokenizer(people))
        times["first answer tokens"], _ = timed(lambda: first_answer_tokens(tokenizer, qa.prompts, qa.answers))
        times["  (check=False)"], _ = timed(
            lambda: first_answer_tokens(tokenizer, qa.prompts, qa.answers, check=False)
        )
    times["texts"], times["qa pairs"] = len(texts), len(qa)
    return times


def report(name: str, runs: list[dict[str, float]]) -> None:
    """Print the median (and range) of each timing over the runs."""
    print(f"\n{name}: {runs[0]['texts']:,.0f} texts, {runs[0]['qa pairs']:,.0f} QA pairs, {len(runs)} run(s)")
    for key in runs[0]:
        if key in ("texts", "qa pairs"):
            continue
        values = [r[key] for r in runs]
        print(f"  {key:<20} median {statistics.median(values):7.3f} s   min {min(values):7.3f}   max {max(values):7.3f}")


def main() -> None:
    """Benchmark the cpu preset several times and the paper preset once or more."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="runs of the cpu preset")
    parser.add_argument("--paper-repeats", type=int, default=2, help="runs of the paper preset")
    parser.add_argument("--skip-paper", action="store_true")
    parser.add_argument("--paper-tokenizer", action="store_true", help="also train the tokenizer at paper scale")
    args = parser.parse_args()

    report("cpu preset", [run_once("cpu", with_tokenizer=True) for _ in range(args.repeats)])
    if not args.skip_paper:
        runs = [run_once("paper", with_tokenizer=args.paper_tokenizer and i == 0) for i in range(args.paper_repeats)]
        report("paper preset", [runs[0]] if args.paper_tokenizer else runs)
        if args.paper_tokenizer and len(runs) > 1:
            report("paper preset (data only)", [{k: r[k] for k in runs[1]} for r in runs])
    print(f"\npeak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
