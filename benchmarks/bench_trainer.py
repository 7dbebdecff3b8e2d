"""The suite's training loop (`scalecl.training.loop.train`) against `transformers.Trainer`, same work on both sides.

Usage (from the repository root; case `route` needs the cached stage 2 of `--seed`, case `stage1` nothing):
    OMP_NUM_THREADS=1 python3 benchmarks/bench_trainer.py --blocks 5 --steps 30 \
        --json benchmarks/results/trainer_cpu.json

Cases, both at the `cpu` bio preset (scalecl/presets/bio_cpu.toml):
- stage1: biography pre-training, a random-init GPT-NeoX of the preset's shape (d=128, 4 layers, context 128,
  the local tokenizer's vocabulary), batches of 8 x 128 packed biography tokens, stage 1's AdamW (lr 2e-3,
  wd 0.1, beta2 0.98, 250 warm-up steps, cosine to 0.1 lr).
- route: stage 3 of SCALE-Route, the cached stage-2 model widened by the preset's scale-route options, Task 1
  QA batches of 32 (right-padded), stage 3's AdamW (lr 1e-4, wd 0.01, eps 1e-6, cosine to 0.9 lr).
Both sides: the same starting weights (restored before every block), the same batches in the same order, fp32,
gradient-norm clipping at 1.0, weight decay on matrices only (Trainer: all but biases and norms, the same
tensors here), the same torch thread count; Trainer logs, saves and evaluates nothing. The blocks alternate
(suite, Trainer, Trainer, suite, ...) in one process; block i of the suite and block i of Trainer run next to
each other, and the headline is the median over i of their throughput ratio (the load of a shared machine
changes between pairs more than within one). A block's time is the
wall time of its steps after the first (step ends, measured by a callback on both sides), its throughput the
tokens those steps read (attention-mask ones) per second. The first losses of both sides are compared: equal
to 1e-4, they show the two run the same computation.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


class _Rows(torch.utils.data.IterableDataset):
    """The batches as rows, in order (Trainer's DataLoader regroups them: batch size = the batches' rows)."""

    def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        self.batches = batches

    def __iter__(self):
        for b in self.batches:
            for i in range(b["input_ids"].shape[0]):
                yield {k: v[i] for k, v in b.items()}


def _tokens(b: dict[str, torch.Tensor]) -> int:
    return int(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].numel()


def suite_block(model, batches, optim, threads) -> tuple[list[float], list[float]]:
    """Step end times and losses of one block trained by scalecl.training.loop.train."""
    from scalecl.training.loop import Hooks, TrainPlan, train

    ends: list[float] = []
    rows: list[dict] = []

    def on_log(r):  # sync_every=1: called once per step, right after it
        ends.append(time.perf_counter())
        rows.extend(r)

    train(model, iter(batches), TrainPlan(len(batches), optim, sync_every=1), hooks=Hooks(on_log=on_log))
    return ends, [r["loss"] for r in rows]


def trainer_block(model, batches, optim, out_dir) -> tuple[list[float], list[float]]:
    """Step end times and losses of one block trained by transformers.Trainer with the same settings."""
    from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator

    ends: list[float] = []
    losses: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            ends.append(time.perf_counter())

    class LossOf(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            losses.append(float((out[0] if return_outputs else out).detach()))  # one read per step, as the suite's
            return out

    sched = {"cosine": "cosine_with_min_lr", "linear": "linear", "constant": "constant_with_warmup"}[optim.schedule]
    args = TrainingArguments(
        output_dir=out_dir, max_steps=len(batches), per_device_train_batch_size=batches[0]["input_ids"].shape[0],
        learning_rate=optim.lr, weight_decay=optim.weight_decay, adam_beta1=optim.beta1, adam_beta2=optim.beta2,
        adam_epsilon=optim.eps, max_grad_norm=optim.clip, warmup_steps=optim.warmup_steps,
        lr_scheduler_type=sched, lr_scheduler_kwargs={"min_lr_rate": optim.min_lr_ratio} if sched.startswith("cosine_") else {},
        optim="adamw_torch", logging_strategy="no", save_strategy="no", eval_strategy="no", report_to=[],
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=0, data_seed=0,
    )
    trainer = LossOf(model=model, args=args, train_dataset=_Rows(batches), data_collator=default_data_collator,
                     callbacks=[Clock()])
    trainer.train()
    return ends, losses


def stage1_case(rc, cache: Path):
    """(model, batches, optimizer settings) of the biography pre-training case."""
    import scalecl.experiments.bio_data as bio
    from scalecl.data.batches import packed_batches
    from scalecl.data.biography import pretrain_texts, ranges
    from scalecl.data.tokenizer import encode_plain
    from scalecl.models.build import model_from_config
    from scalecl.training.optim import OptimConfig

    data = bio.prepare_data(rc, cache)
    cfg = bio.base_model_config(rc, data.tokenizer)
    lo, hi = ranges(data.cfg).pretrain
    docs = encode_plain(data.tokenizer, pretrain_texts(data.people, data.cfg, lo, hi))
    stream = packed_batches(docs, data.tokenizer.eos_token_id, rc.model.context, rc.stage1.batch, rc.seed)

    def batches(n):
        out = []
        for _ in range(n):
            b = next(stream)
            out.append({**b, "attention_mask": torch.ones_like(b["input_ids"])})
        return out

    model = model_from_config(cfg, seed=rc.seed)
    return model, batches, OptimConfig.of(rc.stage1, rc.stage1.lr, rc.stage1.warmup)


def route_case(rc, cache: Path):
    """(model, batches, optimizer settings) of SCALE-Route's stage 3 on the cached stage-2 model."""
    import scalecl.experiments.bio as bio
    from scalecl.evaluation.qa import qa_batches
    from scalecl.experiments.base import Paths
    from scalecl.methods import get_method
    from scalecl.training.fit import Runtime
    from scalecl.training.optim import OptimConfig

    real = bio.cached_stage

    def cached_only(run, *a, **k):  # never train stage 1 or 2 here
        if not (run.final_dir / "scalecl.json").exists():
            sys.exit(f"error: {run.final_dir} is not cached; run `scalecl train-bio --set seed={rc.seed}` first")
        return real(run, *a, **k)

    bio.cached_stage = cached_only
    exp = bio.BioExperiment(rc, "cpu", Paths(out=Path("/nonexistent"), cache=cache))
    runtime = Runtime(say=print)
    exp.prepare(runtime)
    exp.stages(runtime)
    method = get_method("scale-route", **rc.method_options("scale-route"))
    model = exp.build(method)
    stream = qa_batches(exp.data.qa["task1"], rc.stage3.batch, exp.stream_seed + 3)
    return model, lambda n: [next(stream) for _ in range(n)], OptimConfig.of(rc.stage3, exp.stage3_lr(method), 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="stage1,route")
    ap.add_argument("--cache", default="cache", help="the stage cache (as the runs that filled it named it)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=5, help="blocks per side, interleaved")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per block")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from scalecl.compute.machine import provenance, tune_cpu_allocator
    from scalecl.experiments import load_preset

    tune_cpu_allocator()  # as the scalecl command does; Trainer's steps run in the same process, so both get it
    rc = load_preset("bio", "cpu", [f"seed={args.seed}"])
    prov = provenance()
    out = {"date": prov["date"], "commit": prov.get("commit"), "machine": prov.get("machine"),
           "torch": torch.__version__, "threads": torch.get_num_threads(), "blocks": args.blocks,
           "steps": args.steps, "load_before": os.getloadavg(), "cases": {}}
    import transformers

    out["transformers"] = transformers.__version__
    tmp = tempfile.mkdtemp(prefix="bench-trainer-")
    for case in args.cases.split(","):
        if case == "stage1":
            model, make, optim = stage1_case(rc, Path(tmp) / "cache")
        elif case == "route":
            model, make, optim = route_case(rc, Path(args.cache))
        else:
            sys.exit(f"error: unknown case {case!r}: stage1 or route")
        start = copy.deepcopy(model.state_dict())
        batches = make(args.steps)  # every block trains these batches from the same weights
        per_step = [_tokens(b) for b in batches]
        res: dict[str, list] = {"suite": [], "trainer": []}
        first_losses = {}
        order = [s for i in range(args.blocks) for s in (("suite", "trainer") if i % 2 == 0 else ("trainer", "suite"))]
        for side in ["suite", "trainer"] + order:  # one warm-up block per side first
            model.load_state_dict(start)
            t0 = time.perf_counter()
            if side == "suite":
                ends, losses = suite_block(model, batches, optim, args)
            else:
                ends, losses = trainer_block(model, batches, optim, tmp)
            wall = time.perf_counter() - t0
            first_losses.setdefault(side, losses)
            timed = ends[-1] - ends[0]  # steps 2..n
            res[side].append({"tokens_per_s": sum(per_step[1:]) / timed, "step_s": timed / (len(ends) - 1),
                              "block_wall_s": wall})
        for side in res:
            res[side] = res[side][1:]  # drop the warm-up block
        med = {s: statistics.median(r["tokens_per_s"] for r in res[s]) for s in res}
        # block i of each side ran next to each other: their ratio sees the same machine load
        paired = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(res["suite"], res["trainer"], strict=True)]
        diff = max(abs(a - b) for a, b in zip(first_losses["suite"], first_losses["trainer"], strict=True))
        out["cases"][case] = {"blocks": res, "median_tokens_per_s": med, "ratio_suite_over_trainer":
                              med["suite"] / med["trainer"], "paired_ratios": paired,
                              "median_paired_ratio": statistics.median(paired), "tokens_per_step": statistics.mean(per_step),
                              "max_loss_difference": diff}
        blocks = {s: ", ".join(f"{r['tokens_per_s']:,.0f}" for r in res[s]) for s in res}
        print(f"{case}: suite {med['suite']:,.0f} tokens/s, Trainer {med['trainer']:,.0f} tokens/s, ratio "
              f"{med['suite'] / med['trainer']:.3f}, median of paired blocks {statistics.median(paired):.3f} (blocks: suite {blocks['suite']}; Trainer {blocks['trainer']}); "
              f"largest loss difference over the {args.steps} steps {diff:.2e}")
        if diff > 1e-4:
            print(f"warning: the two sides' losses differ by {diff:.2e}: they do not run the same computation")
    out["load_after"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
