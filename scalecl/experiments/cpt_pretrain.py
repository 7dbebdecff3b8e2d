"""The builtin base of continual pre-training (base = "builtin"): a small decoder of the config's `model` shape,
pre-trained on the offline stand-in's base corpus (its English training split plus a little Korean of other
people, scalecl.data.bilingual) and cached under a hash of everything it depends on, so that every method and
every later sweep of the same base starts from the same weights.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scalecl.common.errors import ScaleclError
from scalecl.common.schema import config_hash, named_dict, numerics_key
from scalecl.compute.machine import run_numerics
from scalecl.compute.perf import autocast_dtype
from scalecl.compute.processes import Dist
from scalecl.data.batches import RankBatches
from scalecl.data.corpus import PackedChunks, iter_texts
from scalecl.experiments.base import adopt_entry, cached_stage, path_key, stage_record, stage_run
from scalecl.experiments.config import CorpusConfig, CptRunConfig
from scalecl.experiments.corpora import corpus_spec
from scalecl.models.build import model_from_config, tiny_config
from scalecl.training.fit import Runtime, TrainPlan, fit
from scalecl.training.optim import OptimConfig
from scalecl.training.run import Run


def builtin_model_config(rc: CptRunConfig, vocab: int, tokenizer=None):
    """The builtin base's config: `model`'s shape with `vocab` rows (the tokenizer's size), or model.vocab rows
    when it pads beyond it."""
    m = rc.model
    if m.hidden % m.heads or m.heads % m.kv_heads:
        raise ScaleclError(f"model: hidden={m.hidden} must be a multiple of heads={m.heads}, and heads of "
                           f"kv_heads={m.kv_heads}")
    if m.vocab and m.vocab < vocab:
        raise ScaleclError(f"model.vocab={m.vocab} is smaller than the tokenizer's {vocab} tokens")
    vocab = m.vocab or vocab
    kw: dict[str, Any] = dict(vocab_size=vocab, hidden_size=m.hidden, num_hidden_layers=m.layers,
                              num_attention_heads=m.heads, intermediate_size=m.ffn, max_position_embeddings=m.context,
                              tie_word_embeddings=m.tie_embeddings)
    if m.arch == "llama":
        kw["num_key_value_heads"] = m.kv_heads
    if tokenizer is not None:
        kw |= dict(eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    return tiny_config(m.arch, **kw)


def pretrain_base(rc: CptRunConfig, tokenizer, tok_src: str, root: Path, cache: Path, runtime: Runtime,
                  numerics: dict | None = None) -> tuple[Path, dict]:
    """The builtin base: a small decoder pre-trained on the stand-in's base corpus (English training split plus
    a little Korean of other people, see scalecl.data.bilingual), cached. Rank 0 trains it alone (resuming its
    own checkpoints after a kill); the other processes wait."""
    def key_of(tok: str) -> str:  # model.vocab at 0 (the tokenizer's rows) keeps the keys of bases made before it
        return config_hash(asdict(rc.builtin), tok, named_dict(asdict(rc.model), (), {"vocab": 0}), rc.pretrain, rc.seed,
                           *numerics_key(numerics or run_numerics(rc.compute, runtime.device)))

    key = key_of(path_key(tok_src, cache))  # however --cache or --tokenizer is spelled
    if runtime.dist.main:  # an entry keyed by an earlier version's spelling of the paths: renamed, not trained again
        adopt_entry(cache / "cpt" / f"base-{key_of(tok_src)}", cache / "cpt" / f"base-{key}", runtime.say)
    run = stage_run(cache / "cpt", f"base-{key}", "cpt-base", key, rc.checkpoint.keep, runtime.dist.main,
                    {"tokenizer": tokenizer}, numerics)
    info = cached_stage(run, runtime, lambda: _train_base(rc, run, tokenizer, root, runtime), alone=True)
    return run.final_dir, info


def _train_base(rc: CptRunConfig, run: Run, tokenizer, root: Path, runtime: Runtime) -> dict:
    """Pre-train the builtin base on this process alone, cache it (run.final_dir) and return its record."""
    spec = corpus_spec(CorpusConfig(path="builtin:base", split="train"), root)
    chunks = PackedChunks(lambda: iter_texts(spec), tokenizer, rc.model.context, loop=True, name="base corpus")
    config = builtin_model_config(rc, len(tokenizer), tokenizer)
    plan = TrainPlan(rc.pretrain.steps, OptimConfig.of(rc.pretrain, rc.pretrain.lr, rc.pretrain.warmup),
                     autocast=autocast_dtype(rc.dtype, runtime.device, rc.compute.cpu_bf16),
                     save_every=rc.checkpoint.every, save_seconds=rc.checkpoint.seconds, resume="auto",
                     compute=rc.compute, desc="pre-train base")
    t = time.perf_counter()
    if rc.pretrain.steps == 0:  # the base is its random initialisation (paper-smoke: the paper's shapes)
        model = model_from_config(config, seed=rc.seed)
        info = {"wall_s": round(time.perf_counter() - t, 1), "final_loss": None, "steps": 0,
                "params": sum(p.numel() for p in model.parameters()), "numerics": run.identity.get("numerics")}
        run.finish(None, model, extra={"stage": info, "train_seq_len": rc.model.context},
                   base_model="builtin (random initialisation, not pre-trained)")
        return info
    res = fit(run, plan, build=lambda: model_from_config(config, seed=rc.seed),
              batches=RankBatches(chunks, rc.pretrain.batch),
              runtime=Runtime(Dist(), runtime.device, runtime.progress, runtime.say))
    info = stage_record(run, res, t, epochs_completed=chunks.epoch,
                        tokens=rc.pretrain.steps * rc.pretrain.batch * rc.model.context,
                        params=sum(p.numel() for p in res.model.parameters()))
    run.finish(None, res.model.cpu(), extra={"stage": info, "train_seq_len": rc.model.context},
               base_model="builtin (pre-trained on the stand-in's base corpus)")
    run.remove_checkpoints()  # its own checkpoints (anything else named like one stays)
    return info
