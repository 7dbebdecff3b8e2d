"""The biography experiment (paper Sec. 5.1, Fig. 8; Zheng et al. 2025 protocol, spec biography.md).

Stage 1 pre-trains a random-init GPT-NeoX on biographies, stage 2 fine-tunes it on Task 0 QA, stage 3
applies a method and fine-tunes on Task 1 QA of new people while first-token accuracy on held-out Task 0
people and on Task 1 people is tracked. Stages 1 and 2 do not depend on the method: each is cached under a
hash of everything it depends on and reused by every method. `BioExperiment` is what the sweep
(scalecl.experiments.sweep) runs; every stage is a run (scalecl.training.run, trained by scalecl.training.fit): checkpointed, resumable,
guarded against divergence; a finished method run is found before any stage is built.

Protocol details that follow the reference code (zzz47zzz/spurious-forgetting): every biography text
starts with a space (" Name ..."); in pre-training the token right after each EOS is not a target (it
starts an unrelated biography); stages 2 and 3 use AdamW eps 1e-6 with a cosine schedule from lr down to
0.9 lr (presets); stage 3 is evaluated densely early (the collapse is within ~200 steps).

Several processes: run the same command under `torchrun --nproc_per_node N`. Every stage's batch is the
global batch: each optimizer step's rows are cut into processes x accumulation micro-batches of
`compute.micro_batch` rows (scalecl.data.batches.RowShards), so N processes compute what one process
computes with the same micro-batches. Replicas are DDP or FSDP2 shards (`compute.parallel`). Every process
runs every evaluation (the same forwards, as FSDP requires; an evaluation costs what it costs on one GPU),
and only rank 0 writes caches, checkpoints and results. The data (people, tokenizer, QA sets) are prepared
by scalecl.experiments.bio_data.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from scalecl.common.consoles import make_console
from scalecl.common.errors import ScaleclError
from scalecl.common.schema import config_hash, numerics_key, run_stream_seed
from scalecl.compute.perf import autocast_dtype, compile_mode
from scalecl.compute.processes import Dist
from scalecl.data.batches import RowShards, packed_batches
from scalecl.data.biography import ATTRIBUTES, pretrain_texts, ranges
from scalecl.data.tokenizer import cached_encoding, open_tokenizer
from scalecl.evaluation.qa import QATensors, qa_accuracy, qa_batches
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
from scalecl.experiments.bio_data import (
    LOCAL_HINT,
    TEXT_FORMAT,
    BioData,
    attribute_priors,
    base_model_config,
    bio_config,
    never_target_rows,
    prepare_data,
    qa_slice,
)
from scalecl.experiments.config import BioRunConfig, StageConfig
from scalecl.methods import Method
from scalecl.methods.average import BaseAverage
from scalecl.models.build import model_from_config
from scalecl.training.checkpoint import load_model
from scalecl.training.fit import Runtime, TrainPlan, fit
from scalecl.training.optim import OptimConfig
from scalecl.training.progress import eval_progress
from scalecl.training.record import chance_floor
from scalecl.training.run import Run

console = make_console()  # off a terminal: lines are not wrapped at 80 columns


def micro_batch(rc: BioRunConfig, stage: StageConfig, world: int) -> tuple[int, int]:
    """(rows per forward, accumulation steps) of a stage with `world` processes (checked by BioExperiment.check)."""
    return micro_split(stage.batch, rc.compute.micro_batch, world)


def micro_key(rc: BioRunConfig, world: int, *stages: str) -> dict[str, int]:
    """The rows per forward of each stage that accumulates (fewer rows than its batch): they change the
    numbers (a step's loss is the mean of its micro-batches' means), so they are part of a run's name and of
    a stage's cache key. Empty without accumulation, so such names are what they always were."""
    rows = {s: micro_batch(rc, getattr(rc, s), world)[0] for s in stages}
    return {s: r for s, r in rows.items() if r != getattr(rc, s).batch}


def _flat(prefix: str, d: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}/{k}": round(v, 6) for k, v in d.items()}


# ---------------------------------------------------------------------------------------------------------
# cached stages


def accuracies(model: torch.nn.Module, sets: dict[str, QATensors], batch: int, desc: str, *, exact: bool = False,
               method: Method | None = None, quiet: bool = False) -> dict[str, dict[str, float]]:
    """qa_accuracy on each named QA set, shown as one evaluation (`desc`, counted in questions) on the progress
    display in use (scalecl.training.progress.eval_progress); the numbers are qa_accuracy's."""
    with eval_progress(desc, sum(len(qa) for qa in sets.values()), "questions", quiet=quiet) as advance:
        return {name: qa_accuracy(model, qa, batch, exact=exact, method=method, progress=advance)
                for name, qa in sets.items()}


def train_stage(run: Run, plan: TrainPlan, *, build, batches, info, runtime: Runtime) -> dict:
    """Train a stage on every process (resuming its own checkpoints); rank 0 caches it. Its record."""
    t = time.perf_counter()
    res = fit(run, plan, build=build, batches=batches, runtime=runtime)
    stage = stage_record(run, res, t, **info(res.model), accumulation=plan.accum, speed=res.speed)
    if res.resumed_from:
        stage["resumed_from"] = res.resumed_from
    if runtime.dist.main:
        run.finish(None, res.export.cpu(), extra={"stage": stage})
        run.remove_checkpoints()  # the cache folder now holds the stage: its own checkpoints are spent
    runtime.dist.barrier()
    return stage


# ---------------------------------------------------------------------------------------------------------
# the memory and time estimate (scalecl.experiments.budget)


def bio_phases(rc: Any, methods: list[str], world: int, vocab: int = 0, qa_len: int = 0) -> list:
    """The phases of a biography sweep: stages 1-2, then each method's stage 3 and its evaluations. `vocab`
    (head rows) and `qa_len` (the longest QA sequence) come from the prepared data; without them, from the
    preset (model.vocab; a rough count of the local tokenizer's words; QA_TOKENS)."""
    from scalecl.experiments.budget import QA_TOKENS, phase

    data = bio_config(rc)
    if not vocab:
        vocab = rc.model.vocab or (data.n_first + data.n_middle + data.n_last + 2 * data.n_cities
                                   + 3 * data.n_universities + 2 * data.n_majors + 2 * data.n_companies + 400)
    cfg = copy.deepcopy(base_model_config(rc))
    cfg.vocab_size = vocab
    qa = min(qa_len or QA_TOKENS, rc.model.context)
    mb = "compute.micro_batch"
    s1, s2, s3 = (micro_batch(rc, getattr(rc, s), world)[0] for s in ("stage1", "stage2", "stage3"))
    ctx = rc.model.context
    phases = [
        phase("stage 1", cfg, None, {}, (s1, ctx), rc.stage1.steps * rc.stage1.batch * ctx // world,
              ("stage1.batch", mb, "model.context"))._replace(steps=rc.stage1.steps),
        phase("stage 2", cfg, None, {}, (s2, qa), rc.stage2.steps * rc.stage2.batch * qa // world,
              ("stage2.batch", mb))._replace(steps=rc.stage2.steps),
    ]
    for name in methods:
        opts = rc.method_options(name)
        evals = rc.eval.count(rc.stage3.steps) * 2 * rc.eval.slice_people * 6 + data.n_people * 6
        phases += [
            phase(f"stage 3 ({name})", cfg, name, opts, (s3, qa),
                  rc.stage3.steps * rc.stage3.batch * qa // world, ("stage3.batch", mb))._replace(steps=rc.stage3.steps),
            phase(f"evaluation ({name})", cfg, name, opts, (min(rc.eval.batch, data.n_people * 6), qa),
                  evals * qa, ("eval.batch",), train=False),
        ]
    return phases


# ---------------------------------------------------------------------------------------------------------
# the experiment


def _summary_cells(r: dict[str, Any]) -> list[str]:
    s = r["summary"]
    return [*(f"{s[k]:.3f}" for k in ("task0_start", "task0_min", "task0_end", "task1_start", "task1_end")),
            f"{r['final']['task0_heldout']['acc']:.3f}", f"{r['final']['task1']['acc']:.3f}"]


def _chance_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    """Always answering each attribute's most common first token, when the runs agree on it."""
    floor = [chance_floor(results, part) for part in ("task0_heldout", "task1")]
    return [] if None in floor else [["chance (most common answer)", *[""] * 5, *(f"{f:.3f}" for f in floor)]]


BIO_TABLE = EndTable(
    "biography: hard first-token accuracy (T0 = held-out Task 0, T1 = Task 1; slices during training, full ranges "
    "at the end)", ("T0 start", "T0 min", "T0 end", "T1 start", "T1 end", "T0 full", "T1 full"),
    _summary_cells, _chance_rows)


class BioExperiment(ExperimentBase):
    """The biography protocol as an experiment of the sweep: stages 1-2 cached, stage 3 per method."""

    name = "bio"
    not_named = (*ExperimentBase.not_named, "lr_scale")  # the run's own rate is named (lr_of)
    named_when_set = {"ensemble": {"mode": "none", "base_weight": 0.5}}
    end_table = BIO_TABLE

    def __init__(self, rc: BioRunConfig, preset_name: str, paths: Paths) -> None:
        super().__init__(rc, preset_name, paths)
        self.cache = paths.cache / "bio"
        self.data: BioData | None = None  # prepare
        self.base_cfg: Any = None  # prepare: the model's config with the tokenizer's rows
        self.slices: dict[str, QATensors] = {}  # prepare: the evaluation slices
        self.docs: Any = None  # prepare: the pre-training biographies, encoded
        self.stage2_dir: Path | None = None  # stages: the model every method starts from
        self.stage_info: dict[str, Any] = {}

    # -- before anything is written ----------------------------------------------------------------------

    def budget_phases(self, methods: list[str], world: int) -> list:
        """What the sweep will run, for scalecl.experiments.budget's estimate; from the prepared data when it is ready (the
        head's rows, the longest QA sequence), else from the preset."""
        data = self.data
        qa = max((q.ids.shape[1] for q in data.qa.values()), default=0) if data is not None else 0
        phases = bio_phases(self.rc, methods, world, self.base_cfg.vocab_size if data is not None else 0, qa)
        cached = self.cached_stages(world)  # a cached stage will not run: its memory and time do not count
        return [p for p in phases if p.name not in cached] or phases

    def check(self, methods: dict[str, Method], dist: Dist) -> None:
        rc = self.rc
        for key in ("stage1", "stage2", "stage3"):
            stage = getattr(rc, key)
            if stage.batch % dist.world or (stage.batch // dist.world) % micro_batch(rc, stage, dist.world)[0]:
                per = rc.compute.micro_batch or "batch / processes"
                raise ScaleclError(f"{key}.batch={stage.batch} must be a multiple of processes x "
                                   f"compute.micro_batch = {dist.world} x {per}")
        r = ranges(bio_config(rc))
        for stage, (lo, hi) in (("stage2", r.task0_train), ("stage3", r.task1)):  # QA rows: 6 per person
            rows = (hi - lo) * len(ATTRIBUTES)
            if getattr(rc, stage).batch > rows:
                raise ScaleclError(f"{stage}.batch={getattr(rc, stage).batch} exceeds the {rows} QA pairs the "
                                   f"stage trains on; lower it or generate more people (data_overrides)")
        probe = base_model_config(rc)  # sizes only: the vocabulary comes with the tokenizer
        for m in methods.values():
            m.check(probe)
        compiled = self._compiled(rc.stage3)
        if rc.ensemble.mode != "none" and (dist.world > 1 or compiled or rc.compute.activation_checkpointing):
            raise ScaleclError(f"ensemble.mode={rc.ensemble.mode} runs in one process without compute.compile and "
                               f"compute.activation_checkpointing (the averaged model is not a transformers model)")

    @property
    def stream_seed(self) -> int:
        """Stage 3's seed (data order, random initialisation) from the base and run seeds."""
        return run_stream_seed(self.rc.seed, self.rc.run_seed)

    def name_parts(self, dist: Dist) -> tuple:
        micro = micro_key(self.rc, dist.world, "stage1", "stage2", "stage3")  # accumulation changes the numbers
        return (micro,) if micro else ()

    # -- shared data and stages ----------------------------------------------------------------------------

    def prepare(self, runtime: Runtime) -> None:
        rc, dist = self.rc, runtime.dist
        tokenizer = open_tokenizer(rc.tokenizer, LOCAL_HINT) if rc.tokenizer != "local" else None  # fails before any write
        self.begin(runtime)  # the code that runs is this commit's
        t0 = time.perf_counter()
        for turn in ("main", "others"):  # rank 0 trains and caches the local tokenizer; the others then read it
            if dist.main == (turn == "main"):
                with console.status("generating biographies and tokenizer") if dist.main else contextlib.nullcontext():
                    self.data = prepare_data(rc, self.cache, tokenizer, rebuild=runtime.force and dist.main)
            dist.barrier()
        data = self.data
        self.stage_info["data_s"] = round(time.perf_counter() - t0, 1)
        self.base_cfg = base_model_config(rc, data.tokenizer)
        runtime.say(f"data: {len(data.people):,} people, vocab {len(data.tokenizer):,} (model rows "
               f"{self.base_cfg.vocab_size:,}), QA task0 {len(data.qa['task0_train']):,} / held-out "
               f"{len(data.qa['task0_heldout']):,} / task1 {len(data.qa['task1']):,} ({self.stage_info['data_s']} s)")
        self.slices = {"task0": qa_slice(data.qa["task0_heldout"], rc.eval.slice_people),
                       "task1": qa_slice(data.qa["task1"], rc.eval.slice_people)}
        lo, hi = ranges(data.cfg).pretrain
        encoded = self.cache / f"encoded-{config_hash(asdict(data.cfg), self.tokenizer_key, TEXT_FORMAT, (lo, hi))}"
        if dist.main:  # an entry keyed by an earlier version's spelling of --cache: renamed, not encoded again
            adopt_entry(encoded.with_name(
                f"encoded-{config_hash(asdict(data.cfg), data.tokenizer_dir, TEXT_FORMAT, (lo, hi))}"), encoded,
                runtime.say)
        dist.barrier()
        self.docs = cached_encoding(  # keyed like the stage caches; the encoding of the paper's corpus takes minutes
            data.tokenizer, lambda: pretrain_texts(data.people, data.cfg, lo, hi), encoded,
            write=dist.main, rebuild=runtime.force and dist.main, say=runtime.say)
        corpus = sum(len(doc) + 1 for doc in self.docs)  # tokens of one epoch (each biography + EOS)
        if corpus // rc.model.context < rc.stage1.batch:  # a check on the data: before any stage or value trains
            raise ScaleclError(f"stage1.batch={rc.stage1.batch} exceeds the {corpus // rc.model.context} chunks of "
                               f"model.context={rc.model.context} tokens the biographies give; lower stage1.batch or "
                               f"model.context, or generate more people (data_overrides)")

    def _stage_plan(self, stage: StageConfig, desc: str, dist: Dist, **kw: Any) -> TrainPlan:
        """A stage's plan: its optimizer (at rate `lr`, default the stage's), accumulation for `dist.world`
        processes, bf16 autocast on CUDA when asked for, checkpoint cadence and compute options."""
        return TrainPlan(stage.steps, OptimConfig.of(stage, kw.pop("lr", stage.lr), stage.warmup),
                         accum=micro_batch(self.rc, stage, dist.world)[1],
                         autocast=autocast_dtype(self.rc.dtype, self.device, self.rc.compute.cpu_bf16),
                         save_every=self.rc.checkpoint.every, save_seconds=self.rc.checkpoint.seconds,
                         compute=self.rc.compute, desc=desc, **kw)

    def _compiled(self, stage: StageConfig) -> bool:
        """Whether the stage's model runs compiled (compute.compile for its steps): its QA batches then keep one
        shape (scalecl.evaluation.qa.qa_batches)."""
        return compile_mode(self.rc.compute.compile, self.device, stage.steps) != "off"

    def _shards(self, batches: Iterator[dict], stage: StageConfig, dist: Dist) -> RowShards:
        return RowShards(batches, micro_batch(self.rc, stage, dist.world)[0], dist.world, dist.rank)

    @property
    def tokenizer_key(self) -> str:
        """The tokenizer as the cache keys name it: independent of how --cache or --tokenizer is spelled."""
        return path_key(self.data.tokenizer_dir, self.cache.parent)

    def _stage_keys(self, world: int, tokenizer: str | None = None) -> tuple[str, str]:
        """The cache keys of stages 1 and 2 (the data must be prepared); `tokenizer`: as a key names it
        (default `tokenizer_key`; an earlier version's spelled path, to find its entries)."""
        rc, data = self.rc, self.data
        m1, m2 = micro_key(rc, world, "stage1"), micro_key(rc, world, "stage2")
        key1 = config_hash(asdict(data.cfg), tokenizer or self.tokenizer_key, rc.model, rc.stage1, rc.seed,
                           TEXT_FORMAT, *([m1] if m1 else []), *numerics_key(self.numerics))
        return key1, config_hash(key1, rc.stage2, *([m2] if m2 else []))  # stage 2's key holds stage 1's, numerics too

    def cached_stages(self, world: int) -> set[str]:
        """The stages ("stage 1", "stage 2") whose finished model is already in the cache (data prepared)."""
        if self.data is None:
            return set()
        done = set()
        for label, stage, key in zip(("stage 1", "stage 2"), ("stage1", "stage2"), self._stage_keys(world), strict=True):
            if (self.cache / f"{stage}-{key}" / "scalecl.json").is_file():
                done.add(label)
        return done

    def stages(self, runtime: Runtime) -> None:
        """Stage 1 (pre-training on biographies) and stage 2 (Task 0 QA), each cached under its key."""
        rc, data, dist = self.rc, self.data, runtime.dist
        key1, key2 = self._stage_keys(dist.world)
        if dist.main:  # entries keyed by an earlier version's spelling of the paths: renamed, not trained again
            old_keys = self._stage_keys(dist.world, data.tokenizer_dir)
            for stage, old, new in zip(("stage1", "stage2"), old_keys, (key1, key2), strict=True):
                adopt_entry(self.cache / f"{stage}-{old}", self.cache / f"{stage}-{new}", runtime.say)
        dist.barrier()
        docs = self.docs  # prepare: the encoded pre-training biographies
        corpus = sum(len(doc) + 1 for doc in docs)  # tokens of one epoch (each biography + EOS)
        self.never_rows = never_target_rows(docs, data.qa.values(), self.base_cfg.vocab_size,
                                            data.tokenizer.eos_token_id)
        s1_batches = packed_batches(docs, data.tokenizer.eos_token_id, rc.model.context, rc.stage1.batch, rc.seed)
        s1_run, s2_run = (stage_run(self.cache, f"{stage}-{key}", f"bio-{stage}", key, rc.checkpoint.keep, dist.main,
                                    {"tokenizer": data.tokenizer}, self.numerics)
                          for stage, key in (("stage1", key1), ("stage2", key2)))
        s1 = cached_stage(s1_run, runtime, lambda: train_stage(
            s1_run, self._stage_plan(rc.stage1, "stage 1: pre-train", dist, resume="auto"),
            build=lambda: model_from_config(self.base_cfg, seed=rc.seed),
            batches=self._shards(s1_batches, rc.stage1, dist),
            info=lambda m: {"params": sum(p.numel() for p in m.parameters()), "corpus_tokens": corpus,
                            "epochs": round(rc.stage1.steps * rc.stage1.batch * rc.model.context / corpus, 2)},
            runtime=runtime))
        heldout, train0 = data.qa["task0_heldout"], data.qa["task0_train"]
        s2 = cached_stage(s2_run, runtime, lambda: train_stage(
            s2_run, self._stage_plan(rc.stage2, "stage 2: Task 0 QA", dist, resume="auto"),
            build=lambda: load_model(s1_run.final_dir),
            batches=self._shards(qa_batches(train0, rc.stage2.batch, rc.seed, self._compiled(rc.stage2)), rc.stage2,
                                 dist),
            info=lambda m: accuracies(m, {"task0_heldout": heldout, "task0_train": train0}, rc.eval.batch,
                                      "stage 2: Task 0 accuracy"), runtime=runtime))
        runtime.say(f"stage 2: held-out Task 0 accuracy {s2['task0_heldout']['acc']:.3f} "
               f"(prior {attribute_priors(heldout)['pooled']:.3f})" + (" [cached]" if s2["cached"] else ""))
        self.stage2_dir = s2_run.final_dir
        self.stage_info |= {"stage1": s1, "stage2": s2}

    # -- one method ----------------------------------------------------------------------------------------

    def build(self, method: Method) -> torch.nn.Module:
        torch.manual_seed(self.stream_seed)  # methods with random initialisation (rnd blocks) draw from here
        return self.attach(method.apply(load_model(self.stage2_dir)), method)

    def attach(self, model: torch.nn.Module, method: Method) -> torch.nn.Module:
        """ExperimentBase.attach, then, with ensemble.mode set, the model averaged with the stage-2 model it
        started from (scalecl.methods.average; a checkpoint holds the trained model alone)."""
        model = super().attach(model, method)
        e = self.rc.ensemble
        if e.mode == "none":
            return model
        return BaseAverage(model, load_model(self.stage2_dir), e.mode, e.base_weight)

    def save_kw(self) -> dict[str, Any]:
        return {"tokenizer": self.data.tokenizer, "base_model": str(self.stage2_dir)}

    def batches(self, method: Method, runtime: Runtime) -> Iterator[dict]:
        rc = self.rc
        task1 = qa_batches(self.data.qa["task1"], rc.stage3.batch, self.stream_seed + 3, self._compiled(rc.stage3))
        return self._shards(task1, rc.stage3, runtime.dist)

    def plan(self, method: Method, runtime: Runtime) -> TrainPlan:
        rc, lr = self.rc, self.lr_of(method)
        return self._stage_plan(rc.stage3, f"stage 3: {method.name}", runtime.dist, lr=lr,
                                eval_steps=rc.eval.steps(rc.stage3.steps),
                                tracker_config={"method": method.name, "options": method.options(), "lr": lr,
                                                **asdict(rc)})

    def evaluate(self, model: torch.nn.Module, method: Method, step: int, loss: float) -> dict[str, Any]:
        rec = {"step": step, "loss": None if step == 0 else round(loss, 6)}
        got = accuracies(model, self.slices, self.rc.eval.batch, f"stage 3: {method.name}: evaluation at step {step}",
                         method=method, quiet=True)  # dozens of these: in a log only a long one prints
        for split, r in got.items():
            rec |= _flat(split, r)
        # routing over every token of the Task 0 slice, also under the unprefixed keys route_preserve, route_adapt
        rec |= {k.removeprefix("task0/"): v for k, v in rec.items() if k in ("task0/route_preserve",
                                                                              "task0/route_adapt")}
        return rec

    def result(self, method: Method, run: Run, res, runtime: Runtime) -> dict[str, Any]:
        rc, data, model, info = self.rc, self.data, res.model, self.stage_info
        runtime.say(f"{method.name}: evaluating the full Task 0 held-out and Task 1 ranges")
        final = accuracies(model, {k: data.qa[k] for k in ("task0_heldout", "task1")}, rc.eval.batch,
                           f"{method.name}: full-range evaluation", exact=True)  # every process: lock-step
        t0 = [r["task0/acc"] for r in res.records]
        t1 = [r["task1/acc"] for r in res.records]
        stages = {k: {kk: vv for kk, vv in info[k].items() if kk != "cached"} for k in ("stage1", "stage2")}
        return self.envelope(method, res, runtime) | {
            "never_target_rows": int(self.never_rows.sum()),
            **({"ensemble": asdict(rc.ensemble) | {"base": str(self.stage2_dir)}}
               if rc.ensemble.mode != "none" else {}),
            "data": asdict(data.cfg), "tokenizer": data.tokenizer_dir,
            "vocab": {"tokenizer": len(data.tokenizer), "model": model.config.vocab_size},
            "wall_s": {"data": info["data_s"], "stage1": info["stage1"]["wall_s"], "stage2": info["stage2"]["wall_s"],
                       "stage3": res.timing["train_s"], "stage3_eval": res.timing["eval_s"]},
            "stages_cached": {"stage1": info["stage1"]["cached"], "stage2": info["stage2"]["cached"]},
            "accumulation": {"stage1": info["stage1"].get("accumulation"), "stage2": info["stage2"].get("accumulation"),
                             "stage3": micro_batch(rc, rc.stage3, runtime.dist.world)[1]},
            **stages,
            "priors": {"task0_heldout": attribute_priors(data.qa["task0_heldout"]),
                       "task1": attribute_priors(data.qa["task1"])},
            "summary": {"task0_start": t0[0], "task0_end": t0[-1], "task0_min": min(t0), "task1_start": t1[0],
                        "task1_end": t1[-1], "final_loss": res.losses[-1]},
            "final": final,
            "checkpoint": str(run.final_dir),
        }
