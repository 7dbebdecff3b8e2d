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
With eval.final_take set, the base (once) and each final model are also scored on larger held-out sets, at the
training length and at a long context (result.json `heldout`).

Data parallel: run the same command under `torchrun --nproc_per_node N` (or `accelerate launch`): each
process trains a DistributedDataParallel replica on its share of every global batch (train.batch
sequences per step whatever N is; accumulation = batch / (micro_batch * N)); evaluation is sharded; only
rank 0 writes. Checkpoints (model + optimizer, schedule, RNG and data position) go to
<checkpoints>/cpt/<run>/step-N every checkpoint.every steps; --resume continues from the latest one with
the numbers an uninterrupted run would have produced.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from rich.markup import escape

from scalecl.common.consoles import make_console
from scalecl.common.errors import ScaleclError
from scalecl.common.schema import config_hash, named_dict, numerics_key, run_stream_seed
from scalecl.compute.machine import run_numerics
from scalecl.compute.perf import autocast_dtype
from scalecl.compute.processes import Dist
from scalecl.data.batches import RankBatches
from scalecl.data.bilingual import write_corpus
from scalecl.data.corpus import (
    EvalChunks,
    PackedChunks,
    check_corpus,
    eval_chunks,
    iter_texts,
    wrap_warning,
)
from scalecl.data.tokenizer import TOKENIZER_FILES, open_tokenizer
from scalecl.evaluation.perplexity import (
    LOGIT_BLOCK,
    final_hidden,
    perplexity,
    representation_cosine,
    upscaled_norms,
)
from scalecl.evaluation.qa import value_summary
from scalecl.experiments.base import (
    EndTable,
    ExperimentBase,
    Paths,
    adopt_entry,
    cached_stage,
    micro_split,
    path_key,
    stage_record,
    stage_run,
)
from scalecl.experiments.config import CorpusConfig, CptRunConfig
from scalecl.experiments.corpora import (
    BUILTIN,
    bilingual_config,
    builtin_root,
    check_builtin_spec,
    corpus_spec,
    max_positions,
)
from scalecl.methods import Method
from scalecl.models.build import _HUB_ID as HUB_ID
from scalecl.models.build import model_from_config, tiny_config
from scalecl.training.checkpoint import load_model, read_meta
from scalecl.training.fit import Runtime, TrainPlan, fit
from scalecl.training.loop import eval_progress
from scalecl.training.model_source import (
    model_record,
    open_base,
    recorded_base_config,
    saved_scale_record,
    trains_as_own,
)
from scalecl.training.optim import OptimConfig
from scalecl.training.run import Run

console = make_console()  # off a terminal: lines are not wrapped at 80 columns


# ---------------------------------------------------------------------------------------------------------
# the base model


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


def tokenizer_source(rc: CptRunConfig, root: Path | None) -> str:
    """Where the run's tokenizer comes from: `tokenizer` if set, else the stand-in's (builtin base) or the base's
    (a checkpoint saved without one: its recorded base's, recorded_tokenizer)."""
    return rc.tokenizer or (str(root / "tokenizer") if rc.base == BUILTIN else recorded_tokenizer(rc.base))


def recorded_tokenizer(base: str) -> str:
    """The tokenizer of a base folder: its own files, else, for a checkpoint the suite wrote without them (`scalecl
    upscale`, `prepare`), its recorded base model's. A relative recorded folder was relative to where the checkpoint
    was written from: it is looked for from the working folder, then beside the checkpoint, then inside it; a
    recorded hub id is used as it is."""
    p = Path(base).expanduser()
    if not p.is_dir() or any((p / f).exists() for f in TOKENIZER_FILES) or (meta := read_meta(p)) is None:
        return base
    rec = meta.get("base_model") or ""
    lora_base = p / "base"  # a LoRA checkpoint's stored base holds the tokenizer when one was given
    if meta.get("layout") == "lora" and any((lora_base / f).exists() for f in TOKENIZER_FILES):
        return str(lora_base)
    r = Path(rec).expanduser()
    where = [r] if r.is_absolute() else [Path.cwd() / r, p.parent / r, p / r]
    for q in (q for q in where if rec and q.is_dir()):
        if any((q / f).exists() for f in TOKENIZER_FILES):
            return str(q)
        if read_meta(q) is not None:  # a checkpoint of a checkpoint: its own recorded base
            return recorded_tokenizer(str(q))
    if HUB_ID.match(rec) and not any(q.exists() for q in where):
        return rec  # a hub id: loaded (or refused in one line) as any tokenizer named so
    raise ScaleclError(f"{base} holds no tokenizer files and its recorded base model ({rec or 'none'}) gives none "
                       f"here; name one with --set tokenizer=<folder or hub id>")


def method_checkpoint(base: str) -> dict[str, Any] | None:
    """The record of a checkpoint whose method changed the model's structure (SCALE's widening, LoRA's adapters:
    `scalecl upscale`, `prepare` or a finished run's final model, full or delta, or a SCALE model saved with
    save_pretrained or Trainer.save_model) at `base`, else None. Such a base trains on as its own method with its
    own options and widths; it is never widened or adapted again."""
    if base == BUILTIN or not Path(base).is_dir():
        return None
    meta = read_meta(base) or saved_scale_record(base)
    return meta if trains_as_own(meta) else None


def _own_options_note(rc: CptRunConfig, own: dict[str, Any]) -> str:
    """One line naming the options of a method's checkpoint that differ from those the config gives its method
    (the checkpoint's apply: its widths are its weights' shapes), or "" when none differ."""
    from scalecl.methods import get_method

    name = own["method"]
    mine, given = get_method(name, **own["options"]).options(), rc.method(name).options()
    differ = [f"{k}={mine[k]!r} (the config gives {given[k]!r})" for k in mine if k in given and mine[k] != given[k]]
    return f"{name}: the checkpoint's own options apply: {', '.join(differ)}" if differ else ""


def base_model_config(rc: CptRunConfig, verify: bool = False):
    """The config of the model the methods start from, before any method: the builtin base's, a plain base's, or
    the base config a method's checkpoint records (`verify`: its files checked against their fingerprints first)."""
    if rc.base == BUILTIN:
        return builtin_model_config(rc, rc.builtin.vocab)
    if method_checkpoint(rc.base) is None:  # a plain model, or a plain checkpoint of the suite (delta included)
        return open_base(rc.base, verify=verify).config
    meta = model_record(rc.base, verify=verify)  # the record's fields and sizes, the weights' headers
    return recorded_base_config(meta, rc.base)


def pretrain_base(rc: CptRunConfig, tokenizer, tok_src: str, root: Path, cache: Path, rt: Runtime,
                  numerics: dict | None = None) -> tuple[Path, dict]:
    """The builtin base: a small decoder pre-trained on the stand-in's base corpus (English training split plus
    a little Korean of other people, see scalecl.data.bilingual), cached. Rank 0 trains it alone (resuming its
    own checkpoints after a kill); the other processes wait."""
    def key_of(tok: str) -> str:  # model.vocab at 0 (the tokenizer's rows) keeps the keys of bases made before it
        return config_hash(asdict(rc.builtin), tok, named_dict(asdict(rc.model), (), {"vocab": 0}), rc.pretrain, rc.seed,
                           *numerics_key(numerics or run_numerics(rc.compute, rt.device)))

    key = key_of(path_key(tok_src, cache))  # however --cache or --tokenizer is spelled
    if rt.d.main:  # an entry keyed by an earlier version's spelling of the paths: renamed, not trained again
        adopt_entry(cache / "cpt" / f"base-{key_of(tok_src)}", cache / "cpt" / f"base-{key}", rt.say)
    run = stage_run(cache / "cpt", f"base-{key}", "cpt-base", key, rc.checkpoint.keep, rt.d.main,
                    {"tokenizer": tokenizer}, numerics)
    info = cached_stage(run, rt, lambda: _train_base(rc, run, tokenizer, root, rt), alone=True)
    return run.final_dir, info


def _train_base(rc: CptRunConfig, run: Run, tokenizer, root: Path, rt: Runtime) -> dict:
    """Pre-train the builtin base on this process alone, cache it (run.final_dir) and return its record."""
    spec = corpus_spec(CorpusConfig(path="builtin:base", split="train"), root)
    chunks = PackedChunks(lambda: iter_texts(spec), tokenizer, rc.model.context, loop=True, name="base corpus")
    config = builtin_model_config(rc, len(tokenizer), tokenizer)
    plan = TrainPlan(rc.pretrain.steps, OptimConfig.of(rc.pretrain, rc.pretrain.lr, rc.pretrain.warmup),
                     autocast=autocast_dtype(rc.dtype, rt.device, rc.compute.cpu_bf16), save_every=rc.checkpoint.every,
                     save_seconds=rc.checkpoint.seconds, resume="auto", compute=rc.compute,
                     desc="pre-train base")
    t = time.perf_counter()
    if rc.pretrain.steps == 0:  # the base is its random initialisation (paper-smoke: the paper's shapes)
        model = model_from_config(config, seed=rc.seed)
        info = {"wall_s": round(time.perf_counter() - t, 1), "final_loss": None, "steps": 0,
                "params": sum(p.numel() for p in model.parameters()), "numerics": run.identity.get("numerics")}
        run.finish(None, model, extra={"stage": info, "train_seq_len": rc.model.context},
                   base_model="builtin (random initialisation, not pre-trained)")
        return info
    res = fit(run, plan, build=lambda: model_from_config(config, seed=rc.seed),
              batches=RankBatches(chunks, rc.pretrain.batch), rt=Runtime(Dist(), rt.device, rt.progress, rt.say))
    info = stage_record(run, res, t, epochs_completed=chunks.epoch,
                        tokens=rc.pretrain.steps * rc.pretrain.batch * rc.model.context,
                        params=sum(p.numel() for p in res.model.parameters()))
    run.finish(None, res.model.cpu(), extra={"stage": info, "train_seq_len": rc.model.context},
               base_model="builtin (pre-trained on the stand-in's base corpus)")
    run.remove_checkpoints()  # its own checkpoints (anything else named like one stays)
    return info


# ---------------------------------------------------------------------------------------------------------
# the experiment


@dataclass
class EvalSets:
    """What every method is evaluated on: tokenised held-out chunks of both domains and the base's final
    hidden state on a fixed batch of old-domain chunks (Fig. 4a)."""

    old_chunks: EvalChunks
    new_chunks: EvalChunks
    old_spec: str
    new_spec: str
    rep_ids: torch.Tensor  # (rep_batch, T)
    h0: torch.Tensor | None = None  # (rep_batch, T, d), set once the base exists
    d_model: int = 0

    def tokens(self, split: str) -> int:
        return (self.old_chunks if split == "old" else self.new_chunks).scored

    def record(self, split: str) -> dict[str, Any]:
        """What a held-out set holds, for result.json: its slice, documents, tokens and sequences."""
        chunks = self.old_chunks if split == "old" else self.new_chunks
        return {"slice": self.old_spec if split == "old" else self.new_spec, "tokens": chunks.scored,
                "sequences": len(chunks), "documents": chunks.documents, "tokens_packed": chunks.packed}

    def line(self, split: str) -> str:
        """One held-out set, in words (rich markup escaped): the tokens scored, of how many documents of what."""
        chunks, spec = (self.old_chunks, self.old_spec) if split == "old" else (self.new_chunks, self.new_spec)
        return escape(f"{chunks.scored:,} tokens scored, {chunks.documents:,} documents of {spec}")


@dataclass
class FinalSet:
    """One held-out set of the final evaluation: its slice in words, its chunks at each length, and the scores
    (length -> "base" / "end" -> perplexity's record)."""

    slice: str
    chunks: dict[int, EvalChunks]
    scores: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)


def final_lengths(rc: Any, n_pos: int | None) -> list[int]:
    """The lengths of the final held-out evaluation: the training length, then eval.final_context (0: the
    model's positions, at most eval-ppl's default length) when it differs; none when eval.final_take is -1."""
    from scalecl.experiments.eval_ppl import DEFAULT_SEQ_LEN

    if rc.eval.final_take < 0:
        return []
    seq, ctx = rc.train.seq_len, rc.eval.final_context or min(n_pos or DEFAULT_SEQ_LEN, DEFAULT_SEQ_LEN)
    if n_pos is not None and ctx > n_pos:
        raise ScaleclError(f"eval.final_context={ctx} exceeds the model's {n_pos} positions")
    if ctx < 2:
        raise ScaleclError(f"eval.final_context must be at least 2, got {ctx}")
    return [seq] if ctx == seq else [seq, ctx]


def cpt_phases(rc: Any, methods: list[str], world: int, eval_tokens: int = 0, final_tokens: int = 0) -> list:
    """The phases of a continual pre-training sweep: the builtin base's pre-training, each method's training
    and evaluations (`eval_tokens`: both held-out sets' tokens, once the data are prepared), and the final held-out
    evaluation of the base (once) and of each method's final model (`final_tokens`: the final sets' tokens at
    every length, once prepared), at its longest forward."""
    from scalecl.experiments.budget import phase

    builtin = rc.base == "builtin"
    cfg = base_model_config(rc)
    t, seq = rc.train, rc.train.seq_len
    micro = micro_split(t.batch, t.micro_batch, world)[0]
    phases = []
    if builtin and rc.pretrain.steps:  # 0 steps: the base is its initialisation, nothing trains
        ctx = rc.model.context
        phases.append(phase("base pre-training", cfg, None, {}, (rc.pretrain.batch, ctx),
                            rc.pretrain.steps * rc.pretrain.batch * ctx, ("pretrain.batch", "model.context")))
    lengths = final_lengths(rc, max_positions(cfg))
    final = (max(1, rc.eval.batch * seq // lengths[-1]), lengths[-1]) if lengths else None
    keys = ("eval.final_take", "eval.final_context")
    if final and methods:
        phases.append(phase("final held-out evaluation (base)", cfg, None, {}, final, final_tokens, keys, train=False))
    for name in methods:
        opts = rc.method_options(name)
        phases += [
            phase(f"training ({name})", cfg, name, opts, (micro, seq), t.steps * t.batch * seq // world,
                  ("train.micro_batch", "train.seq_len")),
            phase(f"evaluation ({name})", cfg, name, opts, (rc.eval.batch, seq),
                  (t.steps // (rc.eval.every or t.steps) + 2) * eval_tokens, ("eval.batch",), train=False),
        ]
        if final:
            phases.append(phase(f"final held-out evaluation ({name})", cfg, name, opts, final, final_tokens, keys,
                                train=False))
    return phases


def _summary_cells(r: dict[str, Any]) -> list[str] | None:
    s = r.get("summary", {})
    if "old_ppl_start" not in s:
        return None
    return [f"{s['old_ppl_start']:.3f}", f"{s['old_ppl_end']:.3f}", f"{s['new_ppl_start']:.2f}",
            f"{s['new_ppl_end']:.3f}", f"{s['rep_cos_end']:.4f}", f"{r['trainable_params']:,}"]


def _chance_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    """A uniform guess's perplexity (the vocabulary size), for the builtin base whose vocabulary is configured."""
    vocab = {r.get("config", {}).get("builtin", {}).get("vocab") for r in results}
    if len(vocab) == 1 and isinstance(v := vocab.pop(), int) and results[0].get("config", {}).get("base") == "builtin":
        return [["chance (uniform over the vocabulary)", *[f"{v:,}"] * 4, "", ""]]
    return []


CPT_TABLE = EndTable("continual pre-training: forgetting (old-domain PPL) vs learning (new-domain PPL)",
                     ("old PPL start", "old PPL end", "new PPL start", "new PPL end", "rep cos end", "trainable"),
                     _summary_cells, _chance_rows)


def heldout_table(results: list[dict[str, Any]], labels: list[str] | None = None):
    """The final held-out evaluation's whole-set perplexities (result.json `heldout`), start (the base) -> end, per
    set and length, as a table; None when no result has one."""
    from rich.table import Table

    shown = [(lab, r) for lab, r in zip(labels or [r["method"] for r in results], results, strict=True)
             if isinstance(r.get("heldout"), dict)]
    if not shown:
        return None
    held = shown[0][1]["heldout"]
    cols = [(split, n) for split in ("old", "new") if split in held for n in held[split]["at"]]
    table = Table(title="final held-out evaluation: whole-set perplexity, base -> final model (result.json heldout)")
    table.add_column("run" if labels else "method", no_wrap=True)
    for split, n in cols:
        docs = held[split]["documents"]
        table.add_column(f"{split} PPL at {int(n):,} ({docs:,} docs)", justify="right")
    for label, r in shown:
        at = [r["heldout"].get(split, {}).get("at", {}).get(n) for split, n in cols]
        table.add_row(label, *(f"{a['start']['ppl']:.3f} -> {a['end']['ppl']:.3f}" if a else "" for a in at))
    return table


class CptExperiment(ExperimentBase):
    """Continual pre-training as an experiment of the sweep: every method from the same base."""

    name = "cpt"
    # the run's own rate is named (lr_of); the never-target rows are a measurement only
    not_named = (*ExperimentBase.not_named, "lr", "eval.never_tokens")
    named_when_set = {"model.vocab": 0, "data.text_unit": "line", "old_eval.text_unit": "line",
                      "new_eval.text_unit": "line", "eval.final_take": -1, "eval.final_context": 0}
    end_table = CPT_TABLE

    def summary(self, results: list[dict[str, Any]], labels: list[str] | None = None) -> None:
        """The end-of-run table, then the whole-set results of the final held-out evaluation when there is one."""
        super().summary(results, labels)
        table = heldout_table(results, labels)
        if table is not None:
            console.print(table)

    def __init__(self, rc: CptRunConfig, preset_name: str, paths: Paths) -> None:
        from scalecl.models.gguf import is_gguf, resolve_model

        if is_gguf(rc.base):  # a .gguf base: its dequantized transformers folder, named by the file's sha256
            rc = replace(rc, base=resolve_model(rc.base, paths.cache))
        self.own = method_checkpoint(rc.base)  # a SCALE or LoRA checkpoint as the base: trains as its own method
        self.own_note = ""  # prepare says it: the checkpoint's options that differ from the config's for its method
        if self.own is not None:  # with its own options (widths), whatever the preset gives that method
            self.own_note = _own_options_note(rc, self.own)
            rc = replace(rc, methods={**rc.methods, self.own["method"]: dict(self.own["options"])})
        super().__init__(rc, preset_name, paths)
        self.bilingual = None  # check: the stand-in's sizes when a corpus or the base is builtin
        self.root: Path | None = None  # prepare: the generated stand-in corpus
        self.evals: EvalSets | None = None  # prepare: the evaluation sets
        self.data_s = 0.0  # prepare: seconds
        self.base_source, self.base_info = "", {}  # stages: the base model and its record
        self.never_info: dict[str, Any] = {}
        self.chunks: PackedChunks | None = None  # batches: the training stream
        self.final_lengths: list[int] = []  # check: the final held-out evaluation's lengths (none: off)
        self.final_sets: dict[str, FinalSet] = {}  # prepare: its sets; stages: the base's scores on them

    # -- before anything is written ----------------------------------------------------------------------

    def budget_phases(self, methods: list[str], world: int) -> list:
        """What the sweep will run, for scalecl.experiments.budget's estimate (held-out tokens once the data are ready)."""
        evals = self.evals
        final = sum(c.packed for fs in self.final_sets.values() for c in fs.chunks.values())
        return cpt_phases(self.rc, methods, world, evals.tokens("old") + evals.tokens("new") if evals else 0, final)

    def check(self, methods: dict[str, Method], d: Dist) -> None:
        rc = self.rc
        for name in methods:
            rc.method_lr(name)  # every method has its rate: one line naming the key to set otherwise
        t = rc.train
        micro = self._micro(d)[0]
        if micro < 1 or t.batch % (micro * d.world):
            raise ScaleclError(f"train.batch={t.batch} must be a multiple of micro_batch x processes = "
                               f"{t.micro_batch or '(batch / processes)'} x {d.world}")
        own = self.own
        for name in methods if own is not None else ():
            if name != own["method"]:
                raise ScaleclError(f"{rc.base} is a {own['method']} checkpoint: it trains on as {own['method']} only "
                                   f"(got --method {name}); give --method {own['method']}, or its base model "
                                   f"({own.get('base_model')}) to start another method")
        corpora = {"data": rc.data, "old_eval": rc.old_eval, "new_eval": rc.new_eval}
        uses_builtin = rc.base == BUILTIN or any(c.path.startswith(f"{BUILTIN}:") for c in corpora.values())
        for where, cc in corpora.items():
            if cc.path.startswith(f"{BUILTIN}:"):
                check_builtin_spec(cc, where)
            else:
                check_corpus(corpus_spec(cc, None))
        self.bilingual = bilingual_config(rc) if uses_builtin else None
        base_cfg = base_model_config(rc, verify=True)
        if rc.base != BUILTIN and not rc.tokenizer:
            recorded_tokenizer(rc.base)  # a checkpoint without a tokenizer: its recorded base gives one, or one line
        n_pos = max_positions(base_cfg)
        if n_pos is not None and rc.train.seq_len > n_pos:
            raise ScaleclError(f"train.seq_len={rc.train.seq_len} exceeds the model's {n_pos} positions")
        self.final_lengths = final_lengths(rc, n_pos)
        for m in methods.values():
            m.check(base_cfg)

    # -- shared data and the base --------------------------------------------------------------------------

    def _status(self, d: Dist, text: str):
        return console.status(text) if d.main else contextlib.nullcontext()

    def prepare(self, rt: Runtime) -> None:
        """The builtin corpus (generated once), the tokenizer and the evaluation sets."""
        rc, d = self.rc, rt.d
        t0 = time.perf_counter()
        self.begin(rt)
        self.root = builtin_root(rc, self.paths.cache) if self.bilingual is not None else None
        if self.root is not None:
            if d.main:
                with self._status(d, "generating the bilingual stand-in corpus"):
                    write_corpus(self.root, self.bilingual, rc.builtin.vocab, rebuild=rt.force)
            d.barrier()
        self.tok_src = tokenizer_source(rc, self.root)
        self.tokenizer = open_tokenizer(self.tok_src)
        self.train_spec = corpus_spec(rc.data, self.root)
        old_spec, new_spec = corpus_spec(rc.old_eval, self.root), corpus_spec(rc.new_eval, self.root)
        if d.main and self.own_note:
            rt.say(escape(self.own_note))
        for where, spec in (("data", self.train_spec), ("old_eval", old_spec), ("new_eval", new_spec)):
            if d.main and (warn := wrap_warning(spec)) is not None:
                rt.say(escape(f"warning: {where}: {warn}"))
        seq = rc.train.seq_len
        with self._status(d, "tokenising the evaluation sets"):
            old_chunks = eval_chunks(old_spec, self.tokenizer, seq, "old-domain evaluation set")
            new_chunks = eval_chunks(new_spec, self.tokenizer, seq, "new-domain evaluation set")
        full = [c for c in old_chunks if len(c) == seq]
        if not full:
            raise ScaleclError(f"the old-domain evaluation set has no full {seq}-token chunk for the representation "
                               f"batch")
        self.evals = EvalSets(old_chunks, new_chunks, old_spec.describe(), new_spec.describe(),
                              torch.stack(full[: rc.eval.rep_batch]))
        if self.final_lengths:
            with self._status(d, "tokenising the final held-out sets"):
                for split, cc in (("old", rc.old_eval), ("new", rc.new_eval)):
                    spec = corpus_spec(replace(cc, take=rc.eval.final_take), self.root)
                    what = f"{'old' if split == 'old' else 'new'}-domain final held-out set"
                    self.final_sets[split] = FinalSet(spec.describe(), {n: eval_chunks(spec, self.tokenizer, n, what)
                                                                        for n in self.final_lengths})
        self.data_s = time.perf_counter() - t0

    def stages(self, rt: Runtime) -> None:
        """The base (pre-trained and cached when builtin) and its hidden states on the representation batch."""
        rc = self.rc
        if rc.base == BUILTIN:
            path, self.base_info = pretrain_base(rc, self.tokenizer, self.tok_src, self.root, self.paths.cache, rt,
                                                 self.numerics)
            self.base_source = str(path)
        else:
            self.base_info, self.base_source = {}, rc.base
        base = self.load_base().to(rt.device)
        self.never_rows = self._never_rows(base.get_output_embeddings().weight.shape[0]) if rc.eval.never_tokens else None
        ev = self.evals
        ev.d_model = getattr(base, "scale_base_sizes", {}).get("hidden_size") or base.config.hidden_size  # d: unwidened
        ev.h0 = final_hidden(base, ev.rep_ids.to(rt.device), ev.d_model)
        if self.final_sets:  # the start of every method (each is exact at initialisation): scored once
            self.heldout_scores(base, None, "base")
        del base
        info = self.base_info
        done = "random initialisation, not pre-trained" if info.get("steps") == 0 else f"pre-trained {info.get('wall_s')} s"
        base_line = (f"base: {self.base_source}" + (f" ({done}{', cached' if info.get('cached') else ''})"
                                                    if info else ""))
        rt.say(f"{base_line}; tokenizer {escape(self.tok_src)}, vocab {len(self.tokenizer):,}; old-domain eval: "
               f"{ev.line('old')}; new-domain eval: {ev.line('new')} (seq {rc.train.seq_len}); {rt.d.world} process(es)")

    def _never_rows(self, rows: int) -> torch.Tensor:
        """(rows,) bool: vocabulary rows that occur in none of the first eval.never_tokens tokens of the
        new-domain training stream (its order for run seed 0) and are not EOS: the tokens the new domain never
        uses, on which SCALE-Route's raw-logit router may be decided."""
        seen = torch.zeros(rows, dtype=torch.bool)
        eos = self.tokenizer.eos_token_id
        if eos is not None and eos < rows:
            seen[eos] = True
        left = self.rc.eval.never_tokens
        for text in iter_texts(self.train_spec):
            ids = torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"][:left], dtype=torch.long)
            seen[ids[ids < rows]] = True
            left -= len(ids)
            if left <= 0:
                break
        self.never_info = {"never_rows": int((~seen).sum()), "rows": rows,
                           "tokens_read": self.rc.eval.never_tokens - max(left, 0)}
        return ~seen

    def load_base(self) -> torch.nn.Module:
        """A fresh copy of the base model (CPU): a method's checkpoint as it was saved, ready to train on."""
        if self.rc.base == BUILTIN or self.own is not None:
            return load_model(self.base_source)
        return open_base(self.rc.base).load()

    # -- one method ----------------------------------------------------------------------------------------

    def _micro(self, d: Dist) -> tuple[int, int]:
        return micro_split(self.rc.train.batch, self.rc.train.micro_batch, d.world)

    def build(self, method: Method) -> torch.nn.Module:
        torch.manual_seed(run_stream_seed(self.rc.seed, self.rc.run_seed))
        if self.own is not None:  # already the method's model (check: the same method and options)
            return self.attach(self.load_base())
        return self.attach(method.apply(self.load_base()))

    def save_kw(self) -> dict[str, Any]:  # the length it trains at: eval-ppl's default (scalecl.experiments.eval_ppl)
        return {"base_model": self.base_source, "tokenizer": self.tokenizer,
                "extra": {"train_seq_len": self.rc.train.seq_len}}

    def batches(self, method: Method, rt: Runtime) -> RankBatches:
        rc = self.rc
        order = run_stream_seed(rc.seed, rc.run_seed) if rc.run_seed else None  # run seed 0: stream order
        self.chunks = PackedChunks(lambda: iter_texts(self.train_spec), self.tokenizer, rc.train.seq_len,
                                   loop=True, name="training corpus", order_seed=order)
        return RankBatches(self.chunks, self._micro(rt.d)[0], rt.d.world, rt.d.rank)

    def plan(self, method: Method, rt: Runtime) -> TrainPlan:
        rc, t = self.rc, self.rc.train
        lr = self.lr_of(method)
        every = rc.eval.every or t.steps
        return TrainPlan(t.steps, OptimConfig.of(t, lr, round(t.warmup_ratio * t.steps)), accum=self._micro(rt.d)[1],
                         autocast=autocast_dtype(rc.dtype, rt.device, rc.compute.cpu_bf16),
                         eval_steps=set(range(0, t.steps + 1, every)) | {t.steps},
                         save_every=rc.checkpoint.every, save_seconds=rc.checkpoint.seconds, compute=rc.compute,
                         desc=f"cpt: {method.name}",
                         tracker_config={"method": method.name, "options": method.options(), "lr": lr, **asdict(rc)})

    def heldout_scores(self, model: torch.nn.Module, method: Method | None, who: str) -> None:
        """Score `model` on every final held-out set at every length; kept as `who` ("base" or "end")."""
        rc = self.rc
        autocast = autocast_dtype(rc.dtype, self.device, rc.compute.cpu_bf16)
        total = sum(len(c) for fs in self.final_sets.values() for c in fs.chunks.values())
        stats = (lambda mask: method.metrics(model, mask)) if method is not None else None
        with eval_progress(f"cpt: {method.name if method else 'base'}: final held-out evaluation", total,
                           "sequences") as advance:
            for fs in self.final_sets.values():
                for n, chunks in fs.chunks.items():
                    rows = max(1, rc.eval.batch * rc.train.seq_len // n)  # as many tokens per forward as the others
                    r = perplexity(model, chunks, rows, autocast, stats, progress=advance, logit_block=LOGIT_BLOCK)
                    fs.scores.setdefault(n, {})[who] = {k: round(v, 6) if isinstance(v, float) else v
                                                        for k, v in r.items()}

    def heldout_record(self) -> dict[str, Any]:
        """result.json's `heldout`: per set and length, the base's and the final model's scores."""
        rc = self.rc
        return {"take": rc.eval.final_take, "lengths": self.final_lengths, "train_seq_len": rc.train.seq_len,
                **{split: {"slice": fs.slice, "documents": next(iter(fs.chunks.values())).documents,
                           "at": {str(n): {"tokens": chunks.scored, "sequences": len(chunks),
                                           "start": fs.scores[n]["base"], "end": fs.scores[n]["end"]}
                                  for n, chunks in fs.chunks.items()}}
                   for split, fs in self.final_sets.items()}}

    def evaluate(self, model: torch.nn.Module, method: Method, step: int, loss: float) -> dict[str, Any]:
        rc, ev = self.rc, self.evals
        autocast = autocast_dtype(rc.dtype, self.device, rc.compute.cpu_bf16)
        rec: dict[str, Any] = {"step": step, "loss": None if step == 0 else round(loss, 6),
                               "tokens": step * rc.train.batch * rc.train.seq_len}
        with eval_progress(f"cpt: {method.name}: evaluation at step {step}", len(ev.old_chunks) + len(ev.new_chunks),
                           "sequences") as advance:
            for split, chunks in (("old", ev.old_chunks), ("new", ev.new_chunks)):
                at: dict[str, list[torch.Tensor]] = {}
                r = perplexity(model, chunks, rc.eval.batch, autocast, functools.partial(_stats, method, model, at=at),
                               progress=advance)
                rec |= {f"{split}/ppl": round(r["ppl"], 6), f"{split}/nll": round(r["nll"], 6)}
                rec |= {f"{split}/{k}": round(v, 6) for k, v in r.items() if k.startswith("route_")}
                rec |= {f"{split}/{k}": v for k, v in route_stats(at).items()}
            rec["rep_cos"] = round(representation_cosine(ev.h0, final_hidden(model, ev.rep_ids.to(self.device),
                                                                               ev.d_model)), 9)
        rec |= {k: round(v, 6) for k, v in upscaled_norms(model).items()}
        return rec

    def result(self, method: Method, run: Run, res, rt: Runtime) -> dict[str, Any]:
        ev, records = self.evals, res.records
        first, last = records[0], records[-1]
        micro, accum = self._micro(rt.d)
        heldout = {}
        if self.final_sets:
            self.heldout_scores(res.model, method, "end")
            heldout = {"heldout": self.heldout_record()}
        return self.envelope(method, res, rt) | {
            "base": {"source": self.base_source, **self.base_info},
            "tokenizer": self.tok_src, "micro_batch": micro, "accumulation": accum,
            "data": {"train": self.train_spec.describe(), "epochs_completed": self.chunks.epoch,
                     "old_eval": ev.record("old"), "new_eval": ev.record("new"),
                     "rep_batch": list(ev.rep_ids.shape),
                     **({"never_rows": self.never_info} if self.never_rows is not None else {})},
            "wall_s": {"data": round(self.data_s, 1), "base": self.base_info.get("wall_s"),
                       "train": res.timing["train_s"], "eval": res.timing["eval_s"]},
            "summary": {"old_ppl_start": first["old/ppl"], "old_ppl_end": last["old/ppl"],
                        "old_ppl_max": max(r["old/ppl"] for r in records),
                        "new_ppl_start": first["new/ppl"], "new_ppl_end": last["new/ppl"],
                        "rep_cos_start": first["rep_cos"], "rep_cos_end": last["rep_cos"],
                        "rep_cos_min": min(r["rep_cos"] for r in records), "final_loss": res.losses[-1]},
            "final": last,
            **heldout,
            "checkpoint": str(run.final_dir),
        }


def _stats(method: Method, model, mask: torch.Tensor, at: dict[str, list[torch.Tensor]]) -> dict[str, float]:
    """The method's per-token metrics of one evaluation forward; its values at every position (SCALE-Route:
    router score, and the never-row logit shares when measured) are appended to `at`."""
    for k, v in method.position_values(model, mask).items():
        if k != "route_preserve":  # the routing fraction is already a per-token metric
            at.setdefault(k, []).append(v.detach().double().cpu())
    return method.metrics(model, mask)


def route_stats(at: dict[str, list[torch.Tensor]]) -> dict[str, float]:
    """Mean and 5/25/50/75/95% quantiles of each per-position value over an evaluation set (under several
    processes: over this process's share). route_score is the router's cosine (or probability), never_share_<path>
    the share of that path's logit norm on the never rows."""
    out: dict[str, float] = {}
    for k, parts in sorted(at.items()):
        if len(v := torch.cat(parts)):
            out |= {name: round(x, 6) for name, x in value_summary(k, v).items()}
    return out
