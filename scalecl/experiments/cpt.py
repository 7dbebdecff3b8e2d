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
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, ClassVar

import torch
from rich.markup import escape
from transformers import PretrainedConfig

from scalecl.common.consoles import make_console
from scalecl.common.errors import ScaleclError
from scalecl.common.schema import run_stream_seed
from scalecl.common.sources import HUB_ID
from scalecl.compute.perf import autocast_dtype
from scalecl.compute.processes import Dist
from scalecl.data.batches import RankBatches
from scalecl.data.bilingual import write_corpus
from scalecl.data.corpus import PackedChunks, check_corpus, eval_chunks, iter_texts, wrap_warning
from scalecl.data.tokenizer import TOKENIZER_FILES, open_tokenizer
from scalecl.evaluation.perplexity import (
    LOGIT_BLOCK,
    final_hidden,
    perplexity,
    representation_cosine,
    upscaled_norms,
)
from scalecl.experiments.base import ExperimentBase, Paths, micro_split
from scalecl.experiments.config import CptRunConfig
from scalecl.experiments.corpora import (
    BUILTIN,
    bilingual_config,
    builtin_root,
    check_builtin_spec,
    corpus_spec,
    max_positions,
)
from scalecl.experiments.cpt_eval import (
    CPT_TABLE,
    EvalSets,
    FinalSet,
    final_lengths,
    heldout_table,
    method_stats,
    route_stats,
)
from scalecl.experiments.cpt_pretrain import builtin_model_config, pretrain_base
from scalecl.experiments.sources import ModelSource
from scalecl.methods import Method
from scalecl.training.checkpoint import load_model, read_meta
from scalecl.training.fit import Runtime, TrainPlan
from scalecl.training.layouts import stored_base
from scalecl.training.model_source import (
    model_record,
    open_base,
    recorded_base_config,
    saved_scale_record,
    trains_as_own,
)
from scalecl.training.optim import OptimConfig
from scalecl.training.progress import eval_progress
from scalecl.training.run import Run

console = make_console()  # off a terminal: lines are not wrapped at 80 columns


# ---------------------------------------------------------------------------------------------------------
# the base model


def recorded_tokenizer(base: str) -> str:
    """The tokenizer of a base folder: its own files, else, for a checkpoint the suite wrote without them (`scalecl
    upscale`, `prepare`), its recorded base model's. A relative recorded folder was relative to where the checkpoint
    was written from: it is looked for from the working folder, then beside the checkpoint, then inside it; a
    recorded hub id is used as it is."""
    p = Path(base).expanduser()
    if not p.is_dir() or any((p / f).exists() for f in TOKENIZER_FILES) or (meta := read_meta(p)) is None:
        return base
    rec = meta.get("base_model") or ""
    inside = stored_base(p, meta)  # a base stored in the checkpoint (LoRA's base/) holds the tokenizer if one was given
    if inside is not None and any((inside / f).exists() for f in TOKENIZER_FILES):
        return str(inside)
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
    if not Path(base).is_dir():
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


def resolved(source: ModelSource, cache: Path | None) -> ModelSource:
    """A source with what only its files tell: a .gguf file or a packaged model as its dequantized transformers
    folder, named by the file's sha256 (made once, in `cache`; None: left as named, its config read from the file),
    and a folder holding a method's checkpoint (method_checkpoint) as kind "checkpoint"."""
    if source.kind in ("gguf", "package"):
        return source if cache is None else replace(source, path=source.loadable(cache))
    if source.kind == "hub_or_folder" and method_checkpoint(source.path) is not None:
        return replace(source, kind="checkpoint")
    return source


class PlainBase:
    """The model every method of a sweep starts from, as its source's kind uses it: its config, its tokenizer, the
    stage that makes it and how it loads. This class is a model as named (a hub id or folder, a dequantized
    GGUF file); `BASES` maps each kind of ModelSource to its class, the one place a base's kind decides."""

    stand_in: ClassVar[bool] = False  # whether it needs the offline stand-in generated (its tokenizer and text)

    def __init__(self, source: ModelSource) -> None:
        self.source = source
        self.own: dict[str, Any] | None = None  # a method's checkpoint: its record (it trains on as that method)

    def config(self, rc: CptRunConfig, verify: bool = False) -> PretrainedConfig:
        """The config of the model before any method (`verify`: its files checked against their fingerprints)."""
        return open_base(self.source.path, verify=verify).config

    def check(self, rc: CptRunConfig) -> PretrainedConfig:
        """Its verified config, and, when the config names no tokenizer, that it gives one (a checkpoint saved
        without one: its recorded base's), before anything is written."""
        config = self.config(rc, verify=True)
        if not rc.tokenizer:
            recorded_tokenizer(self.source.path)
        return config

    def tokenizer(self, root: Path | None) -> str:
        """Where its tokenizer comes from when the config names none (`root`: the generated stand-in)."""
        return recorded_tokenizer(self.source.path)

    def phases(self, rc: CptRunConfig, config: PretrainedConfig) -> list:
        """What making it costs, as scalecl.experiments.budget phases: nothing, it exists."""
        return []

    def stage(self, exp: CptExperiment, runtime: Runtime) -> tuple[str, dict[str, Any]]:
        """(the folder every method loads it from, its record for result.json)."""
        return self.source.path, {}

    def load(self, folder: str) -> torch.nn.Module:
        """A fresh copy (CPU) of the model in `folder` (what `stage` gave), ready for a method to apply to."""
        return open_base(folder).load()


class BuiltinBase(PlainBase):
    """base = "builtin": the small decoder of the config's `model` shape, pre-trained on the stand-in and cached
    (scalecl.experiments.cpt_pretrain)."""

    stand_in = True

    def config(self, rc: CptRunConfig, verify: bool = False) -> PretrainedConfig:
        return builtin_model_config(rc, rc.builtin.vocab)

    def check(self, rc: CptRunConfig) -> PretrainedConfig:
        return self.config(rc)

    def tokenizer(self, root: Path | None) -> str:
        return str(root / "tokenizer")

    def phases(self, rc: CptRunConfig, config: PretrainedConfig) -> list:
        from scalecl.experiments.budget import phase

        if not rc.pretrain.steps:  # 0 steps: the base is its initialisation, nothing trains
            return []
        ctx = rc.model.context
        return [phase("base pre-training", config, None, {}, (rc.pretrain.batch, ctx),
                      rc.pretrain.steps * rc.pretrain.batch * ctx,
                      ("pretrain.batch", "model.context"))._replace(steps=rc.pretrain.steps)]

    def stage(self, exp: CptExperiment, runtime: Runtime) -> tuple[str, dict[str, Any]]:
        path, info = pretrain_base(exp.rc, exp.tokenizer, exp.tok_src, exp.root, exp.paths.cache, runtime, exp.numerics)
        return str(path), info

    def load(self, folder: str) -> torch.nn.Module:
        return load_model(folder)


class CheckpointBase(PlainBase):
    """A checkpoint of a method that changed the model's structure (method_checkpoint): it trains on as that
    method, with its own options and widths, as it was saved."""

    def __init__(self, source: ModelSource) -> None:
        super().__init__(source)
        self.own = method_checkpoint(source.path)

    def config(self, rc: CptRunConfig, verify: bool = False) -> PretrainedConfig:
        """The base config its record holds (the record's fields and sizes, the weights' headers)."""
        return recorded_base_config(model_record(self.source.path, verify=verify), self.source.path)

    def load(self, folder: str) -> torch.nn.Module:
        return load_model(folder)


BASES: dict[str, type[PlainBase]] = {"builtin": BuiltinBase, "checkpoint": CheckpointBase, "hub_or_folder": PlainBase,
                                     "gguf": PlainBase, "package": PlainBase}


def base_model(source: ModelSource) -> PlainBase:
    """The base a (resolved) source names, by its kind."""
    return BASES[source.kind](source)


def base_model_config(rc: CptRunConfig, verify: bool = False) -> PretrainedConfig:
    """The config of the model the methods start from, before any method, from the config's `base` alone (a
    .gguf file read where it is, not dequantized): the builtin base's, a plain base's, or the base config a
    method's checkpoint records (`verify`: its files checked against their fingerprints first)."""
    return base_model(resolved(ModelSource.parse(rc.base), None)).config(rc, verify)


# ---------------------------------------------------------------------------------------------------------
# the experiment


def cpt_phases(rc: Any, base: PlainBase, methods: list[str], world: int, eval_tokens: int = 0,
               final_tokens: int = 0) -> list:
    """The phases of a continual pre-training sweep: the builtin base's pre-training, each method's training
    and evaluations (`eval_tokens`: both held-out sets' tokens, once the data are prepared), and the final held-out
    evaluation of the base (once) and of each method's final model (`final_tokens`: the final sets' tokens at
    every length, once prepared), at its longest forward."""
    from scalecl.experiments.budget import phase

    cfg = base.config(rc)
    t, seq = rc.train, rc.train.seq_len
    micro = micro_split(t.batch, t.micro_batch, world)[0]
    phases = base.phases(rc, cfg)
    lengths = final_lengths(rc, max_positions(cfg))
    final = (max(1, rc.eval.batch * seq // lengths[-1]), lengths[-1]) if lengths else None
    keys = ("eval.final_take", "eval.final_context")
    if final and methods:
        phases.append(phase("final held-out evaluation (base)", cfg, None, {}, final, final_tokens, keys, train=False))
    for name in methods:
        opts = rc.method_options(name)
        phases += [
            phase(f"training ({name})", cfg, name, opts, (micro, seq), t.steps * t.batch * seq // world,
                  ("train.micro_batch", "train.seq_len"))._replace(steps=t.steps),
            phase(f"evaluation ({name})", cfg, name, opts, (rc.eval.batch, seq),
                  (t.steps // (rc.eval.every or t.steps) + 2) * eval_tokens, ("eval.batch",), train=False),
        ]
        if final:
            phases.append(phase(f"final held-out evaluation ({name})", cfg, name, opts, final, final_tokens, keys,
                                train=False))
    return phases


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

    def __init__(self, rc: CptRunConfig, preset_name: str, paths: Paths, source: ModelSource | None = None) -> None:
        """`source`: the model to continue as the command line resolved it (train-cpt --model); None: the config's
        `base` (a preset, --set base=...), resolved here. Either way the config's `base` becomes the source's path
        (a .gguf file's dequantized folder: what names the run)."""
        source = resolved(source if source is not None else ModelSource.parse(rc.base), paths.cache)
        if source.path != rc.base:
            rc = replace(rc, base=source.path)
        self.base = base_model(source)  # how the base's kind is used, decided here once
        self.own = self.base.own  # a SCALE or LoRA checkpoint as the base: trains as its own method
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
        return cpt_phases(self.rc, self.base, methods, world,
                          evals.tokens("old") + evals.tokens("new") if evals else 0, final)

    def check(self, methods: dict[str, Method], dist: Dist) -> None:
        rc = self.rc
        for name in methods:
            rc.method_lr(name)  # every method has its rate: one line naming the key to set otherwise
        t = rc.train
        micro = self._micro(dist)[0]
        if micro < 1 or t.batch % (micro * dist.world):
            raise ScaleclError(f"train.batch={t.batch} must be a multiple of micro_batch x processes = "
                               f"{t.micro_batch or '(batch / processes)'} x {dist.world}")
        own = self.own
        for name in methods if own is not None else ():
            if name != own["method"]:
                raise ScaleclError(f"{rc.base} is a {own['method']} checkpoint: it trains on as {own['method']} only "
                                   f"(got --method {name}); give --method {own['method']}, or its base model "
                                   f"({own.get('base_model')}) to start another method")
        corpora = {"data": rc.data, "old_eval": rc.old_eval, "new_eval": rc.new_eval}
        uses_builtin = self.base.stand_in or any(c.path.startswith(f"{BUILTIN}:") for c in corpora.values())
        for where, cc in corpora.items():
            if cc.path.startswith(f"{BUILTIN}:"):
                check_builtin_spec(cc, where)
            else:
                check_corpus(corpus_spec(cc, None))
        self.bilingual = bilingual_config(rc) if uses_builtin else None
        base_cfg = self.base.check(rc)
        n_pos = max_positions(base_cfg)
        if n_pos is not None and rc.train.seq_len > n_pos:
            raise ScaleclError(f"train.seq_len={rc.train.seq_len} exceeds the model's {n_pos} positions")
        self.final_lengths = final_lengths(rc, n_pos)
        for m in methods.values():
            m.check(base_cfg)

    # -- shared data and the base --------------------------------------------------------------------------

    def _status(self, dist: Dist, text: str):
        return console.status(text) if dist.main else contextlib.nullcontext()

    def prepare(self, runtime: Runtime) -> None:
        """The builtin corpus (generated once), the tokenizer and the evaluation sets."""
        rc, dist = self.rc, runtime.dist
        t0 = time.perf_counter()
        self.begin(runtime)
        self.root = builtin_root(rc, self.paths.cache) if self.bilingual is not None else None
        if self.root is not None:
            if dist.main:
                with self._status(dist, "generating the bilingual stand-in corpus"):
                    write_corpus(self.root, self.bilingual, rc.builtin.vocab, rebuild=runtime.force)
            dist.barrier()
        self.tok_src = rc.tokenizer or self.base.tokenizer(self.root)
        self.tokenizer = open_tokenizer(self.tok_src)
        self.train_spec = corpus_spec(rc.data, self.root)
        old_spec, new_spec = corpus_spec(rc.old_eval, self.root), corpus_spec(rc.new_eval, self.root)
        if dist.main and self.own_note:
            runtime.say(escape(self.own_note))
        for where, spec in (("data", self.train_spec), ("old_eval", old_spec), ("new_eval", new_spec)):
            if dist.main and (warn := wrap_warning(spec)) is not None:
                runtime.say(escape(f"warning: {where}: {warn}"))
        seq = rc.train.seq_len
        with self._status(dist, "tokenising the evaluation sets"):
            old_chunks = eval_chunks(old_spec, self.tokenizer, seq, "old-domain evaluation set")
            new_chunks = eval_chunks(new_spec, self.tokenizer, seq, "new-domain evaluation set")
        full = [c for c in old_chunks if len(c) == seq]
        if not full:
            raise ScaleclError(f"the old-domain evaluation set has no full {seq}-token chunk for the representation "
                               f"batch")
        self.evals = EvalSets(old_chunks, new_chunks, old_spec.describe(), new_spec.describe(),
                              torch.stack(full[: rc.eval.rep_batch]))
        if self.final_lengths:
            with self._status(dist, "tokenising the final held-out sets"):
                for split, cc in (("old", rc.old_eval), ("new", rc.new_eval)):
                    spec = corpus_spec(replace(cc, take=rc.eval.final_take), self.root)
                    what = f"{'old' if split == 'old' else 'new'}-domain final held-out set"
                    self.final_sets[split] = FinalSet(spec.describe(), {n: eval_chunks(spec, self.tokenizer, n, what)
                                                                        for n in self.final_lengths})
        self.data_s = time.perf_counter() - t0

    def stages(self, runtime: Runtime) -> None:
        """The base (pre-trained and cached when builtin) and its hidden states on the representation batch."""
        rc = self.rc
        self.base_source, self.base_info = self.base.stage(self, runtime)  # the builtin base: pre-trained, cached
        base = self.load_base().to(runtime.device)
        self.never_rows = self._never_rows(base.get_output_embeddings().weight.shape[0]) if rc.eval.never_tokens else None
        ev = self.evals
        ev.d_model = getattr(base, "scale_base_sizes", {}).get("hidden_size") or base.config.hidden_size  # d: unwidened
        ev.h0 = final_hidden(base, ev.rep_ids.to(runtime.device), ev.d_model)
        if self.final_sets:  # the start of every method (each is exact at initialisation): scored once
            self.heldout_scores(base, None, "base")
        del base
        info = self.base_info
        done = "random initialisation, not pre-trained" if info.get("steps") == 0 else f"pre-trained {info.get('wall_s')} s"
        base_line = (f"base: {self.base_source}" + (f" ({done}{', cached' if info.get('cached') else ''})"
                                                    if info else ""))
        runtime.say(f"{base_line}; tokenizer {escape(self.tok_src)}, vocab {len(self.tokenizer):,}; old-domain eval: "
                    f"{ev.line('old')}; new-domain eval: {ev.line('new')} (seq {rc.train.seq_len}); "
                    f"{runtime.dist.world} process(es)")

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
        return self.base.load(self.base_source)

    # -- one method ----------------------------------------------------------------------------------------

    def _micro(self, dist: Dist) -> tuple[int, int]:
        return micro_split(self.rc.train.batch, self.rc.train.micro_batch, dist.world)

    def build(self, method: Method) -> torch.nn.Module:
        torch.manual_seed(run_stream_seed(self.rc.seed, self.rc.run_seed))
        if self.own is not None:  # already the method's model (check: the same method and options)
            return self.attach(self.load_base(), method)
        return self.attach(method.apply(self.load_base()), method)

    def save_kw(self) -> dict[str, Any]:  # the length it trains at: eval-ppl's default (scalecl.experiments.eval_ppl)
        return {"base_model": self.base_source, "tokenizer": self.tokenizer,
                "extra": {"train_seq_len": self.rc.train.seq_len}}

    def batches(self, method: Method, runtime: Runtime) -> RankBatches:
        rc = self.rc
        order = run_stream_seed(rc.seed, rc.run_seed) if rc.run_seed else None  # run seed 0: stream order
        self.chunks = PackedChunks(lambda: iter_texts(self.train_spec), self.tokenizer, rc.train.seq_len,
                                   loop=True, name="training corpus", order_seed=order)
        return RankBatches(self.chunks, self._micro(runtime.dist)[0], runtime.dist.world, runtime.dist.rank)

    def plan(self, method: Method, runtime: Runtime) -> TrainPlan:
        rc, t = self.rc, self.rc.train
        lr = self.lr_of(method)
        every = rc.eval.every or t.steps
        return TrainPlan(t.steps, OptimConfig.of(t, lr, round(t.warmup_ratio * t.steps)),
                         accum=self._micro(runtime.dist)[1],
                         autocast=autocast_dtype(rc.dtype, runtime.device, rc.compute.cpu_bf16),
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
                r = perplexity(model, chunks, rc.eval.batch, autocast, functools.partial(method_stats, method, model, at=at),
                               progress=advance)
                rec |= {f"{split}/ppl": round(r["ppl"], 6), f"{split}/nll": round(r["nll"], 6)}
                rec |= {f"{split}/{k}": round(v, 6) for k, v in r.items() if k.startswith("route_")}
                rec |= {f"{split}/{k}": v for k, v in route_stats(at).items()}
            rec["rep_cos"] = round(representation_cosine(ev.h0, final_hidden(model, ev.rep_ids.to(self.device),
                                                                               ev.d_model)), 9)
        rec |= {k: round(v, 6) for k, v in upscaled_norms(model).items()}
        return rec

    def result(self, method: Method, run: Run, res, runtime: Runtime) -> dict[str, Any]:
        ev, records = self.evals, res.records
        first, last = records[0], records[-1]
        micro, accum = self._micro(runtime.dist)
        heldout = {}
        if self.final_sets:
            self.heldout_scores(res.model, method, "end")
            heldout = {"heldout": self.heldout_record()}
        return self.envelope(method, res, runtime) | {
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


