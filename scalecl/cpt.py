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
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from .checkpoint import load_model, read_meta
from .config import CorpusConfig, CptRunConfig, StageConfig
from .data.bilingual import FOLDERS, BilingualConfig, write_corpus
from .data.corpus import CorpusSpec, PackedChunks, RankBatches, check_corpus, eval_chunks, iter_texts
from .data.tokenizer import load_tokenizer
from .errors import ScaleclError
from .methods import get_method, method_names
from .models import load_base_config, load_base_model, model_from_config, tiny_config
from .perf import check_compute, configure_device
from .perplexity import final_hidden, perplexity, representation_cosine, upscaled_norms
from .runlayer import Dist, Run, check_out_dir, distributed, fit
from .runs import config_hash, pick_device, provenance
from .train import OptimConfig, progress_bar

console = Console()
METHOD_ORDER = ("fft", "lora", "freeze", "llama-pro", "scale-preserve", "scale-adapt", "scale-route")
BUILTIN = "builtin"


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
    a little Korean of other people, see scalecl.data.bilingual), cached. Rank 0 trains it (resuming its own
    checkpoints after a kill); the other processes wait."""
    key = config_hash(asdict(rc.builtin), tok_src, rc.model, rc.pretrain, rc.seed)
    path = cache / "cpt" / f"base-{key}"
    identity = {"experiment": "cpt-base", "name": f"base-{key}", "method": None, "options": {}, "config_hash": key}
    run = Run(identity, None, cache / "cpt" / "checkpoints" / f"base-{key}", final_dir=path, keep=rc.checkpoint.keep)
    info = None
    if d.main and read_meta(path) is None:
        spec = corpus_spec(CorpusConfig(path="builtin:base", split="train"), root)
        chunks = PackedChunks(lambda: iter_texts(spec), tokenizer, rc.model.context, loop=True, name="base corpus")
        config = _builtin_model_config(rc, len(tokenizer), tokenizer)
        t = time.perf_counter()
        res = fit(run, lambda: model_from_config(config, seed=rc.seed), RankBatches(chunks, rc.pretrain.batch),
                  rc.pretrain.steps, _optim(rc.pretrain), device=dev, resume="auto", save_every=rc.checkpoint.every,
                  autocast=autocast, progress=progress, desc="pre-train base", save_kw={"tokenizer": tokenizer},
                  compute=rc.compute)
        info = {"wall_s": round(time.perf_counter() - t, 1), "final_loss": res.losses[-1],
                "epochs_completed": chunks.epoch, "tokens": rc.pretrain.steps * rc.pretrain.batch * rc.model.context,
                "params": sum(p.numel() for p in res.model.parameters()),
                "provenance": {k: v for k, v in provenance().items() if k in ("date", "commit", "torch", "machine")}}
        run.finish(None, (res.model.cpu(), None, {"tokenizer": tokenizer, "extra": {"stage": info},
                                                  "base_model": "builtin (pre-trained on the stand-in's base corpus)"}))
        for p in run.checkpoints():
            shutil.rmtree(p, ignore_errors=True)
        info["cached"] = False
    d.barrier()
    if info is None:
        info = {**(read_meta(path) or {}).get("stage", {}), "cached": True}
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


def method_run(rc: CptRunConfig, method, out: Path, checkpoints: Path, preset: str, d: Dist = Dist()) -> Run:
    """The run of one method, named by everything its numbers depend on (not checkpointing, not other
    methods' options or rates)."""
    named = {k: v for k, v in asdict(rc).items() if k not in ("checkpoint", "methods", "lr", "compute")}
    h = config_hash(named, method.name, method.options(), rc.lr[method.name])
    name = f"{preset}-{method.name}-{h}"
    identity = {"experiment": "cpt", "name": name, "method": method.name, "options": method.options(),
                "config_hash": h}
    return Run(identity, out / name, checkpoints / "cpt" / name, keep=rc.checkpoint.keep, main=d.main)


def _run_method(ctx: Context, method, run: Run, force: bool, resume: bool, stop_after: int | None,
                report_to: tuple[str, ...] = ()) -> dict[str, Any] | None:
    rc, d, name = ctx.rc, ctx.d, method.name
    lr = rc.lr[name]
    t_cfg = rc.train
    micro = t_cfg.micro_batch or t_cfg.batch // d.world
    accum = t_cfg.batch // (micro * d.world)

    def build():
        torch.manual_seed(rc.seed)
        return method.apply(ctx.load_base())

    chunks = PackedChunks(lambda: iter_texts(ctx.train_spec), ctx.tokenizer, t_cfg.seq_len, loop=True,
                          name="training corpus")
    oc = OptimConfig(lr=lr, weight_decay=t_cfg.weight_decay, beta1=t_cfg.beta1, beta2=t_cfg.beta2, eps=t_cfg.eps,
                     warmup_steps=round(t_cfg.warmup_ratio * t_cfg.steps), schedule=t_cfg.schedule,
                     min_lr_ratio=t_cfg.min_lr_ratio, clip=t_cfg.clip)
    every = rc.eval.every or t_cfg.steps
    eval_steps = set(range(0, t_cfg.steps + 1, every)) | {t_cfg.steps}
    save_kw = {"base_model": ctx.base_source, "tokenizer": ctx.tokenizer}
    res = fit(run, build, RankBatches(chunks, micro, d.world, d.rank), t_cfg.steps, oc, method=method, device=ctx.dev,
              evaluate=lambda m, step, loss: _evaluate(ctx, m, method, step, loss), eval_steps=eval_steps,
              resume=resume, force=force, save_every=rc.checkpoint.every, stop_at=stop_after, accum=accum,
              autocast=ctx.autocast, d=d, progress=ctx.progress, desc=f"cpt: {name}", save_kw=save_kw,
              say=ctx.say, report_to=report_to, compute=rc.compute,
              config={"method": name, "options": method.options(), "lr": lr, **asdict(rc)})
    if not res.complete:
        return None
    model, records = res.model, res.records
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_total = sum(p.numel() for p in model.parameters())
    result = None
    if d.main:
        first, last = records[0], records[-1]
        result = {
            "experiment": "cpt", "preset": ctx.preset, "method": name, "method_options": method.options(),
            "description": method.describe(), "lr": lr, "trainable_params": n_train, "total_params": n_total,
            "config": asdict(rc), "base": {"source": ctx.base_source, **ctx.base_info},
            "tokenizer": ctx.tok_src, "processes": d.world, "micro_batch": micro, "accumulation": accum,
            "speed": res.speed,
            "data": {"train": ctx.train_spec.describe(), "epochs_completed": chunks.epoch,
                     "old_eval": {"slice": ctx.old_spec, "tokens": ctx.timings["old_tokens"],
                                  "sequences": len(ctx.old_chunks)},
                     "new_eval": {"slice": ctx.new_spec, "tokens": ctx.timings["new_tokens"],
                                  "sequences": len(ctx.new_chunks)},
                     "rep_batch": list(ctx.rep_ids.shape)},
            "provenance": provenance() | {"device": str(ctx.dev)},
            "wall_s": {"data": round(ctx.data_s, 1), "base": ctx.base_info.get("wall_s"),
                       "train": res.timing["train_s"], "eval": res.timing["eval_s"]},
            "summary": {"old_ppl_start": first["old/ppl"], "old_ppl_end": last["old/ppl"],
                        "old_ppl_max": max(r["old/ppl"] for r in records),
                        "new_ppl_start": first["new/ppl"], "new_ppl_end": last["new/ppl"],
                        "rep_cos_start": first["rep_cos"], "rep_cos_end": last["rep_cos"],
                        "rep_cos_min": min(r["rep_cos"] for r in records), "final_loss": res.losses[-1]},
            "final": last,
            "checkpoint": str(run.final_dir),
        }
        if res.resumed_from:
            result["resumed_from_step"] = res.resumed_from
        run.finish(result, (res.export, method, save_kw))
        ctx.say(f"{name}: wrote {run.out_dir}; final model {run.final_dir}")
    d.barrier()
    return result


# ---------------------------------------------------------------------------------------------------------
# the experiment


def _validate(rc: CptRunConfig, methods: list[str], d: Dist) -> None:
    """Checks across keys that need no download and write nothing (each key's type and range: load_preset)."""
    for name in methods:
        if name not in method_names():
            raise ScaleclError(f"unknown method {name!r}; choose one of {', '.join(METHOD_ORDER)} or all")
        if name not in rc.lr:
            raise ScaleclError(f"no learning rate for {name}: set lr.{name}")
    t = rc.train
    micro = t.micro_batch or t.batch // d.world
    if micro < 1 or t.batch % (micro * d.world):
        raise ScaleclError(f"train.batch={t.batch} must be a multiple of micro_batch x processes = "
                           f"{t.micro_batch or '(batch / processes)'} x {d.world}")


def run_cpt(
    rc: CptRunConfig, methods: list[str], out: Path, cache: Path, checkpoints: Path, preset_name: str,
    force: bool = False, resume: bool = False, stop_after: int | None = None, device: str | None = None,
    report_to: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """Continual pre-training of each method from the same base; returns one result dict per method run."""
    with distributed() as d:
        return _run_cpt(d, rc, methods, out, cache, checkpoints, preset_name, force, resume, stop_after, device,
                        report_to)


def _status(d: Dist, text: str):
    return console.status(text) if d.main else contextlib.nullcontext()


@dataclass
class Checked:
    """What check_cpt resolved: device, methods, the base's config, the builtin corpus config (if used)."""

    dev: torch.device
    prepared: dict[str, Any]
    base_cfg: Any
    bilingual: BilingualConfig | None


def check_cpt(rc: CptRunConfig, methods: list[str], out: Path, cache: Path, checkpoints: Path,
              device: str | None, d: Dist = Dist()) -> Checked:
    """Every check that writes nothing: names, device, folders, corpora, the base's config, each method's sizes."""
    _validate(rc, methods, d)
    if d.world > 1 and device in (None, "cuda") and torch.cuda.is_available():
        device = f"cuda:{d.local_rank}"  # one GPU per process
    dev = pick_device(device)
    check_compute(rc.compute, dev, d.world)
    for path, what in ((out, "--out"), (cache, "--cache"), (checkpoints, "--checkpoints")):
        check_out_dir(path, what)
    corpora = {"data": rc.data, "old_eval": rc.old_eval, "new_eval": rc.new_eval}
    uses_builtin = rc.base == BUILTIN or any(c.path.startswith(f"{BUILTIN}:") for c in corpora.values())
    for where, cc in corpora.items():
        if cc.path.startswith(f"{BUILTIN}:"):
            _check_builtin_spec(cc, where)
        else:
            check_corpus(corpus_spec(cc, None))
    bil = _bilingual(rc) if uses_builtin else None
    base_cfg = _builtin_model_config(rc, rc.builtin.vocab) if rc.base == BUILTIN else load_base_config(rc.base)
    n_pos = max_positions(base_cfg)
    if n_pos is not None and rc.train.seq_len > n_pos:
        raise ScaleclError(f"train.seq_len={rc.train.seq_len} exceeds the model's {n_pos} positions")
    prepared = {name: get_method(name, **rc.method_options(name)) for name in methods}
    for m in prepared.values():
        m.check(base_cfg)
    return Checked(dev, prepared, base_cfg, bil)


def _run_cpt(d: Dist, rc: CptRunConfig, methods: list[str], out: Path, cache: Path, checkpoints: Path,
             preset_name: str, force: bool, resume: bool, stop_after: int | None, device: str | None,
             report_to: tuple[str, ...] = ()) -> list[dict]:
    t0 = time.perf_counter()
    # 1. checks before anything is written, and the finished runs (found before anything is built)
    checked = check_cpt(rc, methods, out, cache, checkpoints, device, d)
    dev, prepared, bil = checked.dev, checked.prepared, checked.bilingual
    uses_builtin = bil is not None
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    configure_device(dev, rc.compute.tf32)
    autocast = torch.bfloat16 if rc.dtype == "bfloat16" and dev.type == "cuda" else None
    order = [m for m in METHOD_ORDER if m in methods]
    runs = {name: method_run(rc, prepared[name], out, checkpoints, preset_name, d) for name in order}
    done = {name: runs[name].result() for name in order}
    todo = [name for name in order if force or done[name] is None]
    for name in order:
        if name not in todo and d.main:
            console.print(f"{name}: finished run found at {runs[name].out_dir} (use --force to rerun)", highlight=False)
    if not todo:  # nothing to train: no corpus, base or evaluation set is built
        if d.main:
            _print_summary([done[n] for n in order])
        return [done[n] for n in order] if d.main else []

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
        for name in order:
            r = done[name] if name not in todo else _run_method(ctx, prepared[name], runs[name], force, resume,
                                                                  stop_after, report_to)
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
    """Perplexity of a saved checkpoint (scalecl or plain transformers) on a dataset slice.

    Everything that can be wrong with the input (model folder, its config, the tokenizer, the dataset, the
    sequence length, the device) is checked before the builtin corpus is generated or weights are loaded.
    """
    from transformers import AutoConfig

    if not Path(model_path).is_dir():
        raise ScaleclError(f"model path {model_path} does not exist or is not a directory")
    try:
        meta = read_meta(model_path)
        config = AutoConfig.from_pretrained(model_path) if meta is not None else load_base_config(model_path)
    except (OSError, ValueError) as e:
        raise ScaleclError(f"{model_path} is not a readable checkpoint ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''})") from None
    dev = pick_device(device)
    n_pos = max_positions(config)
    if seq_len is None:
        seq_len = min(n_pos or 2048, 2048)
    if n_pos is not None and seq_len > n_pos:
        raise ScaleclError(f"--seq-len {seq_len} exceeds the model's {n_pos} positions")
    if seq_len < 2:
        raise ScaleclError(f"--seq-len must be at least 2, got {seq_len}")
    src = tokenizer or model_path
    try:
        tok = load_tokenizer(src)
    except (OSError, ValueError) as e:
        raise ScaleclError(f"cannot load a tokenizer from {src} (pass --tokenizer): {str(e).splitlines()[0]}") from None
    root = None
    if spec_cfg.path.startswith(f"{BUILTIN}:"):
        _check_builtin_spec(spec_cfg, "dataset")
        rc = CptRunConfig()
        bil = _bilingual(rc)
        check_out_dir(cache, "--cache")
        root = builtin_root(rc, cache)
        write_corpus(root, bil, rc.builtin.vocab)
    else:
        check_corpus(corpus_spec(spec_cfg, None))
    spec = corpus_spec(spec_cfg, root)
    t = time.perf_counter()
    chunks = eval_chunks(spec, tok, seq_len, "dataset")
    model = load_model(model_path).to(dev)
    method = get_method(meta["method"], **meta["options"]) if meta and meta.get("method") else None
    stats = (lambda mask: method.metrics(model, mask)) if method is not None else None
    r = perplexity(model, chunks, batch, stats=stats)
    return {"model": str(model_path), "method": meta.get("method") if meta else None,
            "dataset": asdict(spec_cfg) | {"resolved": spec.describe()}, "tokenizer": src, **r,
            "wall_s": round(time.perf_counter() - t, 2), "provenance": provenance()}
