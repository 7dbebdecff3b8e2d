"""The biography data step of a preset: what `scalecl train-bio` does before stage 1 trains.

Usage: python3 benchmarks/bench_data_step.py --preset paper --cache /tmp/bench-cache [--json FILE]
Run it twice with the same --cache: the first run is cold (the local tokenizer is trained and the pre-training
encoding cached), the second warm (what every later run of the same data and base seed does). The steps are
those of `BioExperiment.prepare` and the data part of `BioExperiment.stages`: people, the local tokenizer
(trained or read from the cache), the three QA sets (probe of the first-token check + encoding), the
pre-training biographies' encoding (`cached_encoding`), the never-target rows and the first packed batch.
Peak memory is the process's maximum resident set (ru_maxrss).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--cache", required=True, help="a cache folder of this benchmark's own")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t_start = time.perf_counter()
    steps: dict[str, float] = {}
    clock = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        steps[name] = round(steps.get(name, 0.0) + now - clock[0], 2)
        clock[0] = now

    import scalecl.experiments.bio_data as bio
    from scalecl.common.schema import config_hash
    from scalecl.compute.machine import provenance
    from scalecl.data.batches import packed_batches
    from scalecl.data.biography import pretrain_texts, ranges
    from scalecl.data.tokenizer import cached_encoding
    from scalecl.experiments import load_preset

    lap("import")
    rc = load_preset("bio", args.preset, ["tokenizer=local"])
    cache = Path(args.cache) / "bio"
    cold = not cache.exists()
    data = bio.prepare_data(rc, cache)  # people, tokenizer, QA sets (as BioExperiment.prepare)
    lap("prepare_data (people, tokenizer, QA)")
    lo, hi = ranges(data.cfg).pretrain
    docs = cached_encoding(data.tokenizer, lambda: pretrain_texts(data.people, data.cfg, lo, hi),
                           cache / f"encoded-{config_hash(asdict(data.cfg), data.tokenizer_dir, bio.TEXT_FORMAT, (lo, hi))}")
    lap("pre-training encoding")
    rows = bio.base_model_config(rc, data.tokenizer).vocab_size
    bio.never_target_rows(docs, data.qa.values(), rows, data.tokenizer.eos_token_id)
    lap("never-target rows")
    next(packed_batches(docs, data.tokenizer.eos_token_id, rc.model.context, rc.stage1.batch, rc.seed))
    lap("first packed batch")
    total = time.perf_counter() - t_start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out = {"preset": args.preset, "cold": cold, "total_s": round(total, 1), "steps_s": steps, "peak_rss_gib": round(peak, 2),
           "texts": len(docs), "tokens": int(sum(len(d) for d in docs)), "qa_pairs": {k: len(v) for k, v in data.qa.items()},
           "date": provenance()["date"], "commit": provenance().get("commit"), "load": os.getloadavg(),
           "cpus": os.cpu_count(), "rayon_threads": os.environ.get("RAYON_NUM_THREADS")}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    assert np.isfinite(total)


if __name__ == "__main__":
    main()
