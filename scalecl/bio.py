"""The biography experiment (paper Sec. 5.1, Fig. 8; Zheng et al. 2025 protocol, spec biography.md).

Stage 1 pre-trains a random-init GPT-NeoX on biographies, stage 2 fine-tunes it on Task 0 QA, stage 3
applies a method and fine-tunes on Task 1 QA of new people while first-token accuracy on held-out Task 0
people and on Task 1 people is tracked. Stages 1 and 2 do not depend on the method: each is cached under a
hash of everything it depends on and reused by every method.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from .checkpoint import load_model, save_model
from .config import BioRunConfig, StageConfig
from .data.biography import ATTRIBUTES, BioConfig, People, generate_people, preset, qa_pairs, ranges
from .data.biography import biographies as render_biographies
from .data.tokenizer import encode_plain, first_answer_tokens, load_tokenizer, train_bio_tokenizer
from .errors import ScaleclError
from .evaluate import QATensors, encode_qa, qa_accuracy, qa_batches
from .methods import get_method, method_names
from .models import model_from_config, tiny_config
from .runs import config_hash, pick_device, provenance, write_atomic, write_json
from .train import OptimConfig, progress_bar, train

console = Console()
METHOD_ORDER = ("fft", "lora", "freeze", "llama-pro", "scale-preserve", "scale-adapt", "scale-route")


@dataclass
class BioData:
    cfg: BioConfig
    people: People
    tokenizer: Any
    tokenizer_dir: str | None
    qa: dict[str, QATensors]  # task0_train, task0_heldout, task1


def _optim(sc: StageConfig, lr: float | None = None) -> OptimConfig:
    return OptimConfig(lr=lr if lr is not None else sc.lr, weight_decay=sc.weight_decay, beta1=sc.beta1,
                       beta2=sc.beta2, eps=sc.eps, warmup_steps=sc.warmup, schedule=sc.schedule,
                       min_lr_ratio=sc.min_lr_ratio, clip=sc.clip)


def bio_config(rc: BioRunConfig) -> BioConfig:
    try:
        return preset(rc.data, seed=rc.seed, **rc.data_overrides)
    except (ValueError, TypeError) as e:
        raise ScaleclError(f"biography data: {e}") from None


def prepare_data(rc: BioRunConfig, cache: Path) -> BioData:
    """People, tokenizer (trained locally and cached unless one is given) and tokenised QA sets."""
    cfg = bio_config(rc)
    people = generate_people(cfg)
    if rc.tokenizer == "local":
        tok_dir = cache / f"tokenizer-{config_hash(asdict(cfg))}"
        if (tok_dir / "tokenizer.json").exists():
            tokenizer = load_tokenizer(tok_dir)
        else:
            tokenizer = train_bio_tokenizer(people)
            tokenizer.save_pretrained(str(tok_dir))
        tok_src = str(tok_dir)
    else:
        try:
            tokenizer = load_tokenizer(rc.tokenizer)
        except (OSError, ValueError) as e:
            raise ScaleclError(f"cannot load tokenizer {rc.tokenizer}: {e}") from None
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tok_src = rc.tokenizer
    r = ranges(cfg)
    qa = {}
    for name, (a, b) in (("task0_train", r.task0_train), ("task0_heldout", r.task0_heldout), ("task1", r.task1)):
        pairs = qa_pairs(people, a, b)
        probe = pairs.select(np.arange(min(len(pairs), 6_000)))  # a sample: the full check costs ~100 s at paper scale
        first_answer_tokens(tokenizer, probe.prompts, probe.answers)  # the metric's token must be well defined
        qa[name] = encode_qa(tokenizer, pairs.prompts, pairs.answers, pairs.attributes, ATTRIBUTES)
    return BioData(cfg, people, tokenizer, tok_src, qa)


def packed_batches(docs: list[list[int]], eos: int, context: int, batch: int, seed: int) -> Iterator[dict]:
    """Biographies + EOS, reshuffled every epoch, concatenated and cut into `context`-token chunks."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(d + [eos], dtype=np.int64) for d in docs]
    while True:
        stream = np.concatenate([arrays[i] for i in rng.permutation(len(arrays))])
        n = len(stream) // context
        chunks = torch.from_numpy(stream[: n * context].reshape(n, context))
        for i in range(0, n - batch + 1, batch):
            ids = chunks[i : i + batch]
            yield {"input_ids": ids, "labels": ids}


def _base_model_config(rc: BioRunConfig, tokenizer):
    m = rc.model
    if m.hidden % m.heads:
        raise ScaleclError(f"model.hidden={m.hidden} is not divisible by model.heads={m.heads}")
    return tiny_config(
        m.arch, vocab_size=len(tokenizer), hidden_size=m.hidden, num_hidden_layers=m.layers,
        num_attention_heads=m.heads, intermediate_size=m.ffn, max_position_embeddings=m.context,
        rotary_pct=m.rotary_pct, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _stage(cache_dir: Path, build) -> tuple[torch.nn.Module, dict]:
    """Load a cached stage checkpoint, or build it and cache it with its info (wall time, metrics)."""
    if (cache_dir / "scalecl.json").exists():
        meta = json.loads((cache_dir / "scalecl.json").read_text())
        return load_model(cache_dir), {**meta.get("stage", {}), "cached": True}
    model, info = build()
    save_model(model, cache_dir, extra={"stage": info})
    return model, {**info, "cached": False}


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


def run_bio(
    rc: BioRunConfig, methods: list[str], out: Path, cache: Path, preset_name: str, force: bool = False,
    device: str | None = None,
) -> list[dict[str, Any]]:
    """Run stages 1-2 (cached) and stage 3 for each method; returns one result dict per method."""
    for name in methods:
        if name not in method_names():
            raise ScaleclError(f"unknown method {name!r}; choose one of {', '.join(METHOD_ORDER)} or all")
    dev = pick_device(device)
    started = provenance() | {"device": str(dev)}  # taken at the start: the code that runs is this commit's
    autocast = torch.bfloat16 if rc.dtype == "bfloat16" and dev.type == "cuda" else None
    bio_config(rc)  # data sizes checked before anything runs
    cache = cache / "bio"
    t0 = time.perf_counter()
    with console.status("generating biographies and tokenizer"):
        data = prepare_data(rc, cache)
    data_s = time.perf_counter() - t0
    base_cfg = _base_model_config(rc, data.tokenizer)
    prepared = {name: get_method(name, **rc.method_options(name)) for name in methods}
    for m in prepared.values():
        m.check(base_cfg)  # every method's options checked before any training
    console.print(f"data: {len(data.people):,} people, vocab {len(data.tokenizer):,}, "
                  f"QA task0 {len(data.qa['task0_train']):,} / held-out {len(data.qa['task0_heldout']):,} / "
                  f"task1 {len(data.qa['task1']):,} ({data_s:.1f} s)", highlight=False)

    k1 = config_hash(asdict(data.cfg), data.tokenizer_dir, rc.model, rc.stage1, rc.seed)
    k2 = config_hash(k1, rc.stage2)
    heldout = data.qa["task0_heldout"]
    with progress_bar() as progress:
        def build1():
            torch.manual_seed(rc.seed)
            model = model_from_config(base_cfg, seed=rc.seed).to(dev)
            lo, hi = ranges(data.cfg).pretrain
            docs = encode_plain(data.tokenizer, render_biographies(data.people, data.cfg, lo, hi))
            t = time.perf_counter()
            losses = train(model, packed_batches(docs, data.tokenizer.eos_token_id, rc.model.context,
                                                 rc.stage1.batch, rc.seed), rc.stage1.steps, _optim(rc.stage1),
                           progress=progress, desc="stage 1: pre-train", autocast_dtype=autocast)
            return model.cpu(), {"wall_s": round(time.perf_counter() - t, 1), "final_loss": losses[-1],
                                 "params": sum(p.numel() for p in model.parameters())}

        s1_model, s1 = _stage(cache / f"stage1-{k1}", build1)

        def build2():
            model = s1_model.to(dev)
            t = time.perf_counter()
            losses = train(model, qa_batches(data.qa["task0_train"], rc.stage2.batch, rc.seed), rc.stage2.steps,
                           _optim(rc.stage2), progress=progress, desc="stage 2: Task 0 QA", autocast_dtype=autocast)
            acc = qa_accuracy(model, heldout, rc.eval.batch)
            return model.cpu(), {"wall_s": round(time.perf_counter() - t, 1), "final_loss": losses[-1],
                                 "task0_heldout": acc, "task0_train": qa_accuracy(model, data.qa["task0_train"],
                                                                                  rc.eval.batch)}

        _, s2 = _stage(cache / f"stage2-{k2}", build2)
        console.print(f"stage 2: held-out Task 0 accuracy {s2['task0_heldout']['acc']:.3f} "
                      f"(prior {attribute_priors(heldout)['pooled']:.3f})"
                      + (" [cached]" if s2["cached"] else ""), highlight=False)
        results = []
        for name in [m for m in METHOD_ORDER if m in methods]:
            results.append(_run_method(rc, data, prepared[name], cache / f"stage2-{k2}", out, preset_name,
                                       {"data_s": round(data_s, 1), "stage1": s1, "stage2": s2}, force, dev,
                                       started,
                                       autocast, progress))
    _print_summary(results)
    return results


def _run_method(rc, data: BioData, method, stage2_dir: Path, out: Path, preset_name: str, stages: dict,
                force: bool, dev, started: dict, autocast, progress) -> dict[str, Any]:
    name = method.name
    run_dir = out / f"{preset_name}-{name}-{config_hash(asdict(rc), name, method.options())}"
    if (run_dir / "result.json").exists() and not force:
        console.print(f"{name}: finished run found at {run_dir} (use --force to rerun)", highlight=False)
        return json.loads((run_dir / "result.json").read_text())
    model = method.apply(load_model(stage2_dir)).to(dev)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_total = sum(p.numel() for p in model.parameters())
    console.print(f"{name}: {method.describe()} — trainable {n_train:,} / {n_total:,}", highlight=False)
    lr = rc.stage3.lr * rc.lr_scale.get(name, 1.0)
    t0_slice, t1_slice = _slice(data.qa["task0_heldout"], rc.eval.slice_people), _slice(data.qa["task1"],
                                                                                          rc.eval.slice_people)
    eval_steps = set(rc.eval.steps(rc.stage3.steps))
    lines: list[str] = []
    records: list[dict] = []
    run_dir.mkdir(parents=True, exist_ok=True)
    live = run_dir / "metrics.jsonl.partial"  # streamed while running; renamed when the run finishes

    def stats(mask):
        return method.metrics(model, mask)

    def on_step(step: int, loss: float) -> None:
        if step not in eval_steps:
            return
        rec = {"step": step, "loss": None if step == 0 else round(loss, 6)}
        rec |= _flat("task0", qa_accuracy(model, t0_slice, rc.eval.batch, stats=stats))
        route = {k: v for k, v in rec.items() if k.startswith("task0/route")}
        rec |= _flat("task1", qa_accuracy(model, t1_slice, rc.eval.batch, stats=stats))
        rec |= {k.removeprefix("task0/"): v for k, v in route.items()}  # routing on the Task 0 slice
        records.append(rec)
        lines.append(json.dumps(rec))
        write_atomic(live, "\n".join(lines) + "\n")

    t = time.perf_counter()
    train(model, qa_batches(data.qa["task1"], rc.stage3.batch, rc.seed + 3), rc.stage3.steps,
          _optim(rc.stage3, lr), on_step=on_step, progress=progress, desc=f"stage 3: {name}", autocast_dtype=autocast)
    wall = time.perf_counter() - t
    final = {"task0_heldout": qa_accuracy(model, data.qa["task0_heldout"], rc.eval.batch, exact=True),
             "task1": qa_accuracy(model, data.qa["task1"], rc.eval.batch, exact=True)}
    t0 = [r["task0/acc"] for r in records]
    t1 = [r["task1/acc"] for r in records]
    result = {
        "experiment": "bio", "preset": preset_name, "method": name, "method_options": method.options(),
        "description": method.describe(), "lr": lr, "trainable_params": n_train, "total_params": n_total,
        "config": asdict(rc), "data": asdict(data.cfg), "tokenizer": data.tokenizer_dir,
        "provenance": started | {"finished": provenance()["date"]},
        "wall_s": {"data": stages["data_s"], "stage1": stages["stage1"]["wall_s"], "stage2": stages["stage2"]["wall_s"],
                   "stage3": round(wall, 1)},
        "stages_cached": {"stage1": stages["stage1"]["cached"], "stage2": stages["stage2"]["cached"]},
        "stage2": {k: v for k, v in stages["stage2"].items() if k != "cached"},
        "priors": {"task0_heldout": attribute_priors(data.qa["task0_heldout"]), "task1": attribute_priors(data.qa["task1"])},
        "summary": {"task0_start": t0[0], "task0_end": t0[-1], "task0_min": min(t0), "task1_start": t1[0],
                    "task1_end": t1[-1]},
        "final": final,
    }
    write_atomic(run_dir / "metrics.jsonl", "\n".join(lines) + "\n")
    live.unlink(missing_ok=True)
    write_json(run_dir / "result.json", result)
    console.print(f"{name}: wrote {run_dir}", highlight=False)
    return result


def _print_summary(results: list[dict]) -> None:
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
