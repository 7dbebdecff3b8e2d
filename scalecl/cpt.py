"""Continual pre-training on a new language with forgetting / learning perplexity (paper Sec. 3.2-3.3, 5.1).

A pre-trained model (Llama-3.2-1B in the paper; offline, a small Llama pre-trained here on the English
domain of the bilingual stand-in plus a little Korean, scalecl.data.bilingual) is trained on a new-language corpus with one
method. Every `eval.every` steps the run records
  old/ppl   forgetting perplexity on a fixed held-out slice of the old domain (FineWeb-Edu; stand-in English),
  new/ppl   learning perplexity on the new domain's held-out slice (FineWeb2 kor_Hang test; stand-in Korean),
  rep_cos   representation forgetting (Fig. 4a): mean per-token cosine between the first d channels of the
            final hidden state (after the final norm) now and the base model's on a fixed batch of
            old-domain chunks. Every method starts at the base function, so the step-0 value says how
            exactly it does; Route is measured on its adapt path (its preserve path is the base exactly),
  up_norm   SCALE only (Fig. 7): mean Frobenius norm of the upscaled blocks (and of the training W12),
  */route_preserve, */route_adapt  SCALE-Route's routing fractions on each evaluation set.

Data parallel: run the same command under `torchrun --nproc_per_node N` (or `accelerate launch`): each
process trains a DistributedDataParallel replica on its share of every global batch (train.batch
sequences per step whatever N is; accumulation = batch / (micro_batch * N)); evaluation is sharded; only
rank 0 writes. Checkpoints (model + optimizer, schedule, RNG and data position) go to
<checkpoints>/cpt/<run>/step-N every checkpoint.every steps; --resume continues from the latest one with
the numbers an uninterrupted run would have produced.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console
from rich.table import Table

from .checkpoint import load_model, save_model
from .config import CorpusConfig, CptRunConfig, StageConfig
from .data.bilingual import FOLDERS, BilingualConfig, write_corpus
from .data.corpus import CorpusSpec, PackedChunks, RankBatches, check_corpus, eval_chunks, iter_texts
from .data.tokenizer import load_tokenizer
from .errors import ScaleclError
from .methods import get_method, method_names
from .models import load_base_config, load_base_model, model_from_config, tiny_config
from .perplexity import final_hidden, perplexity, representation_cosine, upscaled_norms
from .runs import config_hash, pick_device, provenance, write_atomic, write_json
from .train import OptimConfig, progress_bar, train

console = Console()
METHOD_ORDER = ("fft", "lora", "freeze", "llama-pro", "scale-preserve", "scale-adapt", "scale-route")
BUILTIN = "builtin"


# ---------------------------------------------------------------------------------------------------------
# processes


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def init_distributed() -> Dist:
    """Join the process group torchrun / accelerate launch set up (WORLD_SIZE > 1); a no-op otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=timedelta(hours=3))  # rank 0 may pre-train the builtin base
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


# ---------------------------------------------------------------------------------------------------------
# data and base model


def _optim(sc: StageConfig) -> OptimConfig:
    return OptimConfig(lr=sc.lr, weight_decay=sc.weight_decay, beta1=sc.beta1, beta2=sc.beta2, eps=sc.eps,
                       warmup_steps=sc.warmup, schedule=sc.schedule, min_lr_ratio=sc.min_lr_ratio, clip=sc.clip)


def builtin_root(rc: CptRunConfig, cache: Path) -> Path:
    return cache / "cpt" / f"corpus-{config_hash(asdict(rc.builtin), rc.seed)}"


def _bilingual(rc: CptRunConfig) -> BilingualConfig:
    b = rc.builtin
    try:
        return BilingualConfig(people=b.people, heldout=b.heldout, texts=b.texts, base_korean=b.base_korean,
                               seed=rc.seed)
    except ValueError as e:
        raise ScaleclError(f"builtin corpus: {e}") from None


def _check_builtin_spec(cc: CorpusConfig, where: str) -> None:
    folder = cc.path.split(":", 1)[1]
    if folder not in FOLDERS:
        raise ScaleclError(f"{where}.path {cc.path!r}: the builtin corpus has "
                           f"{', '.join('builtin:' + f for f in FOLDERS)}")
    if cc.split not in FOLDERS[folder] or cc.name or cc.text_column != "text":
        raise ScaleclError(f"{where}: builtin:{folder} has the splits {'/'.join(FOLDERS[folder])}, no config name and the "
                           f"text column 'text' (got split={cc.split!r}, name={cc.name!r}, "
                           f"text_column={cc.text_column!r})")


def corpus_spec(cc: CorpusConfig, root: Path | None) -> CorpusSpec:
    """The streaming spec of a configured corpus; builtin:<lang> resolves to the generated folder."""
    path = cc.path
    if path.startswith(f"{BUILTIN}:"):
        path = str(root / path.split(":", 1)[1])
    return CorpusSpec(path, cc.name, cc.split, cc.text_column, cc.skip, cc.take)


def max_positions(config) -> int | None:
    return getattr(config, "max_position_embeddings", None)


def _builtin_model_config(rc: CptRunConfig, vocab: int, tokenizer=None):
    m = rc.model
    if m.hidden % m.heads or m.heads % m.kv_heads:
        raise ScaleclError(f"model: hidden={m.hidden} must be a multiple of heads={m.heads}, and heads of "
                           f"kv_heads={m.kv_heads}")
    kw: dict[str, Any] = dict(vocab_size=vocab, hidden_size=m.hidden, num_hidden_layers=m.layers,
                              num_attention_heads=m.heads, intermediate_size=m.ffn, max_position_embeddings=m.context,
                              tie_word_embeddings=m.tie_embeddings)
    if m.arch == "llama":
        kw["num_key_value_heads"] = m.kv_heads
    if tokenizer is not None:
        kw |= dict(eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    return tiny_config(m.arch, **kw)


def _tokenizer(rc: CptRunConfig, root: Path | None):
    src = rc.tokenizer or (str(root / "tokenizer") if rc.base == BUILTIN else rc.base)
    try:
        return load_tokenizer(src), src
    except (OSError, ValueError) as e:
        raise ScaleclError(f"cannot load the tokenizer {src}: {str(e).splitlines()[0]}") from None


def _pretrain_base(rc: CptRunConfig, tokenizer, tok_src: str, root: Path, cache: Path, dev, autocast,
                   d: Dist, progress) -> tuple[Path, dict]:
    """The builtin base: a small decoder pre-trained on the stand-in's base corpus (English training split plus
    a little Korean of other people, see scalecl.data.bilingual), cached."""
    key = config_hash(asdict(rc.builtin), tok_src, rc.model, rc.pretrain, rc.seed)
    path = cache / "cpt" / f"base-{key}"
    if d.main and not (path / "scalecl.json").exists():
        config = _builtin_model_config(rc, len(tokenizer), tokenizer)
        model = model_from_config(config, seed=rc.seed).to(dev)
        spec = corpus_spec(CorpusConfig(path="builtin:base", split="train"), root)
        chunks = PackedChunks(lambda: iter_texts(spec), tokenizer, rc.model.context, loop=True, name="base corpus")
        t = time.perf_counter()
        torch.manual_seed(rc.seed)
        losses = train(model, RankBatches(chunks, rc.pretrain.batch), rc.pretrain.steps, _optim(rc.pretrain),
                       progress=progress, desc="pre-train base", autocast_dtype=autocast)
        info = {"wall_s": round(time.perf_counter() - t, 1), "final_loss": losses[-1], "epochs_completed": chunks.epoch,
                "tokens": rc.pretrain.steps * rc.pretrain.batch * rc.model.context,
                "params": sum(p.numel() for p in model.parameters())}
        save_model(model.cpu(), path, base_model="builtin (pre-trained on the stand-in's base corpus)",
                   tokenizer=tokenizer, extra={"stage": info})
        info["cached"] = False
    else:
        info = None
    d.barrier()
    if info is None:
        info = {**json.loads((path / "scalecl.json").read_text()).get("stage", {}), "cached": True}
    return path, info


# ---------------------------------------------------------------------------------------------------------
# one run


@dataclass
class Context:
    """Everything the methods share: data, base, evaluation sets, reference hidden states."""

    rc: CptRunConfig
    preset: str
    out: Path
    checkpoints: Path
    dev: torch.device
    autocast: torch.dtype | None
    d: Dist
    tokenizer: Any
    tok_src: str
    load_base: Any  # () -> fresh base model (cpu)
    base_source: str
    base_info: dict
    d_model: int
    train_spec: CorpusSpec
    old_chunks: list[torch.Tensor]
    new_chunks: list[torch.Tensor]
    rep_ids: torch.Tensor  # (rep_batch, T) fixed old-domain chunks (Fig. 4a)
    h0: torch.Tensor  # (rep_batch, T, d) the base model's final hidden state on them
    data_s: float
    progress: Any = None
    timings: dict = field(default_factory=dict)
    old_spec: str = ""
    new_spec: str = ""

    def say(self, text: str) -> None:
        if self.d.main:
            console.print(text, highlight=False)


def _evaluate(ctx: Context, model, method, step: int, loss: float) -> dict[str, Any]:
    rc = ctx.rc

    def stats(mask):
        return method.metrics(model, mask)

    rec: dict[str, Any] = {"step": step, "loss": None if step == 0 else round(loss, 6),
                           "tokens": step * rc.train.batch * rc.train.seq_len}
    for split, chunks in (("old", ctx.old_chunks), ("new", ctx.new_chunks)):
        r = perplexity(model, chunks, rc.eval.batch, ctx.autocast, stats)
        rec |= {f"{split}/ppl": round(r["ppl"], 6), f"{split}/nll": round(r["nll"], 6)}
        rec |= {f"{split}/{k}": round(v, 6) for k, v in r.items() if k.startswith("route_")}
    rec["rep_cos"] = round(representation_cosine(ctx.h0, final_hidden(model, ctx.rep_ids.to(ctx.dev), ctx.d_model)), 9)
    rec |= {k: round(v, 6) for k, v in upscaled_norms(model).items()}
    return rec


def _latest_checkpoint(root: Path) -> Path | None:
    done = sorted(p for p in root.glob("step-*") if (p / "trainer_state.pt").exists())
    return done[-1] if done else None


def _run_method(ctx: Context, method, force: bool, resume: bool, stop_after: int | None) -> dict[str, Any] | None:
    rc, d, name = ctx.rc, ctx.d, method.name
    named = {k: v for k, v in asdict(rc).items() if k != "checkpoint"}  # checkpointing does not change results
    run_name = f"{ctx.preset}-{name}-{config_hash(named, name, method.options())}"
    run_dir, ckpt_root = ctx.out / run_name, ctx.checkpoints / "cpt" / run_name
    if (run_dir / "result.json").exists() and not force:
        ctx.say(f"{name}: finished run found at {run_dir} (use --force to rerun)")
        return json.loads((run_dir / "result.json").read_text())
    start = _latest_checkpoint(ckpt_root) if resume else None
    state = None
    if start is not None:
        state = torch.load(start / "trainer_state.pt", weights_only=False)
        model = load_model(start / "model")
        ctx.say(f"{name}: resuming from {start} (step {state['step']})")
    else:
        if resume:
            ctx.say(f"{name}: no checkpoint under {ckpt_root}; starting from step 0")
        torch.manual_seed(rc.seed)
        model = method.apply(ctx.load_base())
    model = model.to(ctx.dev)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_total = sum(p.numel() for p in model.parameters())
    lr = rc.lr[name]
    ctx.say(f"{name}: {method.describe()} — trainable {n_train:,} / {n_total:,}, lr {lr:g}")
    t_cfg = rc.train
    micro = t_cfg.micro_batch or t_cfg.batch // d.world
    accum = t_cfg.batch // (micro * d.world)
    wrapped = model
    if d.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[ctx.dev.index] if ctx.dev.type == "cuda" else None)
    chunks = PackedChunks(lambda: iter_texts(ctx.train_spec), ctx.tokenizer, t_cfg.seq_len, loop=True,
                          name="training corpus")
    batches = RankBatches(chunks, micro, d.world, d.rank)
    oc = OptimConfig(lr=lr, weight_decay=t_cfg.weight_decay, beta1=t_cfg.beta1, beta2=t_cfg.beta2, eps=t_cfg.eps,
                     warmup_steps=round(t_cfg.warmup_ratio * t_cfg.steps), schedule=t_cfg.schedule,
                     min_lr_ratio=t_cfg.min_lr_ratio, clip=t_cfg.clip)
    every = rc.eval.every or t_cfg.steps
    eval_steps = set(range(0, t_cfg.steps + 1, every)) | {t_cfg.steps}
    records: list[dict] = list(state["records"]) if state else []
    timing = dict(state["timing"]) if state else {"train_s": 0.0, "eval_s": 0.0}
    live = run_dir / "metrics.jsonl.partial"  # streamed while running; renamed when the run finishes

    def write_live() -> None:
        if d.main:
            write_atomic(live, "".join(json.dumps(r) + "\n" for r in records))

    if state is not None:
        write_live()
    clock = [time.perf_counter()]

    def on_step(step: int, loss: float) -> None:
        if step not in eval_steps:
            return
        t = time.perf_counter()
        timing["train_s"] += t - clock[0]
        records.append(_evaluate(ctx, model, method, step, loss))
        write_live()
        clock[0] = time.perf_counter()
        timing["eval_s"] += clock[0] - t

    def on_save(step: int, tstate: dict) -> None:
        timing["train_s"] += time.perf_counter() - clock[0]
        clock[0] = time.perf_counter()
        if d.main:
            _save_checkpoint(ckpt_root, step, model, method, ctx, tstate | {"records": records, "timing": timing})
        d.barrier()

    losses = train(wrapped, batches, t_cfg.steps, oc, on_step=on_step, progress=ctx.progress, desc=f"cpt: {name}",
                   autocast_dtype=ctx.autocast, accum=accum, save_every=rc.checkpoint.every, on_save=on_save,
                   resume=state, stop_at=stop_after)
    if len(losses) < t_cfg.steps:
        ctx.say(f"{name}: stopped after step {len(losses)}; continue with --resume")
        return None
    timing["train_s"] += time.perf_counter() - clock[0]
    final_dir = ckpt_root / "final"
    result = None
    if d.main:
        save_model(model, final_dir, method, base_model=ctx.base_source, tokenizer=ctx.tokenizer)
        first, last = records[0], records[-1]
        result = {
            "experiment": "cpt", "preset": ctx.preset, "method": name, "method_options": method.options(),
            "description": method.describe(), "lr": lr, "trainable_params": n_train, "total_params": n_total,
            "config": asdict(rc), "base": {"source": ctx.base_source, **ctx.base_info},
            "tokenizer": ctx.tok_src, "processes": d.world, "micro_batch": micro, "accumulation": accum,
            "data": {"train": ctx.train_spec.describe(), "epochs_completed": chunks.epoch,
                     "old_eval": {"slice": ctx.old_spec, "tokens": ctx.timings["old_tokens"],
                                  "sequences": len(ctx.old_chunks)},
                     "new_eval": {"slice": ctx.new_spec, "tokens": ctx.timings["new_tokens"],
                                  "sequences": len(ctx.new_chunks)},
                     "rep_batch": list(ctx.rep_ids.shape)},
            "provenance": provenance() | {"device": str(ctx.dev)},
            "wall_s": {"data": round(ctx.data_s, 1), "base": ctx.base_info.get("wall_s"),
                       "train": round(timing["train_s"], 1), "eval": round(timing["eval_s"], 1)},
            "summary": {"old_ppl_start": first["old/ppl"], "old_ppl_end": last["old/ppl"],
                        "old_ppl_max": max(r["old/ppl"] for r in records),
                        "new_ppl_start": first["new/ppl"], "new_ppl_end": last["new/ppl"],
                        "rep_cos_start": first["rep_cos"], "rep_cos_end": last["rep_cos"],
                        "rep_cos_min": min(r["rep_cos"] for r in records), "final_loss": losses[-1]},
            "final": last,
            "checkpoint": str(final_dir),
        }
        write_atomic(run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records))
        live.unlink(missing_ok=True)
        write_json(run_dir / "result.json", result)
        ctx.say(f"{name}: wrote {run_dir}; final model {final_dir}")
    d.barrier()
    return result


def _save_checkpoint(root: Path, step: int, model, method, ctx: Context, state: dict) -> None:
    """step-N/model (a scalecl checkpoint) + step-N/trainer_state.pt, which is written last: its presence
    marks the checkpoint complete. Only the newest checkpoint.keep are kept."""
    path = root / f"step-{step:07d}"
    if path.exists():
        shutil.rmtree(path)
    save_model(model, path / "model", method, base_model=ctx.base_source, tokenizer=ctx.tokenizer)
    fd, tmp = tempfile.mkstemp(prefix=".trainer_state.", dir=path)
    os.close(fd)
    torch.save(state, tmp)
    os.replace(tmp, path / "trainer_state.pt")
    done = sorted(p for p in root.glob("step-*") if (p / "trainer_state.pt").exists())
    for old in done[: max(len(done) - max(ctx.rc.checkpoint.keep, 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------
# the experiment


def _validate(rc: CptRunConfig, methods: list[str], d: Dist) -> None:
    """Every check that needs no download and writes nothing."""
    for name in methods:
        if name not in method_names():
            raise ScaleclError(f"unknown method {name!r}; choose one of {', '.join(METHOD_ORDER)} or all")
        if name not in rc.lr:
            raise ScaleclError(f"no learning rate for {name}: set lr.{name}")
    t = rc.train
    if t.steps < 1 or t.batch < 1 or t.micro_batch < 0:
        raise ScaleclError(f"train.steps and train.batch must be positive, got steps={t.steps}, batch={t.batch}")
    micro = t.micro_batch or t.batch // d.world
    if micro < 1 or t.batch % (micro * d.world):
        raise ScaleclError(f"train.batch={t.batch} must be a multiple of micro_batch x processes = "
                           f"{t.micro_batch or '(batch / processes)'} x {d.world}")
    if t.schedule not in ("linear", "cosine", "constant"):
        raise ScaleclError(f"train.schedule must be linear, cosine or constant, got {t.schedule!r}")
    if not 0.0 <= t.warmup_ratio < 1.0:
        raise ScaleclError(f"train.warmup_ratio must lie in [0, 1), got {t.warmup_ratio}")
    if rc.dtype not in ("float32", "bfloat16"):
        raise ScaleclError(f"dtype must be float32 or bfloat16, got {rc.dtype!r}")
    if rc.eval.every < 0 or rc.eval.batch < 1 or rc.eval.rep_batch < 1:
        raise ScaleclError("eval.every must be >= 0, eval.batch and eval.rep_batch >= 1")


def run_cpt(
    rc: CptRunConfig, methods: list[str], out: Path, cache: Path, checkpoints: Path, preset_name: str,
    force: bool = False, resume: bool = False, stop_after: int | None = None, device: str | None = None,
) -> list[dict[str, Any]]:
    """Continual pre-training of each method from the same base; returns one result dict per method run."""
    d = init_distributed()
    try:
        return _run_cpt(d, rc, methods, out, cache, checkpoints, preset_name, force, resume, stop_after, device)
    finally:
        if d.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _status(d: Dist, text: str):
    return console.status(text) if d.main else contextlib.nullcontext()


def _run_cpt(d: Dist, rc: CptRunConfig, methods: list[str], out: Path, cache: Path, checkpoints: Path,
             preset_name: str, force: bool, resume: bool, stop_after: int | None, device: str | None) -> list[dict]:
    _validate(rc, methods, d)
    if d.world > 1 and device in (None, "cuda") and torch.cuda.is_available():
        device = f"cuda:{d.local_rank}"  # one GPU per process
    dev = pick_device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    autocast = torch.bfloat16 if rc.dtype == "bfloat16" and dev.type == "cuda" else None
    corpora = {"data": rc.data, "old_eval": rc.old_eval, "new_eval": rc.new_eval}
    t0 = time.perf_counter()
    # 1. checks before anything is written: user corpora, base config, sizes, method options
    uses_builtin = rc.base == BUILTIN or any(c.path.startswith(f"{BUILTIN}:") for c in corpora.values())
    for where, cc in corpora.items():
        if cc.path.startswith(f"{BUILTIN}:"):
            _check_builtin_spec(cc, where)
        else:
            check_corpus(corpus_spec(cc, None))
    if uses_builtin:
        bil = _bilingual(rc)
    if rc.base == BUILTIN:
        base_cfg = _builtin_model_config(rc, rc.builtin.vocab)
    else:
        base_cfg = load_base_config(rc.base)
    n_pos = max_positions(base_cfg)
    if n_pos is not None and rc.train.seq_len > n_pos:
        raise ScaleclError(f"train.seq_len={rc.train.seq_len} exceeds the model's {n_pos} positions")
    if rc.train.seq_len < 2:
        raise ScaleclError(f"train.seq_len must be at least 2, got {rc.train.seq_len}")
    prepared = {name: get_method(name, **rc.method_options(name)) for name in methods}
    for m in prepared.values():
        m.check(base_cfg)

    # 2. the builtin corpus (generated once), tokenizer, base model
    root = builtin_root(rc, cache) if uses_builtin else None
    if uses_builtin:
        if d.main:
            with _status(d, "generating the bilingual stand-in corpus"):
                write_corpus(root, bil, rc.builtin.vocab)
        d.barrier()
    tokenizer, tok_src = _tokenizer(rc, root)
    train_spec = corpus_spec(rc.data, root)
    old_spec, new_spec = corpus_spec(rc.old_eval, root), corpus_spec(rc.new_eval, root)
    seq = rc.train.seq_len
    with _status(d, "tokenising the evaluation sets"):
        old_chunks = eval_chunks(old_spec, tokenizer, seq, "old-domain evaluation set")
        new_chunks = eval_chunks(new_spec, tokenizer, seq, "new-domain evaluation set")
    full = [c for c in old_chunks if len(c) == seq]
    if not full:
        raise ScaleclError(f"the old-domain evaluation set has no full {seq}-token chunk for the representation batch")
    rep_ids = torch.stack(full[: rc.eval.rep_batch])
    data_s = time.perf_counter() - t0

    with progress_bar() if d.main else contextlib.nullcontext() as prog:
        if rc.base == BUILTIN:
            base_path, base_info = _pretrain_base(rc, tokenizer, tok_src, root, cache, dev, autocast, d, prog)
            base_source = str(base_path)

            def load_base():
                return load_model(base_path)
        else:
            base_info, base_source = {}, rc.base

            def load_base():
                return load_base_model(rc.base)
        base = load_base().to(dev)
        h0 = final_hidden(base, rep_ids.to(dev), base.config.hidden_size)
        d_model = base.config.hidden_size
        del base
        ctx = Context(rc, preset_name, out, checkpoints, dev, autocast, d, tokenizer, tok_src, load_base, base_source,
                      base_info, d_model, train_spec, old_chunks, new_chunks, rep_ids, h0, data_s, prog)
        ctx.old_spec, ctx.new_spec = old_spec.describe(), new_spec.describe()
        ctx.timings = {"old_tokens": sum(len(c) - 1 for c in old_chunks),
                       "new_tokens": sum(len(c) - 1 for c in new_chunks)}
        base_line = (f"base: {base_source}" + (f" (pre-trained {base_info.get('wall_s')} s"
                                               f"{', cached' if base_info.get('cached') else ''})" if base_info else ""))
        ctx.say(f"{base_line}; vocab {len(tokenizer):,}; old-domain eval {ctx.timings['old_tokens']:,} tokens, "
                f"new-domain eval {ctx.timings['new_tokens']:,} tokens (seq {seq}); {d.world} process(es)")
        results = []
        for name in [m for m in METHOD_ORDER if m in methods]:
            r = _run_method(ctx, prepared[name], force, resume, stop_after)
            if r is not None:
                results.append(r)
    if not d.main:
        return []
    if results:
        _print_summary(results)
    return results


def _print_summary(results: list[dict]) -> None:
    table = Table(title="continual pre-training: forgetting (old-domain PPL) vs learning (new-domain PPL)")
    table.add_column("method", no_wrap=True)
    for col in ("old PPL start", "old PPL end", "new PPL start", "new PPL end", "rep cos end", "trainable"):
        table.add_column(col, justify="right")
    for r in results:
        s = r.get("summary", {})
        if "old_ppl_start" not in s:
            continue
        table.add_row(r["method"], f"{s['old_ppl_start']:.3f}", f"{s['old_ppl_end']:.3f}", f"{s['new_ppl_start']:.2f}",
                      f"{s['new_ppl_end']:.3f}", f"{s['rep_cos_end']:.4f}", f"{r['trainable_params']:,}")
    console.print(table)


# ---------------------------------------------------------------------------------------------------------
# eval-ppl


def eval_ppl(
    model_path: str, spec_cfg: CorpusConfig, seq_len: int | None, batch: int, cache: Path, tokenizer: str | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Perplexity of a saved checkpoint (scalecl or plain transformers) on a dataset slice."""
    from .checkpoint import read_meta

    if not Path(model_path).is_dir():
        raise ScaleclError(f"model path {model_path} does not exist or is not a directory")
    meta = read_meta(model_path)
    from transformers import AutoConfig

    if meta is not None:
        config = AutoConfig.from_pretrained(model_path)
    else:
        config = load_base_config(model_path)
    n_pos = max_positions(config)
    if seq_len is None:
        seq_len = min(n_pos or 2048, 2048)
    if n_pos is not None and seq_len > n_pos:
        raise ScaleclError(f"--seq-len {seq_len} exceeds the model's {n_pos} positions")
    if seq_len < 2:
        raise ScaleclError(f"--seq-len must be at least 2, got {seq_len}")
    root = None
    if spec_cfg.path.startswith(f"{BUILTIN}:"):
        _check_builtin_spec(spec_cfg, "dataset")
        rc = CptRunConfig()
        root = builtin_root(rc, cache)
        write_corpus(root, _bilingual(rc), rc.builtin.vocab)
    else:
        check_corpus(corpus_spec(spec_cfg, None))
    spec = corpus_spec(spec_cfg, root)
    src = tokenizer or model_path
    try:
        tok = load_tokenizer(src)
    except (OSError, ValueError) as e:
        raise ScaleclError(f"cannot load a tokenizer from {src} (pass --tokenizer): {str(e).splitlines()[0]}") from None
    t = time.perf_counter()
    chunks = eval_chunks(spec, tok, seq_len, "dataset")
    model = load_model(model_path).to(pick_device(device))
    method = get_method(meta["method"], **meta["options"]) if meta and meta.get("method") else None
    stats = (lambda mask: method.metrics(model, mask)) if method is not None else None
    r = perplexity(model, chunks, batch, stats=stats)
    return {"model": str(model_path), "method": meta.get("method") if meta else None,
            "dataset": asdict(spec_cfg) | {"resolved": spec.describe()}, "tokenizer": src, **r,
            "wall_s": round(time.perf_counter() - t, 2), "provenance": provenance()}
