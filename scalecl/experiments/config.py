"""Dataclass configs: the only schema. Values mirror the CLI flags one to one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from scalecl.common.errors import ScaleclError
from scalecl.common.schema import (  # noqa: F401
    MAX_DOCS,
    MAX_LAYERS,
    MAX_SEED,
    MAX_SIZE,
    MAX_STEPS,
    MAX_THREADS,
    Raw,
    check_config,
    coerce,
    merge,
    opt,
    parse_scalar,
    parse_sets,
    parse_value,
)
from scalecl.training.optim import SCHEDULES, AdamWConfig

# ---------------------------------------------------------------------------------------------------------
# Experiment configs: presets are TOML files of overrides on these dataclasses. One typed schema: every key
# has a declared type and, where it matters, a range or a set of choices; unknown keys, wrong types and
# values out of range are one clear error before any work (load_preset -> check_config).


@dataclass
class ModelShape:
    """A GPT-NeoX (Pythia architecture) decoder built from scratch for the biography protocol."""

    arch: str = opt("gpt_neox", choices=("gpt_neox", "llama"))
    hidden: int = opt(128, ge=1, le=MAX_SIZE)
    layers: int = opt(4, ge=1, le=MAX_LAYERS)
    heads: int = opt(4, ge=1, le=MAX_SIZE)
    ffn: int = opt(512, ge=1, le=MAX_SIZE)
    context: int = opt(128, ge=2, le=MAX_SIZE)
    rotary_pct: float = opt(0.25, ge=0.0, le=1.0)  # Pythia
    # rows of the embedding and the head: 0 = the tokenizer's size; larger pads them with rows no text uses,
    # as Pythia's 50,304 pads its 50,277-token tokenizer (the router's cosine over unused logits)
    vocab: int = opt(0, ge=0, le=MAX_SIZE)

    def check(self, where: str) -> None:
        if self.hidden % self.heads:
            raise ScaleclError(f"{where}hidden={self.hidden} is not divisible by {where}heads={self.heads}")


@dataclass
class StageConfig(AdamWConfig):
    """Steps, batch, learning rate and warm-up of one training stage (a new AdamW and schedule each stage)."""

    steps: int = opt(100, ge=1, le=MAX_STEPS)
    batch: int = opt(32, ge=1)
    lr: float = opt(1e-4, gt=0.0)
    warmup: int = opt(0, ge=0, le=MAX_STEPS)


PARALLEL = ("ddp", "fsdp")
# compute.compile: "auto" (the whole model on CUDA, off elsewhere), "model", "graphs" (the whole model as CUDA graphs),
# "blocks" (every decoder block), "off";
# true and false are "blocks" and "off" (scalecl.compute.perf.compile_mode)
COMPILE = (True, False, "auto", "model", "graphs", "blocks", "off")
LOSSES = ("auto", "model", "chunked", "liger", "cce")  # compute.loss (scalecl.compute.loss)


@dataclass
class ComputeConfig:
    """How a run uses its hardware: CPU threads, GPU speed options and how several processes share the model.

    None of these changes what is trained beyond floating-point rounding. Rounding alone, though, makes runs
    differ after many steps: the CPU thread count in force and the device are therefore part of every run
    name and stage cache key (scalecl.common.schema.numerics_key; at one CPU thread a name leaves them out).
    The other options are recorded in result.json only. Every option defaults to the plain behaviour.
    """

    # with several processes (torchrun): "ddp" keeps a full replica per process; "fsdp" shards parameters,
    # gradients and optimizer state per decoder layer (PyTorch FSDP2, fully_shard) for models that do not fit
    parallel: str = opt("ddp", choices=PARALLEL)
    # on a CPU, torch's intra-op threads (torch.set_num_threads), set before a run builds anything; 0 = leave
    # torch's count (OMP_NUM_THREADS, else one per core). The count splits float sums: runs at 1 and 2 threads
    # end with different numbers, so the count in force is part of a CPU run's name. The default, 1, is the
    # count of the committed runs, whose numbers it reproduces (docs/runs.md, "Reproducibility")
    threads: int = opt(1, ge=0, le=MAX_THREADS)  # at most max(256, 4 x the cores): schema.MAX_THREADS says why
    # recompute each decoder block in the backward instead of keeping its activations (long sequences: the
    # paper's 8,192 tokens); through transformers' activation_checkpointing_enable, non-reentrant
    activation_checkpointing: bool = False
    # torch.compile: "auto" (the whole model on CUDA, off elsewhere), "model", "graphs" (the whole model with
    # CUDA graphs: mode="reduce-overhead"), "blocks" (every decoder block in place), "off"; true = "blocks",
    # false = "off". A model that fails to compile trains eagerly (one line says
    # so). On a CPU it needs a C/C++ compiler for inductor's kernels
    compile: bool | str = opt("auto", choices=COMPILE)
    # the training step's loss (scalecl.compute.loss): "auto" (on CUDA the chunked linear cross-entropy for an
    # eager model and the model's own for a whole model compiled, which is faster there; the model's own
    # elsewhere), "model", "chunked", or a fused one where installed ("liger", "cce": CUDA)
    loss: str = opt("auto", choices=LOSSES)
    # optimizer steps between host reads of the loss and gradient norm (the GPU runs ahead in between);
    # 0 = automatic: 50 on CUDA, 1 elsewhere. Evaluation and checkpoint steps always read.
    sync_every: int = opt(0, ge=0, le=MAX_STEPS)
    tf32: bool = True  # CUDA only: TF32 tensor cores for float32 matrix products (bf16 autocast is unaffected)
    # on a CPU, forwards autocast to bfloat16 (the precision GPU runs use with dtype = "bfloat16"), whatever
    # `dtype` says, to check that path on a machine without a GPU; weights and optimizer state stay float32.
    # Part of a CPU run's name (its numerics) when on. Ignored on a GPU, where `dtype` decides
    cpu_bf16: bool = False


@dataclass
class BioComputeConfig(ComputeConfig):
    """ComputeConfig plus the biography stages' micro-batch (train-cpt has train.micro_batch)."""

    # sequences per process per forward in every stage (gradient accumulation makes up the stage's batch);
    # 0 = the stage's batch / processes. A stage whose batch / processes it exceeds uses that instead; it
    # must divide every stage's batch / processes
    micro_batch: int = opt(0, ge=0)


# Task 1 learning-rate multipliers over the FFT rate. Paper Sec. 5.1: SCALE-Route and LLaMA Pro train at 10x
# "because most weights are frozen"; the project applies the same reasoning to the other mostly-frozen
# methods the paper did not run on this task (Preserve, Adapt, LoRA). Freeze keeps the FFT rate, as the
# paper does for CPT.
DEFAULT_LR_SCALE = {"fft": 1.0, "freeze": 1.0, "lora": 10.0, "llama-pro": 10.0,
                    "scale-preserve": 10.0, "scale-adapt": 10.0, "scale-route": 10.0}


@dataclass
class EvalSchedule:
    slice_people: int = opt(100, ge=1)  # people per evaluation slice during stage 3 (x6 QA)
    dense_until: int = opt(100, ge=0, le=MAX_STEPS)  # evaluate every dense_every steps up to here (the collapse is early) ...
    dense_every: int = opt(5, ge=1, le=MAX_STEPS)
    every: int = opt(50, ge=1, le=MAX_STEPS)  # ... then every `every` steps
    batch: int = opt(256, ge=1)

    def steps(self, total: int) -> list[int]:
        s = set(range(0, min(self.dense_until, total) + 1, self.dense_every)) | set(range(0, total + 1, self.every))
        return sorted(s | {total})

    def count(self, total: int) -> int:
        """At least as many evaluations as steps(total) holds, computed without building it."""
        return min(self.dense_until, total) // self.dense_every + total // self.every + 3


# no run evaluates more than this many times (the schedule is built as a list before training): the longest
# protocols here evaluate about a hundred times (the paper's biography stage 3: 103)
MAX_EVALUATIONS = 100_000


def check_evaluations(n: int, where: str) -> None:
    """One ScaleclError when a run's step count and evaluation interval would evaluate more than MAX_EVALUATIONS times."""
    if n > MAX_EVALUATIONS:
        raise ScaleclError(f"{where} would evaluate about {n:,} times, more than the {MAX_EVALUATIONS:,} evaluations "
                           f"a run may have: raise the evaluation interval or lower the steps")


@dataclass
class CheckpointConfig:
    """Resumable checkpoints (model + optimizer, schedule, RNG, data position). They never change results, so
    they are not part of any run name or cache key."""

    every: int = opt(0, ge=0, le=MAX_STEPS)  # steps between checkpoints (0 = none; a run killed then restarts from step 0)
    # also a checkpoint once this many seconds (training and evaluation) passed since the last one, or ten times a
    # checkpoint's own writing time when that is longer (0 = none): an interrupt loses about this much work
    seconds: float = opt(0.0, ge=0.0, le=1e7)
    keep: int = opt(2, ge=1)  # newest checkpoints kept per run (older ones are deleted)
    # a method's checkpoints (step-N and final) hold only what it trains, with its base's identity (Freeze, LLaMA
    # Pro, SCALE; FFT and LoRA write their usual ones): loaded from the base, bit-identical to the full ones
    delta: bool = False


@dataclass
class EnsembleConfig:
    """A control for SCALE-Route's averaged branch (scalecl.methods.average): any method's model averaged in logit
    space with the frozen model it started from (the stage-2 model), `(1 - base_weight) Z + base_weight Z_base`.
    mode: "none" (off), "train" (trained through the average and scored with it), "eval" (trained as usual,
    scored with the average)."""

    mode: str = opt("none", choices=("none", "train", "eval"))
    base_weight: float = opt(0.5, ge=0.0, le=1.0)  # Route's average: 0.5


class RunConfig:
    """What every experiment's run config has, and reads the same way: per-method options (`methods`), how runs
    use the hardware (`compute`), resumable checkpoints (`checkpoint`) and the two seeds. BioRunConfig and
    CptRunConfig are dataclasses that declare these fields among their own, in the order each records in
    result.json's `config` (this base is no dataclass, so that order stays each experiment's).

    Learning rates follow one of two schemes, each named by `method_lr`: the biography's scaled rate (stage3.lr x
    lr_scale.<method>, the paper's "10x for mostly frozen methods" written once as a multiplier) and continual
    pre-training's table of rates (lr.<method>, paper Table 1)."""

    methods: dict[str, dict[str, Any]]  # per-method options ("scale" = every SCALE variant)
    checkpoint: CheckpointConfig
    compute: ComputeConfig
    seed: int  # base seed: what every method starts from (data, tokenizer, the cached stages or base)
    run_seed: int  # run seed: the method's data order and random draws

    def method_options(self, name: str) -> dict[str, Any]:
        """Options of one method: methods.scale applies to every SCALE variant, methods.<name> on top."""
        from scalecl.methods import REGISTRY

        group = REGISTRY[name].options_group if name in REGISTRY else None
        return dict(self.methods.get(group, {}) if group else {}) | dict(self.methods.get(name, {}))

    def method(self, name: str) -> Any:
        """The method `name` with this config's options, read into its declared fields (scalecl.methods): the
        one place a run's method is made from the config."""
        from scalecl.methods import get_method

        return get_method(name, **self.method_options(name))

    def method_lr(self, name: str) -> float:
        """The learning rate method `name` trains at, by the experiment's scheme."""
        raise NotImplementedError

    def check_methods(self, where: str) -> None:
        """Every methods.<name> table names a method (or 'scale'), its options get their declared types (in
        place), and every configured method's resolved options are valid."""
        _check_method_options(self.methods, f"{where}methods", self.method)


@dataclass
class BioRunConfig(RunConfig):
    """Everything a biography run depends on; stage caches and run names are hashes of parts of it."""

    data: str = opt("cpu", choices=("tiny", "cpu", "paper"))  # biography data preset (data.biography.PRESETS)
    data_overrides: dict[str, int] = opt(factory=dict)  # BioConfig fields, e.g. n_people
    tokenizer: str = "local"  # "local" trains a word-level tokenizer on the corpus; else a hub id or directory
    model: ModelShape = opt(factory=ModelShape)
    stage1: StageConfig = opt(factory=StageConfig)
    stage2: StageConfig = opt(factory=StageConfig)
    stage3: StageConfig = opt(factory=StageConfig)
    lr_scale: dict[str, float] = opt(factory=lambda: dict(DEFAULT_LR_SCALE))
    eval: EvalSchedule = opt(factory=EvalSchedule)
    checkpoint: CheckpointConfig = opt(factory=CheckpointConfig)  # every stage, the method's too
    methods: dict[str, dict[str, Any]] = opt(factory=dict)  # per-method options ("scale" = all SCALE)
    dtype: str = opt("float32", choices=("float32", "bfloat16"))  # bfloat16: autocast on GPU
    compute: BioComputeConfig = opt(factory=BioComputeConfig)  # speed and parallelism; not in any run name
    seed: int = opt(0, ge=0, le=MAX_SEED)  # base seed: people, tokenizer, stages 1-2 (their caches are keyed by it)
    run_seed: int = opt(0, ge=0, le=MAX_SEED)  # run seed: stage 3's data order and the method's random draws
    ensemble: EnsembleConfig = opt(factory=EnsembleConfig)  # stage 3's model averaged with the stage-2 model

    def method_lr(self, name: str) -> float:
        """The scaled rate: Task 1's rate, stage3.lr, times the method's lr_scale (1 when it has none)."""
        return self.stage3.lr * self.lr_scale.get(name, 1.0)

    def check(self, where: str = "") -> None:
        from scalecl.data.biography import BioConfig

        known = {f.name for f in fields(BioConfig)} - {"seed"}
        for k in self.data_overrides:
            if k not in known:
                raise ScaleclError(f"unknown config key {where}data_overrides.{k}; known: {', '.join(sorted(known))}")
        _check_method_table(self.lr_scale, f"{where}lr_scale", positive=True)
        check_evaluations(self.eval.count(self.stage3.steps),
                          f"{where}stage3.steps={self.stage3.steps} with {where}eval.every={self.eval.every}")
        self.check_methods(where)


# ---------------------------------------------------------------------------------------------------------
# Continual pre-training (paper Sec. 3.2, 3.3, 5.1): a pre-trained model, a new-language corpus, perplexity
# on the old and the new domain.

TEXT_UNITS = ("line", "paragraph")


@dataclass
class CorpusConfig:
    """One text corpus read with `datasets` in streaming mode: a hub id, a local folder or a local file.

    path "builtin:en" / "builtin:ko" is the offline bilingual stand-in (scalecl.data.bilingual), generated
    into the cache. path "pkg:konlpy-ko" (Korean), "pkg:gensim-lee-en" / "pkg:gensim-wiki-en" (English) is real
    text read at run time from an installed wheel (konlpy 0.6.0, gensim 4.4.0; scalecl.data.packaged), split
    train/test by a fixed rule. A held-out slice is the `take` documents after the first `skip`, in stream order.
    A path may also be a glob of local files ('data/*.txt'). The keys after `path` select from it; they belong to
    the corpus they were written for: a path named in overrides that differs from the preset's starts from these
    defaults (fresh_corpora).
    """

    path: str = "builtin:ko"
    name: str = ""  # dataset config name, e.g. kor_Hang ("" = none)
    split: str = "train"
    text_column: str = "text"
    skip: int = opt(0, ge=0, le=MAX_DOCS)
    take: int = opt(0, ge=0, le=MAX_DOCS)  # 0 = every document after `skip`
    # a .txt file's documents: "line" = one per line; "paragraph" = blocks separated by an empty line (datasets'
    # text builder, sample_by). Added after runs were named: left out of a run's name at "line" (CptExperiment)
    text_unit: str = opt("line", choices=TEXT_UNITS)

    def check(self, where: str) -> None:
        from scalecl.data.packaged import check_packaged_spec, is_packaged

        if not self.path.strip():
            raise ScaleclError(f"{where}path is empty")
        if is_packaged(self.path):  # its name, split and column now; whether it is installed when it is read
            check_packaged_spec(self.path, self.name, self.split, self.text_column, f"{where}path")
        if self.text_unit != "line" and (is_packaged(self.path) or self.path.startswith("builtin:")):
            raise ScaleclError(f"{where}text_unit={self.text_unit} applies to .txt text; {self.path} has its own "
                               f"documents")


def fresh_corpora(cfg: Any, updates: dict[str, Any]) -> Any:
    """`cfg` (a preset) with every corpus section whose path `updates` (the --set overrides) change back at
    CorpusConfig's defaults: the whole of the corpus's train split (a single file's only split), its 'text'
    column, no config name, one document per line. A preset's split, slice, column and text unit describe the
    preset's own corpus; applied to a file the user names instead (a `take` cutting a held-out file short, a
    split it does not have) they would select from it silently. The overrides' own keys apply on top."""
    for f in fields(cfg):
        cur, new = getattr(cfg, f.name), updates.get(f.name)
        if isinstance(cur, CorpusConfig) and isinstance(new, dict) and "path" in new \
                and str(new["path"]).strip() != cur.path:
            setattr(cfg, f.name, CorpusConfig())
    return cfg


@dataclass
class BuiltinCorpusConfig:
    """Sizes of the offline stand-in: biographies rendered in English (old domain) and Korean (new domain)."""

    people: int = opt(1_200, ge=2)  # per language; the last `heldout` of them form the test split
    heldout: int = opt(200, ge=1)
    texts: int = opt(5, ge=1)  # biographies per person (different templates and sentence orders)
    base_korean: int = opt(100, ge=0)  # further Korean people mixed into the base's pre-training (~5% of its tokens)
    vocab: int = opt(2_048, ge=300, le=MAX_SIZE)  # byte-level BPE trained on both languages (256 bytes + specials + merges)


@dataclass
class BaseShape:
    """The small decoder the suite pre-trains on the stand-in's English domain plus a little Korean (base = "builtin")."""

    arch: str = opt("llama", choices=("gpt_neox", "llama"))
    hidden: int = opt(128, ge=1, le=MAX_SIZE)
    layers: int = opt(4, ge=1, le=MAX_LAYERS)
    heads: int = opt(4, ge=1, le=MAX_SIZE)
    kv_heads: int = opt(4, ge=1, le=MAX_SIZE)
    ffn: int = opt(512, ge=1, le=MAX_SIZE)
    context: int = opt(128, ge=2, le=MAX_SIZE)
    tie_embeddings: bool = True  # like Llama-3.2-1B
    vocab: int = opt(0, ge=0, le=MAX_SIZE)  # embedding and head rows: 0 = the tokenizer's size; more pads (128,256: Llama-3.2-1B)

    def check(self, where: str) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ScaleclError(f"{where}hidden={self.hidden} must be a multiple of {where}heads={self.heads}, and "
                               f"heads of {where}kv_heads={self.kv_heads}")


@dataclass
class PretrainConfig(StageConfig):
    """The builtin base's pre-training; 0 steps leaves the base at its random initialisation (the paper-smoke
    preset: the paper's shapes, whose pre-training a CPU cannot afford)."""

    steps: int = opt(100, ge=0, le=MAX_STEPS)


@dataclass
class CptTrainConfig(AdamWConfig):
    """Continual pre-training of every method: one optimizer (rates per method: `lr`), linear decay after a
    warm-up ratio."""

    steps: int = opt(300, ge=1, le=MAX_STEPS)
    batch: int = opt(16, ge=1)  # global batch in sequences (all processes and accumulation steps together)
    micro_batch: int = opt(0, ge=0)  # sequences per process per forward; 0 = batch / processes (no accumulation)
    seq_len: int = opt(128, ge=2, le=MAX_SIZE)
    warmup_ratio: float = opt(0.06, ge=0.0, lt=1.0)
    schedule: str = opt("linear", choices=SCHEDULES)


@dataclass
class CptEvalConfig:
    every: int = opt(25, ge=0, le=MAX_STEPS)  # steps between evaluations (step 0 and the last step always; 0 = only those)
    batch: int = opt(16, ge=1)  # sequences per evaluation forward
    rep_batch: int = opt(8, ge=1)  # sequences of the old-domain set whose final hidden states are compared (Fig. 4a)
    # SCALE-Route's mechanism: vocabulary rows absent from the first `never_tokens` tokens of the
    # new-domain training stream (the whole corpus when it is shorter) are its "never" rows; every evaluation then
    # records, per set, the router's score quantiles over every position and each path's share of its logit
    # norm on those rows. 0 = off. Measures only: changes no other number and is not part of the run's name.
    never_tokens: int = opt(0, ge=0)
    # The final model's held-out evaluation, larger than the slices above: after the last step the base (once per
    # sweep) and each method's final model score the first `final_take` documents after each held-out set's
    # `skip` (0: every one; -1: off), at the training length and again at `final_context` tokens per sequence (0:
    # the model's positions, at most 2,048). Recorded under `heldout` in result.json.
    final_take: int = opt(-1, ge=-1, le=MAX_DOCS)
    final_context: int = opt(0, ge=0, le=MAX_SIZE)


# Paper Table 1: learning rates of continual pre-training on the Korean dataset.
PAPER_CPT_LR = {"fft": 1e-5, "lora": 1e-5, "freeze": 1e-5, "llama-pro": 2e-4,
                "scale-preserve": 1e-3, "scale-adapt": 1e-3, "scale-route": 1e-3}


@dataclass
class CptRunConfig(RunConfig):
    """Everything a CPT run depends on; the base cache and run names are hashes of parts of it."""

    base: str = "builtin"  # "builtin" pre-trains `model` on the stand-in's English (+5% Korean) corpus, cached; else hub id / dir
    tokenizer: str = ""  # "" = the base's own (builtin: a BPE trained on the stand-in)
    builtin: BuiltinCorpusConfig = opt(factory=BuiltinCorpusConfig)
    model: BaseShape = opt(factory=BaseShape)  # builtin base only
    pretrain: PretrainConfig = opt(factory=lambda: PretrainConfig())  # builtin base only (steps = 0: random weights)
    data: CorpusConfig = opt(factory=CorpusConfig)  # new-domain training corpus
    old_eval: CorpusConfig = opt(factory=lambda: CorpusConfig(path="builtin:en", split="test"))
    new_eval: CorpusConfig = opt(factory=lambda: CorpusConfig(path="builtin:ko", split="test"))
    train: CptTrainConfig = opt(factory=CptTrainConfig)
    lr: dict[str, float] = opt(factory=lambda: dict(PAPER_CPT_LR))
    eval: CptEvalConfig = opt(factory=CptEvalConfig)
    checkpoint: CheckpointConfig = opt(factory=CheckpointConfig)
    methods: dict[str, dict[str, Any]] = opt(factory=dict)  # per-method options ("scale" = all SCALE)
    dtype: str = opt("bfloat16", choices=("float32", "bfloat16"))  # bf16 autocast on GPU; CPU always runs fp32
    compute: ComputeConfig = opt(factory=ComputeConfig)  # speed and parallelism; not in any run name
    seed: int = opt(0, ge=0, le=MAX_SEED)  # base seed: the builtin corpus and base (cached under it)
    run_seed: int = opt(0, ge=0, le=MAX_SEED)  # run seed: the training stream's order and the method's draws

    def method_lr(self, name: str) -> float:
        """The table's rate: lr.<name>, or one error naming the key to set."""
        if name not in self.lr:
            raise ScaleclError(f"no learning rate for {name}: set lr.{name}")
        return self.lr[name]

    def check(self, where: str = "") -> None:
        if not self.base.strip():
            raise ScaleclError(f"{where}base is empty: 'builtin', a hub id or a local directory")
        _check_method_table(self.lr, f"{where}lr", positive=True)
        check_evaluations(self.train.steps // (self.eval.every or self.train.steps) + 2,
                          f"{where}train.steps={self.train.steps} with {where}eval.every={self.eval.every}")
        self.check_methods(where)


def _check_method_table(table: dict[str, float], where: str, positive: bool) -> None:
    """Keys of a per-method table (lr, lr_scale) must name methods; values must be positive numbers."""
    from scalecl.methods import method_names

    for k, v in table.items():
        if k not in method_names():
            raise ScaleclError(f"unknown method {where}.{k}; methods: {', '.join(method_names())}")
        if positive and not v > 0:
            raise ScaleclError(f"{where}.{k} must be > 0, got {v}")


def _check_method_options(methods: dict[str, dict], where: str, method: Callable[[str], Any]) -> None:
    """Every methods.<name> table names a method (or 'scale'), its options get their declared types (in
    place), and every configured method made from them (`method(name)`) is valid."""
    from scalecl.methods import REGISTRY, method_names, option_groups, options_class

    for k, v in methods.items():
        if k not in option_groups() and k not in method_names():
            raise ScaleclError(f"unknown method {where}.{k}; use 'scale' (all SCALE variants) or one of "
                               f"{', '.join(method_names())}")
        if not isinstance(v, dict):
            raise ScaleclError(f"{where}.{k} is a table of options, not a value")
        methods[k] = options_class(k).coerce_options(v, f"config key {where}.{k}")
    for name in method_names():
        if name in methods or REGISTRY[name].options_group in methods:
            method(name)  # types and config-free ranges (sizes need the model: later)
