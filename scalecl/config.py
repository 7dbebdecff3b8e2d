"""Dataclass configs: the only schema. Values mirror the CLI flags one to one."""

from __future__ import annotations

import math
import types
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

from .errors import ScaleclError

VARIANTS = ("preserve", "adapt", "route")
INITS = ("zero", "rnd", "svd")
COLLAB_MODULES = ("attn", "mlp")
ROUTERS = ("logit", "centered", "prob")
EMBED_INITS = ("zero", "rnd")


@dataclass(frozen=True)
class ScaleConfig:
    """How to widen a decoder and which upscaled blocks train (paper Sections 3-4, spec/method.md).

    variant:   "preserve" (every W12 frozen at zero, Eq. 3), "adapt" (W12 trains above l_fp, Eq. 4),
               "route" (both paths, cosine router, Eq. 5).
    hidden_up: channels added to the residual stream and to attention (a multiple of head_dim).
    ffn_up:    intermediate units added to every MLP.
    l_fp:      number of lowest layers whose W12 stays frozen at zero. None means L for preserve and
               L - 1 for adapt/route (only the top layer collaborates, the paper's biography setting).
    collab:    modules whose W12 trains in collaborative layers ("attn", "mlp" or both).
    init:      initialisation of (W21, W22), each "zero", "rnd" (He normal) or "svd" (paper Fig. 5).
    tau:       Route's cosine threshold in [-1, 1]. The paper gives no value; 0.9 is this project's
               default and is always recorded with the run.
    router:    what Route's cosine compares: "logit" (the paper's Eq. 5, raw logits), "centered" (logits
               centred over the vocabulary, z - mean_v z, so a uniform shift does not count) or "prob"
               (softmax probabilities). The decision is hard in every case.
    embed_init: the new embedding columns: "zero" (default) or "rnd" (normal, std = the base config's
               initializer_range, 0.02 for GPT-NeoX and Llama). "rnd" needs untied embeddings: the head's
               new columns start at zero only then, and with them the base function.
    """

    variant: str = "route"
    hidden_up: int = 128
    ffn_up: int = 128
    l_fp: int | None = None
    collab: tuple[str, ...] = ("attn", "mlp")
    init: tuple[str, str] = ("svd", "zero")
    tau: float = 0.9
    router: str = "logit"
    embed_init: str = "zero"

    def __post_init__(self) -> None:
        # normalise lists from JSON and strings from the CLI ("attn", "svd,zero") into hashable tuples
        for name in ("collab", "init"):
            v = getattr(self, name)
            object.__setattr__(self, name, tuple(v.split(",")) if isinstance(v, str) else tuple(v))
        self.validate()

    def validate(self) -> None:
        """Checks that need no model: names and ranges."""
        if self.variant not in VARIANTS:
            raise ScaleclError(f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        if len(self.init) != 2 or any(i not in INITS for i in self.init):
            raise ScaleclError(
                f"init must be a pair of {'/'.join(INITS)} for (W21, W22), got {','.join(map(str, self.init))}"
            )
        if not self.collab or any(c not in COLLAB_MODULES for c in self.collab):
            raise ScaleclError(f"collab must be attn, mlp or attn,mlp; got {','.join(map(str, self.collab))}")
        if not isinstance(self.hidden_up, int) or self.hidden_up <= 0:
            raise ScaleclError(f"hidden_up must be a positive integer, got {self.hidden_up}")
        if not isinstance(self.ffn_up, int) or self.ffn_up < 0:
            raise ScaleclError(f"ffn_up must be a non-negative integer, got {self.ffn_up}")
        if not -1.0 <= float(self.tau) <= 1.0:
            raise ScaleclError(f"tau must lie in [-1, 1], got {self.tau}")
        if self.l_fp is not None and (not isinstance(self.l_fp, int) or self.l_fp < 0):
            raise ScaleclError(f"l_fp must be a non-negative integer, got {self.l_fp}")
        if self.router not in ROUTERS:
            raise ScaleclError(f"unknown router {self.router!r}; choose one of {', '.join(ROUTERS)}")
        if self.embed_init not in EMBED_INITS:
            raise ScaleclError(f"unknown embed_init {self.embed_init!r}; choose one of {', '.join(EMBED_INITS)}")

    def resolved_l_fp(self, num_layers: int) -> int:
        """The number of function-preserving layers for a model with `num_layers` layers."""
        if self.l_fp is None:
            return num_layers if self.variant == "preserve" else num_layers - 1
        if self.l_fp > num_layers:
            raise ScaleclError(f"l_fp must lie in 0..{num_layers} for this model, got {self.l_fp}")
        if self.variant == "preserve" and self.l_fp != num_layers:
            raise ScaleclError(
                f"preserve keeps every W12 frozen (l_fp = {num_layers}); got l_fp={self.l_fp}: use adapt or route"
            )
        return self.l_fp

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["collab"] = list(self.collab)
        d["init"] = list(self.init)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScaleConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ScaleclError(f"unknown ScaleConfig keys: {', '.join(sorted(unknown))}")
        return cls(**d)


# ---------------------------------------------------------------------------------------------------------
# Experiment configs: presets are TOML files of overrides on these dataclasses. One typed schema: every key
# has a declared type and, where it matters, a range or a set of choices; unknown keys, wrong types and
# values out of range are one clear error before any work (load_preset -> check_config).


class Raw(str):
    """A value typed on the command line (--set key=value): still text, converted by the key's declared type."""


def opt(default: Any = None, *, factory: Any = None, ge: float | None = None, gt: float | None = None,
        le: float | None = None, lt: float | None = None, choices: tuple | None = None) -> Any:
    """A dataclass field with its valid range or choices (checked by check_config)."""
    meta = {k: v for k, v in dict(ge=ge, gt=gt, le=le, lt=lt, choices=choices).items() if v is not None}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelShape:
    """A GPT-NeoX (Pythia architecture) decoder built from scratch for the biography protocol."""

    arch: str = opt("gpt_neox", choices=("gpt_neox", "llama"))
    hidden: int = opt(128, ge=1)
    layers: int = opt(4, ge=1)
    heads: int = opt(4, ge=1)
    ffn: int = opt(512, ge=1)
    context: int = opt(128, ge=2)
    rotary_pct: float = opt(0.25, ge=0.0, le=1.0)  # Pythia
    # rows of the embedding and the head: 0 = the tokenizer's size; larger pads them with rows no text uses,
    # as Pythia's 50,304 pads its 50,277-token tokenizer (issue #12: the router's cosine over unused logits)
    vocab: int = opt(0, ge=0)

    def check(self, where: str) -> None:
        if self.hidden % self.heads:
            raise ScaleclError(f"{where}hidden={self.hidden} is not divisible by {where}heads={self.heads}")


SCHEDULES = ("constant", "cosine", "linear")


@dataclass
class StageConfig:
    """Steps, batch and optimiser of one training stage (a new AdamW and schedule each stage)."""

    steps: int = opt(100, ge=1)
    batch: int = opt(32, ge=1)
    lr: float = opt(1e-4, gt=0.0)
    warmup: int = opt(0, ge=0)
    schedule: str = opt("constant", choices=SCHEDULES)
    min_lr_ratio: float = opt(0.1, ge=0.0, le=1.0)  # cosine: the rate decays to min_lr_ratio x lr
    weight_decay: float = opt(0.0, ge=0.0)
    beta1: float = opt(0.9, ge=0.0, lt=1.0)
    beta2: float = opt(0.999, ge=0.0, lt=1.0)
    eps: float = opt(1e-8, gt=0.0)
    clip: float = opt(1.0, ge=0.0)  # 0 = no clipping


PARALLEL = ("ddp", "fsdp")


@dataclass
class ComputeConfig:
    """How a run uses its hardware: GPU speed options and how several processes share the model.

    None of these changes what is trained beyond floating-point rounding, so none is part of a run name or a
    cache key (result.json records them). Every option defaults to the plain behaviour.
    """

    # with several processes (torchrun): "ddp" keeps a full replica per process; "fsdp" shards parameters,
    # gradients and optimizer state per decoder layer (PyTorch FSDP2, fully_shard) for models that do not fit
    parallel: str = opt("ddp", choices=PARALLEL)
    # recompute each decoder block in the backward instead of keeping its activations (long sequences: the
    # paper's 8,192 tokens); through transformers' activation_checkpointing_enable, non-reentrant
    activation_checkpointing: bool = False
    compile: bool = False  # torch.compile every decoder block (needs a C/C++ compiler for CPU kernels)
    # optimizer steps between host reads of the loss and gradient norm (the GPU runs ahead in between);
    # 0 = automatic: 50 on CUDA, 1 elsewhere. Evaluation and checkpoint steps always read.
    sync_every: int = opt(0, ge=0)
    tf32: bool = True  # CUDA only: TF32 tensor cores for float32 matrix products (bf16 autocast is unaffected)


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
    dense_until: int = opt(100, ge=0)  # evaluate every dense_every steps up to here (the collapse is early) ...
    dense_every: int = opt(5, ge=1)
    every: int = opt(50, ge=1)  # ... then every `every` steps
    batch: int = opt(256, ge=1)

    def steps(self, total: int) -> list[int]:
        s = set(range(0, min(self.dense_until, total) + 1, self.dense_every)) | set(range(0, total + 1, self.every))
        return sorted(s | {total})


@dataclass
class CheckpointConfig:
    """Resumable checkpoints (model + optimizer, schedule, RNG, data position). They never change results, so
    they are not part of any run name or cache key."""

    every: int = opt(0, ge=0)  # steps between checkpoints (0 = none; a run killed then restarts from step 0)
    keep: int = opt(2, ge=1)  # newest checkpoints kept per run (older ones are deleted)


@dataclass
class BioRunConfig:
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
    seed: int = opt(0, ge=0)

    def method_options(self, name: str) -> dict[str, Any]:
        """Options of one method: methods.scale applies to every SCALE variant, methods.<name> on top."""
        opts = dict(self.methods.get("scale", {})) if name.startswith("scale-") else {}
        return opts | dict(self.methods.get(name, {}))

    def check(self, where: str = "") -> None:
        from .data.biography import BioConfig

        known = {f.name for f in fields(BioConfig)} - {"seed"}
        for k in self.data_overrides:
            if k not in known:
                raise ScaleclError(f"unknown config key {where}data_overrides.{k}; known: {', '.join(sorted(known))}")
        _check_method_table(self.lr_scale, f"{where}lr_scale", positive=True)
        _check_method_options(self.methods, f"{where}methods", self.method_options)


# ---------------------------------------------------------------------------------------------------------
# Continual pre-training (paper Sec. 3.2, 3.3, 5.1): a pre-trained model, a new-language corpus, perplexity
# on the old and the new domain.

@dataclass
class CorpusConfig:
    """One text corpus read with `datasets` in streaming mode: a hub id, a local folder or a local file.

    path "builtin:en" / "builtin:ko" is the offline bilingual stand-in (scalecl.data.bilingual), generated
    into the cache. A held-out slice is the `take` documents after the first `skip`, in stream order.
    """

    path: str = "builtin:ko"
    name: str = ""  # dataset config name, e.g. kor_Hang ("" = none)
    split: str = "train"
    text_column: str = "text"
    skip: int = opt(0, ge=0)
    take: int = opt(0, ge=0)  # 0 = every document after `skip`

    def check(self, where: str) -> None:
        if not self.path.strip():
            raise ScaleclError(f"{where}path is empty")


@dataclass
class BuiltinCorpusConfig:
    """Sizes of the offline stand-in: biographies rendered in English (old domain) and Korean (new domain)."""

    people: int = opt(1_200, ge=2)  # per language; the last `heldout` of them form the test split
    heldout: int = opt(200, ge=1)
    texts: int = opt(5, ge=1)  # biographies per person (different templates and sentence orders)
    base_korean: int = opt(100, ge=0)  # further Korean people mixed into the base's pre-training (~5% of its tokens)
    vocab: int = opt(2_048, ge=300)  # byte-level BPE trained on both languages (256 bytes + specials + merges)


@dataclass
class BaseShape:
    """The small decoder the suite pre-trains on the stand-in's English domain plus a little Korean (base = "builtin")."""

    arch: str = opt("llama", choices=("gpt_neox", "llama"))
    hidden: int = opt(128, ge=1)
    layers: int = opt(4, ge=1)
    heads: int = opt(4, ge=1)
    kv_heads: int = opt(4, ge=1)
    ffn: int = opt(512, ge=1)
    context: int = opt(128, ge=2)
    tie_embeddings: bool = True  # like Llama-3.2-1B

    def check(self, where: str) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ScaleclError(f"{where}hidden={self.hidden} must be a multiple of {where}heads={self.heads}, and "
                               f"heads of {where}kv_heads={self.kv_heads}")


@dataclass
class CptTrainConfig:
    """Continual pre-training of every method: one optimizer, linear decay after a warm-up ratio."""

    steps: int = opt(300, ge=1)
    batch: int = opt(16, ge=1)  # global batch in sequences (all processes and accumulation steps together)
    micro_batch: int = opt(0, ge=0)  # sequences per process per forward; 0 = batch / processes (no accumulation)
    seq_len: int = opt(128, ge=2)
    warmup_ratio: float = opt(0.06, ge=0.0, lt=1.0)
    schedule: str = opt("linear", choices=SCHEDULES)
    min_lr_ratio: float = opt(0.1, ge=0.0, le=1.0)  # cosine only
    weight_decay: float = opt(0.0, ge=0.0)
    beta1: float = opt(0.9, ge=0.0, lt=1.0)
    beta2: float = opt(0.999, ge=0.0, lt=1.0)
    eps: float = opt(1e-8, gt=0.0)
    clip: float = opt(1.0, ge=0.0)


@dataclass
class CptEvalConfig:
    every: int = opt(25, ge=0)  # steps between evaluations (step 0 and the last step always; 0 = only those)
    batch: int = opt(16, ge=1)  # sequences per evaluation forward
    rep_batch: int = opt(8, ge=1)  # sequences of the old-domain set whose final hidden states are compared (Fig. 4a)


# Paper Table 1: learning rates of continual pre-training on the Korean dataset.
PAPER_CPT_LR = {"fft": 1e-5, "lora": 1e-5, "freeze": 1e-5, "llama-pro": 2e-4,
                "scale-preserve": 1e-3, "scale-adapt": 1e-3, "scale-route": 1e-3}


@dataclass
class CptRunConfig:
    """Everything a CPT run depends on; the base cache and run names are hashes of parts of it."""

    base: str = "builtin"  # "builtin" pre-trains `model` on the stand-in's English (+5% Korean) corpus, cached; else hub id / dir
    tokenizer: str = ""  # "" = the base's own (builtin: a BPE trained on the stand-in)
    builtin: BuiltinCorpusConfig = opt(factory=BuiltinCorpusConfig)
    model: BaseShape = opt(factory=BaseShape)  # builtin base only
    pretrain: StageConfig = opt(factory=StageConfig)  # builtin base only
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
    seed: int = opt(0, ge=0)

    def method_options(self, name: str) -> dict[str, Any]:
        """Options of one method: methods.scale applies to every SCALE variant, methods.<name> on top."""
        opts = dict(self.methods.get("scale", {})) if name.startswith("scale-") else {}
        return opts | dict(self.methods.get(name, {}))

    def check(self, where: str = "") -> None:
        if not self.base.strip():
            raise ScaleclError(f"{where}base is empty: 'builtin', a hub id or a local directory")
        _check_method_table(self.lr, f"{where}lr", positive=True)
        _check_method_options(self.methods, f"{where}methods", self.method_options)


def _check_method_table(table: dict[str, float], where: str, positive: bool) -> None:
    """Keys of a per-method table (lr, lr_scale) must name methods; values must be positive numbers."""
    from .methods import method_names

    for k, v in table.items():
        if k not in method_names():
            raise ScaleclError(f"unknown method {where}.{k}; methods: {', '.join(method_names())}")
        if positive and not v > 0:
            raise ScaleclError(f"{where}.{k} must be > 0, got {v}")


def _check_method_options(methods: dict[str, dict], where: str, resolve) -> None:
    """Every methods.<name> table names a method (or 'scale'), its options get their declared types (in
    place), and every method's resolved options are valid."""
    from .methods import REGISTRY, get_method, method_names

    for k, v in methods.items():
        if k != "scale" and k not in method_names():
            raise ScaleclError(f"unknown method {where}.{k}; use 'scale' (all SCALE variants) or one of "
                               f"{', '.join(method_names())}")
        if not isinstance(v, dict):
            raise ScaleclError(f"{where}.{k} is a table of options, not a value")
        methods[k] = REGISTRY["scale-route" if k == "scale" else k].coerce_options(v, f"config key {where}.{k}")
    for name in method_names():
        if name in methods or (name.startswith("scale-") and "scale" in methods):
            get_method(name, **resolve(name))  # types and config-free ranges (sizes need the model: later)


PRESET_TYPES: dict[str, type] = {"bio": BioRunConfig, "cpt": CptRunConfig}


def _type_name(hint: Any) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, str(hint))


def coerce(value: Any, hint: Any, key: str) -> Any:
    """`value` as the declared type `hint`: command-line text (Raw) is parsed, typed TOML values are checked.

    key names the value in the error ("config key stage1.steps expects an integer, got 'x'").

    bool is never taken for an int (true is not 1 step), and None only where the type allows it.
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None or (isinstance(value, Raw) and value.strip().lower() in ("none", "null")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return coerce(value, inner[0], key)
        for a in inner:
            try:
                return coerce(value, a, key)
            except ScaleclError:
                pass
        raise ScaleclError(f"{key} expects {' or '.join(_type_name(a) for a in inner)}, got {value!r}")
    if origin is tuple:
        items = [v for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ScaleclError(f"{key} expects a list, got {value!r}")
        item_type = args[0] if args else Any
        return tuple(coerce(Raw(v.strip()) if isinstance(value, Raw) else v, item_type, key) for v in items)
    if hint is Any:
        return value  # typed later by its owner (method options: Method.coerce_options)
    text = value.strip() if isinstance(value, Raw) else None
    if hint is bool:
        if text is not None and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if isinstance(value, bool):
            return value
    elif hint is int:
        if text is not None:
            try:
                return int(text)
            except ValueError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if text is not None:
            try:
                v = float(text)
                if math.isfinite(v):
                    return v
            except ValueError:
                pass
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return str(value)
    else:
        raise TypeError(f"unsupported config type {hint!r} for {key}")
    raise ScaleclError(f"{key} expects {_type_name(hint)}, got {value!r}")


def _check_range(value: Any, meta: dict, key: str) -> None:
    if value is None:
        return
    if "choices" in meta and value not in meta["choices"]:
        raise ScaleclError(f"config key {key} must be one of {', '.join(map(str, meta['choices']))}, got {value!r}")
    for op, test, word in (("ge", lambda a, b: a >= b, ">="), ("gt", lambda a, b: a > b, ">"),
                           ("le", lambda a, b: a <= b, "<="), ("lt", lambda a, b: a < b, "<")):
        if op in meta and not test(value, meta[op]):
            raise ScaleclError(f"config key {key} must be {word} {meta[op]:g}, got {value!r}")


def _merge(obj: Any, updates: dict[str, Any], where: str) -> Any:
    """Apply a nested dict of overrides to a dataclass instance: unknown keys, wrong types and bad ranges raise."""
    hints = typing.get_type_hints(type(obj))
    names = {f.name: f for f in fields(obj)}
    for k, v in updates.items():
        if k not in names:
            raise ScaleclError(f"unknown config key {where}{k}; known: {', '.join(names)}")
        cur, hint = getattr(obj, k), hints[k]
        if is_dataclass(cur):
            if not isinstance(v, dict):
                raise ScaleclError(f"config key {where}{k} is a section, not a value")
            _merge(cur, v, f"{where}{k}.")
        elif typing.get_origin(hint) is dict:
            if not isinstance(v, dict):
                raise ScaleclError(f"config key {where}{k} is a table, not a value")
            setattr(obj, k, _update_table(cur, v, typing.get_args(hint)[1], f"{where}{k}."))
        else:
            value = coerce(v, hint, f"config key {where}{k}")
            _check_range(value, names[k].metadata, f"{where}{k}")
            setattr(obj, k, value)
    return obj


def _update_table(cur: dict, updates: dict, value_hint: Any, where: str) -> dict:
    """A per-name table (lr.<method>, methods.<method>.<option>): values typed by the table's value type."""
    out = dict(cur)
    for k, v in updates.items():
        if typing.get_origin(value_hint) is dict:
            if not isinstance(v, dict):
                raise ScaleclError(f"config key {where}{k} is a table, not a value")
            out[k] = _update_table(out.get(k, {}), v, typing.get_args(value_hint)[1], f"{where}{k}.")
        else:
            out[k] = coerce(v, value_hint, f"config key {where}{k}")
    return out


def check_config(obj: Any, where: str = "") -> None:
    """Ranges of every field (presets included) and each section's own cross-field check()."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if is_dataclass(value):
            check_config(value, f"{where}{f.name}.")
        else:
            _check_range(value, f.metadata, f"{where}{f.name}")
    if hasattr(obj, "check"):
        obj.check(where)


def parse_scalar(text: str) -> Any:
    """A command-line value: none/null -> None, true/false -> bool, then int, float, else the string."""
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text.strip()


def parse_value(text: str) -> Any:
    """A --set value of untyped options: a scalar, or a comma list of scalars."""
    if "," in text:
        return [parse_scalar(t) for t in text.split(",") if t]
    return parse_scalar(text)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """["stage1.steps=100", "methods.scale.hidden_up=64"] -> nested dict of Raw texts (typed when merged)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ScaleclError(f"--set expects key=value, got {item!r}")
        node = out
        *parents, leaf = [p.strip() for p in key.strip().split(".")]
        if not all(parents) or not leaf:
            raise ScaleclError(f"--set key {key!r} has an empty part")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ScaleclError(f"--set {item!r}: {p} was given a value before")
        node[leaf] = Raw(val.strip())
    return out


def load_preset(kind: str, name: str, sets: list[str] | None = None, config_type: type | None = None) -> Any:
    """Resolve a preset file (scalecl/presets/<kind>_<name>.toml) plus --set overrides into a checked config.

    config_type is the dataclass the file overrides; by default the one registered for `kind`
    (PRESET_TYPES: "bio" -> BioRunConfig, "cpt" -> CptRunConfig).
    """
    if config_type is None:
        if kind not in PRESET_TYPES:
            raise ScaleclError(f"unknown preset kind {kind!r}; choose one of {', '.join(PRESET_TYPES)}")
        config_type = PRESET_TYPES[kind]
    import tomllib
    from importlib import resources

    path = resources.files("scalecl.presets") / f"{kind}_{name}.toml"
    if not path.is_file():
        avail = sorted(p.name.removeprefix(f"{kind}_").removesuffix(".toml")
                       for p in resources.files("scalecl.presets").iterdir() if p.name.startswith(f"{kind}_"))
        raise ScaleclError(f"unknown preset {name!r}; choose one of {', '.join(avail)}")
    cfg = _merge(config_type(), tomllib.loads(path.read_text()), "")
    cfg = _merge(cfg, parse_sets(sets or []), "")
    check_config(cfg)
    return cfg
