"""The biography experiment (paper Sec. 5.1, Fig. 8; Zheng et al. 2025 protocol, spec biography.md).

Stage 1 pre-trains a random-init GPT-NeoX on biographies, stage 2 fine-tunes it on Task 0 QA, stage 3
applies a method and fine-tunes on Task 1 QA of new people while first-token accuracy on held-out Task 0
people and on Task 1 people is tracked. Stages 1 and 2 do not depend on the method: each is cached under a
hash of everything it depends on and reused by every method. Every stage is a run of the run layer
(scalecl.runlayer): checkpointed, resumable, guarded against divergence; a finished method run is found
before any stage is built.

Protocol details that follow the reference code (zzz47zzz/spurious-forgetting): every biography text
starts with a space (" Name ..."); in pre-training the token right after each EOS is not a target (it
starts an unrelated biography); stages 2 and 3 use AdamW eps 1e-6 with a cosine schedule from lr down to
0.9 lr (presets); stage 3 is evaluated densely early (the collapse is within ~200 steps).

Several processes: run the same command under `torchrun --nproc_per_node N`. Every stage's batch is the
global batch: each optimizer step's rows are cut into processes x accumulation micro-batches of
`compute.micro_batch` rows (RowShards), so N processes compute what one process computes with the same
micro-batches. Replicas are DDP or FSDP2 shards (`compute.parallel`). Every process runs every evaluation
(the same forwards, as FSDP requires; an evaluation costs what it costs on one GPU), and only rank 0
writes caches, checkpoints and results.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from rich.console import Console
from rich.table import Table

from .checkpoint import load_model, read_meta
from .config import BioRunConfig, StageConfig
from .data.biography import ATTRIBUTES, BioConfig, People, generate_people, preset, qa_pairs, ranges
from .data.biography import biographies as render_biographies
from .data.tokenizer import encode_plain, first_answer_tokens, load_tokenizer, train_bio_tokenizer
from .errors import ScaleclError
from .evaluate import QATensors, encode_qa, qa_accuracy, qa_batches
from .methods import get_method, method_names
from .models import model_from_config, tiny_config
from .perf import check_compute, configure_device
from .runlayer import Dist, Run, atomic_dir, check_out_dir, distributed, fit
from .runs import TMP_PREFIX, config_hash, pick_device, provenance, remove_temporaries
from .train import OptimConfig, progress_bar

console = Console()
METHOD_ORDER = ("fft", "lora", "freeze", "llama-pro", "scale-preserve", "scale-adapt", "scale-route")
# Version of the pre-training text format (leading space); part of the tokenizer and stage-1 cache keys, so
# caches written by an older format are never reused.
TEXT_FORMAT = 2


def say(text: str) -> None:
    """Print on the main process only (under torchrun every process runs the same code)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_rank() != 0):
        console.print(text, highlight=False)


class RowShards:
    """The micro-batches of one process, cut by rows from a stream of global batches.

    Every global batch of B rows is split into B / micro parts of `micro` rows; process r takes parts
    r, r + world, r + 2 world, ... one per accumulation step. One process with accumulation A therefore sees
    parts 0..A-1 in turn, and `world` processes with accumulation A / world see the same parts between them:
    the same gradient up to float summation order. Each process draws every global batch (the data position
    is the same on every process; train() skips micro-batches on resume by drawing them again).
    """

    def __init__(self, batches: Iterator[dict[str, torch.Tensor]], micro: int, world: int = 1, rank: int = 0) -> None:
        self.batches, self.micro, self.world, self.rank = batches, micro, world, rank
        self.queue: list[dict[str, torch.Tensor]] = []

    def __iter__(self) -> RowShards:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if not self.queue:
            b = next(self.batches)
            n = b["input_ids"].shape[0]
            if n == self.micro and self.world == 1:
                return b
            for j in range(self.rank, n // self.micro, self.world):
                self.queue.append({k: v[j * self.micro : (j + 1) * self.micro] for k, v in b.items()})
        return self.queue.pop(0)


def micro_batch(rc: BioRunConfig, sc: StageConfig, world: int) -> tuple[int, int]:
    """(rows per forward, accumulation steps) of a stage with `world` processes (checked by check_bio)."""
    per = sc.batch // world
    micro = min(rc.compute.micro_batch, per) if rc.compute.micro_batch else per
    return micro, per // micro


@dataclass
class BioData:
    cfg: BioConfig
    people: People
    tokenizer: Any
    tokenizer_dir: str | None
    qa: dict[str, QATensors]  # task0_train, task0_heldout, task1


def optim(sc: StageConfig, lr: float | None = None) -> OptimConfig:
    return OptimConfig(lr=lr if lr is not None else sc.lr, weight_decay=sc.weight_decay, beta1=sc.beta1,
                       beta2=sc.beta2, eps=sc.eps, warmup_steps=sc.warmup, schedule=sc.schedule,
                       min_lr_ratio=sc.min_lr_ratio, clip=sc.clip)


_optim = optim  # older name, kept for scripts


def bio_config(rc: BioRunConfig) -> BioConfig:
    try:
        return preset(rc.data, seed=rc.seed, **rc.data_overrides)
    except (ValueError, TypeError) as e:
        raise ScaleclError(f"biography data: {e}") from None


def pretrain_texts(people: People, cfg: BioConfig, lo: int, hi: int) -> list[str]:
    """The pre-training biographies of people [lo, hi), each starting with a space as the reference asserts."""
    return [" " + t for t in render_biographies(people, cfg, lo, hi)]


def open_tokenizer(name: str):
    """A given tokenizer (hub id or folder), with one clear error offline, naming the local alternative."""
    try:
        tokenizer = load_tokenizer(name)
    except (OSError, ValueError) as e:
        raise ScaleclError(f"cannot load tokenizer {name} ({str(e).splitlines()[0][:200]}); offline, use "
                           f"--tokenizer local (a word-level tokenizer trained on the generated corpus)") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def prepare_data(rc: BioRunConfig, cache: Path, tokenizer=None) -> BioData:
    """People, tokenizer (trained locally and cached unless one is given) and tokenised QA sets."""
    cfg = bio_config(rc)
    people = generate_people(cfg)
    if rc.tokenizer == "local":
        tok_dir = cache / f"tokenizer-{config_hash(asdict(cfg), TEXT_FORMAT)}"
        if (tok_dir / "tokenizer.json").exists():
            tokenizer = load_tokenizer(tok_dir)
        else:
            tokenizer = train_bio_tokenizer(people)
            vocab_rows(rc, len(tokenizer))  # a bad model.vocab fails before the cache is written
            remove_temporaries(cache, f"{TMP_PREFIX}{tok_dir.name}-")
            with atomic_dir(tok_dir) as tmp:
                tokenizer.save_pretrained(str(tmp))
        tok_src = str(tok_dir)
    else:
        tokenizer = tokenizer or open_tokenizer(rc.tokenizer)
        tok_src = rc.tokenizer
    vocab_rows(rc, len(tokenizer))
    r = ranges(cfg)
    qa = {}
    for name, (a, b) in (("task0_train", r.task0_train), ("task0_heldout", r.task0_heldout), ("task1", r.task1)):
        pairs = qa_pairs(people, a, b)
        probe = pairs.select(np.arange(min(len(pairs), 6_000)))  # a sample: the full check costs ~100 s at paper scale
        first_answer_tokens(tokenizer, probe.prompts, probe.answers)  # the metric's token must be well defined
        qa[name] = encode_qa(tokenizer, pairs.prompts, pairs.answers, pairs.attributes, ATTRIBUTES)
    return BioData(cfg, people, tokenizer, tok_src, qa)


def packed_batches(docs: list[list[int]], eos: int, context: int, batch: int, seed: int) -> Iterator[dict]:
    """Biographies + EOS, reshuffled every epoch, concatenated and cut into `context`-token chunks.

    The token right after an EOS begins another person's biography, which nothing before it predicts: its
    label is -100, as in the reference code (its labels mask every position that follows an EOS/pad).
    """
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(d + [eos], dtype=np.int64) for d in docs]
    while True:
        stream = np.concatenate([arrays[i] for i in rng.permutation(len(arrays))])
        n = len(stream) // context
        chunks = torch.from_numpy(stream[: n * context].reshape(n, context))
        for i in range(0, n - batch + 1, batch):
            ids = chunks[i : i + batch]
            labels = ids.clone()
            labels[:, 1:][ids[:, :-1] == eos] = -100  # (B, T): position t follows an EOS at t - 1
            yield {"input_ids": ids, "labels": labels}


def vocab_rows(rc: BioRunConfig, n_tokens: int) -> int:
    """Rows of the embedding and head: the tokenizer's size, or model.vocab when it pads beyond it."""
    if rc.model.vocab and rc.model.vocab < n_tokens:
        raise ScaleclError(f"model.vocab={rc.model.vocab} is smaller than the tokenizer's {n_tokens} tokens")
    return rc.model.vocab or n_tokens


def base_model_config(rc: BioRunConfig, tokenizer=None):
    """The stage-1 model's config (with a placeholder vocabulary when no tokenizer is given: sizes only)."""
    m = rc.model
    if m.hidden % m.heads:
        raise ScaleclError(f"model.hidden={m.hidden} is not divisible by model.heads={m.heads}")
    special = {}
    if tokenizer is not None:
        special = dict(eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)
    kw = dict(rotary_pct=m.rotary_pct) if m.arch == "gpt_neox" else {}
    return tiny_config(
        m.arch, vocab_size=vocab_rows(rc, len(tokenizer)) if tokenizer is not None else max(m.vocab, 8),
        hidden_size=m.hidden, num_hidden_layers=m.layers, num_attention_heads=m.heads, intermediate_size=m.ffn,
        max_position_embeddings=m.context, **kw, **special,
    )


_base_model_config = base_model_config  # older name, kept for scripts


def attribute_priors(qa: QATensors) -> dict[str, float]:
    """Chance floor per attribute: accuracy of always answering the most common first token."""
    first = qa.ids[torch.arange(len(qa)), qa.prompt_len]
    out = {}
    for a, name in enumerate(qa.attributes):
        vals = first[qa.attribute == a]
        if len(vals):
            out[name] = vals.bincount().max().item() / len(vals)
    out["pooled"] = sum(out[n] * (qa.attribute == a).sum().item() for a, n in enumerate(qa.attributes)
                        if n in out) / len(qa)
    return out


def _slice(qa: QATensors, people: int) -> QATensors:
    return qa.subset(torch.arange(min(len(qa), people * len(ATTRIBUTES))))


def _flat(prefix: str, d: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}/{k}": round(v, 6) for k, v in d.items()}


# ---------------------------------------------------------------------------------------------------------
# runs


def method_run(rc: BioRunConfig, method, out: Path, checkpoints: Path, preset_name: str, d: Dist = Dist()) -> Run:
    """The stage-3 run of one method, named by everything its numbers depend on."""
    lr = rc.stage3.lr * rc.lr_scale.get(method.name, 1.0)
    named = {k: v for k, v in asdict(rc).items() if k not in ("checkpoint", "methods", "lr_scale", "compute")}
    h = config_hash(named, method.name, method.options(), lr)
    name = f"{preset_name}-{method.name}-{h}"
    identity = {"experiment": "bio", "name": name, "method": method.name, "options": method.options(),
                "config_hash": h}
    return Run(identity, out / name, checkpoints / "bio" / name, keep=rc.checkpoint.keep, main=d.main)


def _stage_run(cache: Path, stage: str, key: str, keep: int, d: Dist = Dist()) -> Run:
    """A cached stage: its final model is the cache folder itself; checkpoints beside it until it is done."""
    name = f"{stage}-{key}"
    identity = {"experiment": f"bio-{stage}", "name": name, "method": None, "options": {}, "config_hash": key}
    return Run(identity, None, cache / "checkpoints" / name, final_dir=cache / name, keep=keep, main=d.main)


def _cached_stage(run: Run, build, batches, sc: StageConfig, *, info, dev, autocast, progress, desc, every,
                  tokenizer, rc: BioRunConfig | None = None, d: Dist = Dist()) -> tuple[torch.nn.Module | None, dict]:
    """Load a finished stage from the cache, or train it (resuming its own checkpoints) and cache it.

    Under torchrun every process trains (and runs `info`'s evaluations); rank 0 writes the cache.
    """
    d.barrier()  # every process sees the same cache
    meta = read_meta(run.final_dir)
    if meta is not None:
        return None, {**meta.get("stage", {}), "cached": True}
    t = time.perf_counter()
    compute = rc.compute if rc is not None else None
    micro, accum = micro_batch(rc, sc, d.world) if rc is not None else (sc.batch, 1)
    res = fit(run, build, RowShards(batches, micro, d.world, d.rank), sc.steps, optim(sc), device=dev,
              resume="auto", save_every=every, autocast=autocast, progress=progress, desc=desc,
              save_kw={"tokenizer": tokenizer}, say=say, compute=compute, d=d, accum=accum)
    stage = {"wall_s": round(time.perf_counter() - t, 1), "final_loss": res.losses[-1], **info(res.model),
             "accumulation": accum, "speed": res.speed,
             "provenance": {k: v for k, v in provenance().items() if k in ("date", "commit", "torch", "machine")}}
    if res.resumed_from:
        stage["resumed_from"] = res.resumed_from
    if d.main:
        run.finish(None, (res.export.cpu(), None, {"tokenizer": tokenizer, "extra": {"stage": stage}}))
        for p in run.checkpoints():  # the cache folder now holds the stage: its checkpoints are spent
            import shutil

            shutil.rmtree(p, ignore_errors=True)
    d.barrier()
    return res.model, {**stage, "cached": False}


def check_bio(rc: BioRunConfig, methods: list[str], out: Path, cache: Path, checkpoints: Path,
              device: str | None, d: Dist = Dist()):
    """Every check that writes nothing: names, device, folders, data sizes, batches, each method's options."""
    for name in methods:
        if name not in method_names():
            raise ScaleclError(f"unknown method {name!r}; choose one of {', '.join(METHOD_ORDER)} or all")
    if d.world > 1 and device in (None, "cuda") and torch.cuda.is_available():
        device = f"cuda:{d.local_rank}"  # one GPU per process
    dev = pick_device(device)
    check_compute(rc.compute, dev, d.world)
    for stage in ("stage1", "stage2", "stage3"):
        sc = getattr(rc, stage)
        if sc.batch % d.world or (sc.batch // d.world) % micro_batch(rc, sc, d.world)[0]:
            raise ScaleclError(f"{stage}.batch={sc.batch} must be a multiple of processes x compute.micro_batch = "
                               f"{d.world} x {rc.compute.micro_batch or 'batch / processes'}")
    for path, what in ((out, "--out"), (cache, "--cache"), (checkpoints, "--checkpoints")):
        check_out_dir(path, what)
    bio_config(rc)
    probe = base_model_config(rc)  # sizes only: the vocabulary comes with the tokenizer
    prepared = {name: get_method(name, **rc.method_options(name)) for name in methods}
    for m in prepared.values():
        m.check(probe)
    return dev, prepared


def run_bio(
    rc: BioRunConfig, methods: list[str], out: Path, cache: Path, preset_name: str, force: bool = False,
    device: str | None = None, *, checkpoints: Path | None = None, resume: bool = False,
    stop_after: int | None = None, report_to: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """Run stages 1-2 (cached) and stage 3 for each method; returns one result dict per method.

    Finished method runs are found first: when every asked-for method has finished, no stage is built.
    """
    with distributed() as d:
        return _run_bio(d, rc, methods, out, cache, preset_name, force, device, checkpoints, resume, stop_after,
                        report_to)


def _run_bio(d: Dist, rc: BioRunConfig, methods: list[str], out: Path, cache: Path, preset_name: str, force: bool,
             device: str | None, checkpoints: Path | None, resume: bool, stop_after: int | None,
             report_to: tuple[str, ...]) -> list[dict[str, Any]]:
    checkpoints = checkpoints if checkpoints is not None else Path("checkpoints")
    dev, prepared = check_bio(rc, methods, out, cache, checkpoints, device, d)
    tokenizer = open_tokenizer(rc.tokenizer) if rc.tokenizer != "local" else None  # fails before any write
    order = [m for m in METHOD_ORDER if m in methods]
    runs = {name: method_run(rc, prepared[name], out, checkpoints, preset_name, d) for name in order}
    done = {name: runs[name].result() for name in order}
    todo = [name for name in order if force or done[name] is None]
    for name in order:
        if name not in todo:
            say(f"{name}: finished run found at {runs[name].out_dir} (use --force to rerun)")
    if not todo:
        results = [done[n] for n in order]
        if d.main:
            _print_summary(results)
        return results if d.main else []

    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    configure_device(dev, rc.compute.tf32)
    started = provenance() | {"device": str(dev)}  # taken at the start: the code that runs is this commit's
    autocast = torch.bfloat16 if rc.dtype == "bfloat16" and dev.type == "cuda" else None
    cache = cache / "bio"
    t0 = time.perf_counter()
    for turn in ("main", "others"):  # rank 0 trains and caches the local tokenizer; the others then read it
        if d.main == (turn == "main"):
            with console.status("generating biographies and tokenizer") if d.main else contextlib.nullcontext():
                data = prepare_data(rc, cache, tokenizer)
        d.barrier()
    data_s = time.perf_counter() - t0
    base_cfg = base_model_config(rc, data.tokenizer)
    say(f"data: {len(data.people):,} people, vocab {len(data.tokenizer):,} (model rows {base_cfg.vocab_size:,}), "
        f"QA task0 {len(data.qa['task0_train']):,} / held-out {len(data.qa['task0_heldout']):,} / "
        f"task1 {len(data.qa['task1']):,} ({data_s:.1f} s)")

    k1 = config_hash(asdict(data.cfg), data.tokenizer_dir, rc.model, rc.stage1, rc.seed, TEXT_FORMAT)
    k2 = config_hash(k1, rc.stage2)
    heldout = data.qa["task0_heldout"]
    every = rc.checkpoint.every
    results = []
    with progress_bar() if d.main else contextlib.nullcontext() as progress:
        stage_kw = dict(dev=dev, autocast=autocast, progress=progress, every=every, tokenizer=data.tokenizer, rc=rc,
                        d=d)

        def build1():
            return model_from_config(base_cfg, seed=rc.seed)

        lo, hi = ranges(data.cfg).pretrain
        docs = encode_plain(data.tokenizer, pretrain_texts(data.people, data.cfg, lo, hi))
        corpus = sum(len(doc) + 1 for doc in docs)  # tokens of one epoch (each biography + EOS)
        s1_batches = packed_batches(docs, data.tokenizer.eos_token_id, rc.model.context, rc.stage1.batch, rc.seed)
        _, s1 = _cached_stage(
            _stage_run(cache, "stage1", k1, rc.checkpoint.keep, d), build1, s1_batches, rc.stage1,
            info=lambda m: {"params": sum(p.numel() for p in m.parameters()), "corpus_tokens": corpus,
                             "epochs": round(rc.stage1.steps * rc.stage1.batch * rc.model.context / corpus, 2)},
            desc="stage 1: pre-train", **stage_kw)
        s2_run = _stage_run(cache, "stage2", k2, rc.checkpoint.keep, d)
        _, s2 = _cached_stage(
            s2_run, lambda: load_model(cache / f"stage1-{k1}"), qa_batches(data.qa["task0_train"], rc.stage2.batch,
                                                                          rc.seed),
            rc.stage2, info=lambda m: {"task0_heldout": qa_accuracy(m, heldout, rc.eval.batch),
                                       "task0_train": qa_accuracy(m, data.qa["task0_train"], rc.eval.batch)},
            desc="stage 2: Task 0 QA", **stage_kw)
        say(f"stage 2: held-out Task 0 accuracy {s2['task0_heldout']['acc']:.3f} "
            f"(prior {attribute_priors(heldout)['pooled']:.3f})" + (" [cached]" if s2["cached"] else ""))
        stages = {"data_s": round(data_s, 1), "stage1": s1, "stage2": s2}
        for name in order:
            if name not in todo:
                results.append(done[name])
                continue
            r = _run_method(rc, data, prepared[name], runs[name], s2_run.final_dir, preset_name, stages, force,
                            resume, stop_after, dev, started, autocast, progress, report_to, d)
            if r is not None:
                results.append(r)
    if not d.main:
        return []
    _print_summary(results)
    return results


def _run_method(rc, data: BioData, method, run: Run, stage2_dir: Path, preset_name: str, stages: dict,
                force: bool, resume: bool, stop_after: int | None, dev, started: dict, autocast,
                progress, report_to: tuple[str, ...] = (), d: Dist = Dist()) -> dict[str, Any] | None:
    name = method.name
    lr = rc.stage3.lr * rc.lr_scale.get(name, 1.0)
    t0_slice = _slice(data.qa["task0_heldout"], rc.eval.slice_people)
    t1_slice = _slice(data.qa["task1"], rc.eval.slice_people)

    def build():
        torch.manual_seed(rc.seed)  # methods with random initialisation (rnd blocks) draw from here
        return method.apply(load_model(stage2_dir))

    def evaluate(model, step: int, loss: float) -> dict[str, Any]:
        rec = {"step": step, "loss": None if step == 0 else round(loss, 6)}
        for split, qa in (("task0", t0_slice), ("task1", t1_slice)):
            rec |= _flat(split, qa_accuracy(model, qa, rc.eval.batch, method=method))
        # routing over every token of the Task 0 slice (kept under its old name for older plots)
        rec |= {k.removeprefix("task0/"): v for k, v in rec.items() if k in ("task0/route_preserve",
                                                                              "task0/route_adapt")}
        return rec

    save_kw = {"tokenizer": data.tokenizer, "base_model": str(stage2_dir)}
    micro, accum = micro_batch(rc, rc.stage3, d.world)
    batches = RowShards(qa_batches(data.qa["task1"], rc.stage3.batch, rc.seed + 3), micro, d.world, d.rank)
    res = fit(run, build, batches, rc.stage3.steps,
              optim(rc.stage3, lr), method=method, device=dev, evaluate=evaluate,
              eval_steps=rc.eval.steps(rc.stage3.steps), resume=resume, force=force,
              save_every=rc.checkpoint.every, stop_at=stop_after, autocast=autocast, progress=progress,
              desc=f"stage 3: {name}", save_kw=save_kw, say=say, report_to=report_to,
              config={"method": name, "options": method.options(), "lr": lr, **asdict(rc)},
              compute=rc.compute, d=d, accum=accum)
    if not res.complete:
        return None
    model = res.model
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_total = sum(p.numel() for p in model.parameters())
    final = {"task0_heldout": qa_accuracy(model, data.qa["task0_heldout"], rc.eval.batch, exact=True),
             "task1": qa_accuracy(model, data.qa["task1"], rc.eval.batch, exact=True)}  # every process: lock-step
    if not d.main:
        d.barrier()
        return None
    t0 = [r["task0/acc"] for r in res.records]
    t1 = [r["task1/acc"] for r in res.records]
    result = {
        "experiment": "bio", "preset": preset_name, "method": name, "method_options": method.options(),
        "description": method.describe(), "lr": lr, "trainable_params": n_train, "total_params": n_total,
        "config": asdict(rc), "data": asdict(data.cfg), "tokenizer": data.tokenizer_dir,
        "vocab": {"tokenizer": len(data.tokenizer), "model": model.config.vocab_size},
        "provenance": started | {"finished": provenance()["date"]},
        "wall_s": {"data": stages["data_s"], "stage1": stages["stage1"]["wall_s"], "stage2": stages["stage2"]["wall_s"],
                   "stage3": res.timing["train_s"], "stage3_eval": res.timing["eval_s"]},
        "stages_cached": {"stage1": stages["stage1"]["cached"], "stage2": stages["stage2"]["cached"]},
        "processes": d.world,
        "accumulation": {"stage1": stages["stage1"].get("accumulation"), "stage2": stages["stage2"].get("accumulation"),
                         "stage3": accum},
        "speed": res.speed,
        "stage1": {k: v for k, v in stages["stage1"].items() if k != "cached"},
        "stage2": {k: v for k, v in stages["stage2"].items() if k != "cached"},
        "priors": {"task0_heldout": attribute_priors(data.qa["task0_heldout"]),
                   "task1": attribute_priors(data.qa["task1"])},
        "summary": {"task0_start": t0[0], "task0_end": t0[-1], "task0_min": min(t0), "task1_start": t1[0],
                    "task1_end": t1[-1], "final_loss": res.losses[-1]},
        "final": final,
        "checkpoint": str(run.final_dir),
    }
    if res.resumed_from:
        result["resumed_from_step"] = res.resumed_from
    run.finish(result, (res.export.cpu(), method, save_kw))
    say(f"{name}: wrote {run.out_dir}; final model {run.final_dir}")
    d.barrier()
    return result


def _print_summary(results: list[dict]) -> None:
    if not results:
        return
    table = Table(title="biography: hard first-token accuracy (T0 = held-out Task 0, T1 = Task 1; slices during "
                        "training, full ranges at the end)")
    table.add_column("method", no_wrap=True)
    for col in ("T0 start", "T0 min", "T0 end", "T1 start", "T1 end", "T0 full", "T1 full"):
        table.add_column(col, justify="right")
    for r in results:
        s = r["summary"]
        table.add_row(r["method"], *(f"{s[k]:.3f}" for k in ("task0_start", "task0_min", "task0_end", "task1_start",
                                                               "task1_end")),
                      f"{r['final']['task0_heldout']['acc']:.3f}", f"{r['final']['task1']['acc']:.3f}")
    console.print(table)
