"""Trainable-parameter budgets of every method at the paper's settings, counted on meta-device models.

Meta tensors carry shapes only, so the 1B model is "built" in milliseconds and without memory; methods are
applied with init_weights=False (SCALE's SVD initialisation cannot run on meta tensors).

It sits above the methods and the experiment configs (it reads the bio paper preset), not in methods/.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import torch
from transformers import AutoModelForCausalLM, GPTNeoXConfig, LlamaConfig, PretrainedConfig

from scalecl.common.environment import env
from scalecl.compute.machine import MEMORY_MARGIN, available_memory
from scalecl.experiments import load_preset
from scalecl.methods import REGISTRY, count_parameters, get_method
from scalecl.models.build import shape_config


def pythia_160m_config() -> GPTNeoXConfig:
    """EleutherAI/pythia-160m (spec/evaluation.md), without downloading it."""
    return GPTNeoXConfig(
        vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        rotary_pct=0.25, rotary_emb_base=10000, max_position_embeddings=2048, use_parallel_residual=True,
        tie_word_embeddings=False,
    )


def llama_32_1b_config() -> LlamaConfig:
    """meta-llama/Llama-3.2-1B (spec/evaluation.md), without downloading it."""
    return LlamaConfig(
        vocab_size=128256, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        head_dim=64, intermediate_size=8192, tie_word_embeddings=True, rope_theta=5e5,
        max_position_embeddings=131072, rms_norm_eps=1e-5,
    )


def biography_paper_config() -> GPTNeoXConfig:
    """The `bio` paper preset's model as it runs: Pythia-160M's shape with the rows its vocabulary has in force
    (model.vocab = 50,304: the Pythia tokenizer, padded as Pythia pads it). The embedding and head columns that
    SCALE adds scale with those rows, so a budget counted with another vocabulary would not be this run's."""
    rc = load_preset("bio", "paper")
    if not rc.model.vocab:
        raise ValueError("the bio paper preset must fix model.vocab for its budget to be known without a tokenizer")
    return shape_config(rc.model, rc.model.vocab)


def _biography_methods() -> list[tuple[str, dict[str, Any]]]:
    """The methods the paper ran on the biography task, with the bio paper preset's options."""
    rc = load_preset("bio", "paper")
    return [("fft", {})] + [(m, rc.method_options(m)) for m in ("llama-pro", "scale-preserve", "scale-adapt",
                                                                "scale-route")]


class BudgetRow(NamedTuple):
    setting: str
    method: str
    trainable: int
    total: int
    options: dict[str, Any]
    vocab: int = 0  # rows of the embedding and head in force


def trainable_counts(config: PretrainedConfig, method_name: str, **opts: Any) -> tuple[int, int]:
    """(trainable, total) parameters of `method_name` with `opts` applied to a model of `config`."""
    method = get_method(method_name, **opts)
    method.check(config)
    config = copy.deepcopy(config)  # structural methods edit the config in place
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model = method.apply(model, init_weights=False)
    return count_parameters(model, trainable_only=True), count_parameters(model)


# The paper's two settings (Sec. 5; spec/method.md sections 3-4). SCALE's collab is left at its default. The
# biography setting is read from the bio paper preset (its vocabulary and options are the ones that run).
PAPER_SETTINGS: dict[str, tuple[Any, Any]] = {
    "biography / Pythia-160M": (biography_paper_config, _biography_methods),
    "Korean CPT / Llama-3.2-1B": (llama_32_1b_config, lambda: [
        ("fft", {}),
        ("lora", {"rank": 256}),
        ("freeze", {"k": 3}),
        ("llama-pro", {"n": 4}),  # 16 -> 20 layers
        ("scale-preserve", {"hidden_up": 256, "ffn_up": 1024}),
        ("scale-adapt", {"hidden_up": 256, "ffn_up": 1024, "l_fp": 3}),
        ("scale-route", {"hidden_up": 256, "ffn_up": 1024, "l_fp": 3}),
    ]),
}


def paper_budgets() -> list[BudgetRow]:
    """One row per (setting, method) so a reader can check that the budgets are comparable."""
    rows = []
    for setting, (make_config, methods) in PAPER_SETTINGS.items():
        config = make_config()
        for name, opts in methods():
            trainable, total = trainable_counts(config, name, **opts)
            rows.append(BudgetRow(setting, name, trainable, total, opts, config.vocab_size))
    return rows


# ---------------------------------------------------------------------------------------------------------
# The supported decoder families: one published model of each, its widening constraints, and the
# trainable parameters of every method in a setting like the paper's Korean CPT one (Llama-3.2-1B: SCALE
# +256 hidden (d/8) / +1024 FFN (ffn/8), l_fp = 3; LoRA r = 256; Freeze k = 3; LLaMA Pro +L/4 blocks).


def _published(cls_name: str, **sizes: Any) -> PretrainedConfig:
    import transformers

    return getattr(transformers, cls_name)(**sizes)


# model -> its config, written from the published config.json (sizes, tying, biases; what the counts depend on)
FAMILY_MODELS: dict[str, Any] = {
    "meta-llama/Llama-3.2-1B": llama_32_1b_config,
    "mistralai/Mistral-7B-v0.1": lambda: _published(
        "MistralConfig", vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False, sliding_window=4096,
        max_position_embeddings=32768, rms_norm_eps=1e-5),
    "Qwen/Qwen2.5-0.5B": lambda: _published(
        "Qwen2Config", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=32768,
        rms_norm_eps=1e-6),
    "Qwen/Qwen3-0.6B": lambda: _published(
        "Qwen3Config", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
        max_position_embeddings=40960, rms_norm_eps=1e-6),
    "microsoft/Phi-3-mini-4k-instruct": lambda: _published(
        "Phi3Config", vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, tie_word_embeddings=False, max_position_embeddings=4096,
        sliding_window=2047, pad_token_id=32000, bos_token_id=1, eos_token_id=32000, rms_norm_eps=1e-5),
    "allenai/OLMo-2-0425-1B": lambda: _published(
        "Olmo2Config", vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False, max_position_embeddings=4096,
        pad_token_id=100277, bos_token_id=None, eos_token_id=100257, rms_norm_eps=1e-6),
    "google/gemma-2-2b": lambda: _published(
        "Gemma2Config", vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, sliding_window=4096,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, tie_word_embeddings=True, rms_norm_eps=1e-6),
    "google/gemma-3-1b-pt": lambda: _published(
        "Gemma3TextConfig", vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
        tie_word_embeddings=True, max_position_embeddings=32768, rms_norm_eps=1e-6),
}

# what sets a family apart for widening (derived from the config and modules; stated here for the table)
FAMILY_NOTES = {
    "llama": "RMSNorm, SwiGLU",
    "mistral": "sliding window: unchanged",
    "qwen2": "q/k/v biases: new rows get their own",
    "qwen3": "per-head q/k norm: new heads get their own gain",
    "phi3": "fused qkv and gate_up: each block grows at its own end",
    "olmo2": "post-norms; q/k norm over all heads split at the base width",
    "gemma2": "embedding x sqrt(d) of the base kept; (1+w) norms; pre+post norms; soft-caps (Route compares raw "
              "logits, the cap follows)",
    "gemma3_text": "as Gemma 2, plus per-head q/k norm; sliding layers unchanged",
}


class FamilyRow(NamedTuple):
    """One family's published model: its widening constraints and the paper-like budgets of every method."""

    family: str  # model_type
    model: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    unit: int  # hidden_up must be a multiple of this: head_dim x GQA group (whole groups of new heads)
    hidden_up: int  # the paper-like hidden_up: the smallest legal one >= hidden / 8
    note: str
    budgets: list[BudgetRow]


def smallest_hidden_up(config: PretrainedConfig, at_least: int, ffn_up: int) -> int:
    """The smallest multiple of head_dim x GQA group that is >= at_least and gives a config transformers builds."""
    from scalecl.methods.scale.upscale import widened_config_refusal
    from scalecl.models.build import head_dim, kv_heads

    unit = head_dim(config) * (config.num_attention_heads // kv_heads(config))
    k = max(1, -(-at_least // unit))
    while widened_config_refusal(config, k * unit, ffn_up) is not None:
        k += 1
    return k * unit


def paper_like_methods(config: PretrainedConfig) -> list[tuple[str, dict[str, Any]]]:
    """The Korean CPT setting's methods scaled to a model: SCALE +d/8 hidden (rounded up to a legal width) and
    +ffn/8, l_fp = 3; LoRA r = 256 (or the smallest targeted side, if smaller); Freeze k = 3; LLaMA Pro's n the
    divisor of L nearest L/4."""
    from scalecl.models.build import head_dim, kv_heads

    layers, ffn_up = config.num_hidden_layers, config.intermediate_size // 8
    scale = {"hidden_up": smallest_hidden_up(config, config.hidden_size // 8, ffn_up), "ffn_up": ffn_up}
    rank = min(256, config.hidden_size, config.intermediate_size, kv_heads(config) * head_dim(config))
    n = min((k for k in range(1, layers + 1) if layers % k == 0), key=lambda k: (abs(k - layers / 4), k))
    return [("fft", {}), ("lora", {"rank": rank}), ("freeze", {"k": 3}), ("llama-pro", {"n": n}),
            ("scale-preserve", scale), ("scale-adapt", {**scale, "l_fp": 3}), ("scale-route", {**scale, "l_fp": 3})]


def family_budgets() -> list[FamilyRow]:
    """One row per supported family (meta device: no weights, no download)."""
    from scalecl.models.build import head_dim, kv_heads

    rows = []
    for model, make in FAMILY_MODELS.items():
        config = make()
        budgets = []
        for name, opts in paper_like_methods(config):
            trainable, total = trainable_counts(config, name, **opts)
            budgets.append(BudgetRow(model, name, trainable, total, opts, config.vocab_size))
        hd, kv = head_dim(config), kv_heads(config)
        up = next(o["hidden_up"] for _, o in paper_like_methods(config) if "hidden_up" in o)  # SCALE's widening
        rows.append(FamilyRow(config.model_type, model, config.hidden_size, config.num_attention_heads, kv, hd,
                              hd * (config.num_attention_heads // kv), up, FAMILY_NOTES[config.model_type], budgets))
    return rows


# ---------------------------------------------------------------------------------------------------------
# Memory and time before work (docs/runs.md, "Memory and time before work"): every train-bio / train-cpt sweep
# estimates the peak memory and the time of what it will train, prints it as one line and refuses, with one
# line naming the `--set` keys that shrink it, a run that cannot fit in the memory available.

GIB = 2**30
FLOAT = 4  # bytes: parameters, gradients, AdamW's two moments, activations and logits are float32
# a biography QA sequence (prompt + answer + EOS) before the data tell: the committed cpu runs' stage 3 had about
# 16 tokens per pair (train_log tokens / batch); a BPE tokenizer makes more
QA_TOKENS = 32
# assumed share of a 1024^3 float32 matmul's speed that training reaches: the committed cpu runs trained at
# 41 GFLOP/s of model FLOPs on one thread, where that matmul measured 28-103 GFLOP/s (depending on the load)
CPU_EFFICIENCY = 0.5
GPU_MFU = 0.3  # assumed fraction of the GPU's dense peak


# `eval-ppl`'s forward without gradients, measured (ru_maxrss less the resident set before it, tiny Llama and
# GPT-NeoX models of d = 256-512, ffn = 4d, 8 x 512-2,048 tokens): 15-21 d floats per token for all its layers
# together (a layer's tensors are freed before the next one runs), counted here as 4 d + 4 ffn (gated MLP) or
# 4 d + 3 ffn; a block of logits: the head's product, the cross-entropy's log-softmax and its input's copy, 3 in
# all (the whole-logits path measured 3.1 copies of 500 MiB)
SCORE_WIDTHS, SCORE_FFNS, SCORE_LOGIT_COPIES = 4, 3, 3


# On CUDA under bf16 autocast (issue 43: one H200, torch 2.11, Pythia-160M's shape through the training loop, peak
# allocated after 20 steps: stage 1 of the `gpu` biography preset, 96 x 512 tokens, 44.3 GiB with 50,304 head rows
# and 19.5 GiB with 512; its QA step, 48 x 32 tokens, 4.1 GiB), what the CPU's float32 accounting becomes:
# - activations are bf16 products' outputs: the same floats per token as on a CPU, at 2 bytes (the 512-row stage 1:
#   17.7 GiB of its 19.5);
# - the model's own loss holds, per logit, the head's bf16 output, its float32 copy and the float32 log-softmax
#   the backward reads: 10 bytes (23.0 of the 24.8 GiB that 49,792 more rows added);
# - autocast keeps a bf16 copy of every weight that enters a product for the forward (2 bytes per parameter);
# - an evaluation forward holds the bf16 logits and their float32 copy (scalecl.evaluation.qa reads floats).
# The chunked loss (compute.loss, scalecl.compute.loss) holds no whole logits: see Phase._loss_bytes.
HALF = 2
HALF_LOGIT_BYTES = 2 + 4 + 4
HALF_EVAL_LOGIT_BYTES = 2 + 4
# the model's own loss with the whole model compiled (inductor fuses the float32 copies): the bf16 logits kept for
# the backward and one float32 tensor of their size; calibrated on one H200 (torch 2.11): stage 1 of the `gpu`
# preset peaked at 32.2 GiB compiled, 46.0 GiB eager
HALF_COMPILED_LOGIT_BYTES = 2 + 4


def train_logit_copies() -> int:
    """float32 copies of a training forward's logits the process holds at its peak: 4 alive at once (measured:
    4.1 after one step). With the allocator the `scalecl` command tunes (scalecl.compute.machine.tune_cpu_allocator: freed
    memory stays in the process) 6, as measured after the second step of a 50,304-row head (2.34 GiB over
    0.38 GiB copies), where a step's buffers no longer fit the holes the last one left."""
    from scalecl.compute.machine import allocator_tuned

    return 6 if allocator_tuned() else 4


class Phase(NamedTuple):
    """One phase of a run as memory sees it: a model (its parameter counts and widths) and one forward's rows."""

    name: str
    params: int
    trainable: int
    layers: int
    width: int  # hidden size in force (SCALE: d + hidden_up)
    ffn: int
    vocab: int
    rows: int  # sequences per forward
    seq: int
    train: bool  # backward and optimizer step (else a forward without gradients, beside the optimizer state)
    paths: int = 1  # SCALE-Route computes two paths per token
    tokens: int = 0  # tokens the phase processes in all (time)
    keys: tuple[str, ...] = ()  # the --set keys that shrink it
    glu: bool = False  # a gated MLP (Llama's SwiGLU) keeps three FFN-wide tensors per token, GPT-NeoX's two
    # `eval-ppl`: the positions of one head product when the loss runs by blocks of positions (scalecl.evaluation.
    # perplexity); 0: another phase. Such a phase has no optimizer and holds what SCORE_* say.
    scoring: int = 0
    plain_head: bool = True  # the head is a plain linear layer (not SCALE's): the chunked loss can apply
    half: bool = False  # on CUDA under bf16 autocast (on_device): activations and logits as measured there
    loss: str = "model"  # the training step's loss: "model" (the model's own, whole logits) or "chunked"
    steps: int = 0  # training steps (compute.compile=auto compiles long phases; 0: not known)
    compiled: bool = False  # the whole model compiled (on_device): inductor fuses the model loss's float32 copies

    def parts(self) -> dict[str, int]:
        """Bytes of weights, gradients, AdamW state, activations and logits at the phase's peak."""
        tokens = self.rows * self.seq
        if self.scoring:  # a forward without gradients, then the head and the loss by blocks of positions
            per_token = SCORE_WIDTHS * self.width + (SCORE_FFNS + self.glu) * self.ffn
            return {"weights": self.params * FLOAT, "activations": tokens * per_token * FLOAT * self.paths,
                    "logits": self.rows * min(self.scoring, self.seq) * self.vocab * FLOAT * SCORE_LOGIT_COPIES}
        # floats a decoder layer keeps per token for the backward (inputs of its norms, projections, attention
        # and MLP; SDPA keeps no T x T matrix), measured with d=256, ffn=4d, 32 x 256 tokens: GPT-NeoX 20.9 d
        # (13 d + 2 ffn = 21 d), Llama 31.8 d (16 d + 4 ffn = 32 d). A forward without gradients keeps ~2 layers.
        act_layers = self.layers if self.train else 2
        per_token = 16 * self.width + 4 * self.ffn if self.glu else 13 * self.width + 2 * self.ffn
        act = tokens * act_layers * per_token * (HALF if self.half else FLOAT) * self.paths
        parts = {"weights": self.params * FLOAT, "grads": self.trainable * FLOAT * self.train,
                 "adamw": self.trainable * 2 * FLOAT, "activations": act, "logits": self._loss_bytes(tokens)}
        if self.half:  # autocast's bf16 copies of the weights that enter products (all but the embedding lookup)
            parts["autocast"] = (self.params - self.vocab * self.width) * HALF
        return parts

    def _loss_bytes(self, tokens: int) -> int:
        """Bytes of logits and loss at the peak. Float32 (CPU): training holds the logits, their log-softmax, its
        gradient and the logits' gradient at once (B x T x V each; train_logit_copies), evaluation the logits.
        bf16 autocast on CUDA: HALF_LOGIT_BYTES per logit (evaluation HALF_EVAL_LOGIT_BYTES). The chunked loss
        (scalecl.compute.loss): one chunk's logits (float32, and its gradient at the product's width), the head's
        weight at that width, its float32 gradient and the product that adds to it, and the selected hidden
        states with their gradient."""
        rows = tokens * self.vocab
        if not self.train:
            return rows * (HALF_EVAL_LOGIT_BYTES if self.half else FLOAT)
        if self.loss != "chunked":
            if self.half:
                return rows * (HALF_COMPILED_LOGIT_BYTES if self.compiled else HALF_LOGIT_BYTES)
            return rows * FLOAT * train_logit_copies()
        from scalecl.compute.loss import chunk_positions

        width = HALF if self.half else FLOAT
        chunk = min(chunk_positions(self.vocab), tokens)
        head = self.vocab * self.width
        return chunk * self.vocab * (FLOAT + width) + head * (FLOAT + 2 * width + FLOAT) + tokens * self.width * 2 * FLOAT

    def bytes(self) -> int:
        return sum(self.parts().values())

    def flops(self) -> float:
        return (6.0 if self.train else 2.0) * (self.params - self.vocab * self.width) * self.tokens


class Estimate(NamedTuple):
    peak: int  # bytes, the process (or the processes of one machine) at its largest phase
    baseline: int  # bytes the process holds already (interpreter, torch, the prepared data)
    phase: Phase
    available: int | None
    seconds: float | None
    rate: str  # where the time comes from
    world: int = 1


def _model_numbers(config: PretrainedConfig, method: str | None, opts: dict[str, Any]) -> tuple[int, int]:
    """(total, trainable) parameters of `config` with `method` applied (None: every weight trains)."""
    if method is None:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(copy.deepcopy(config))
        n = count_parameters(model)
        return n, n
    trainable, total = trainable_counts(config, method, **opts)
    return total, trainable


def _widths(cfg: PretrainedConfig, method: str | None, opts: dict[str, Any]) -> tuple[int, int, int, int]:
    """(layers, width, ffn, paths) of a model after `method` (Method.shape: SCALE widens, LLaMA Pro deepens,
    Route takes two paths)."""
    layers, width, ffn = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size
    return (layers, width, ffn, 1) if method is None else get_method(method, **opts).shape(layers, width, ffn)


def phase(name: str, cfg: PretrainedConfig, method: str | None, opts: dict[str, Any], shape: tuple[int, int],
          tokens: int, keys: tuple[str, ...], train: bool = True) -> Phase:
    """One phase of a sweep: a model (`cfg` widened by `method` with `opts`), its forward's (rows, sequence
    length), the tokens it processes in all, and the `--set` keys that shrink it (a training phase's steps:
    `._replace(steps=...)`)."""
    rows, seq = shape
    total, trainable = _model_numbers(cfg, method, opts)
    layers, width, ffn, paths = _widths(cfg, method, opts)
    return Phase(name, total, trainable if train or method else 0, layers, width, ffn, cfg.vocab_size, rows, seq,
                 train, paths, tokens, keys, glu=gated_mlp(cfg),
                 plain_head=method is None or REGISTRY[method].plain_head)


def gated_mlp(cfg: PretrainedConfig) -> bool:
    """Whether the family's MLP is gated (a gate projection beside the up projection: Llama's SwiGLU, Gemma's
    GeGLU, Phi-3's fused gate_up), from the architecture table; else the activation (silu: gated, as before)."""
    from scalecl.models.build import ARCHS

    arch = ARCHS.get(getattr(cfg, "model_type", None))
    if arch is not None:
        return any(name.endswith(("gate_proj", "gate_up_proj")) for name in arch.linears)
    return getattr(cfg, "hidden_act", "") == "silu"


def process_memory() -> int:
    """Bytes this process holds now (its resident set): the interpreter, torch and what is loaded."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except (ImportError, OSError):
        return 0


def cpu_matmul_rate() -> float:
    """float32 FLOP/s of a 1024^3 matrix product at torch's thread count, measured now (~0.1 s)."""
    import time

    a = torch.randn(1024, 1024)
    b = torch.randn(1024, 1024)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * 1024**3 / best


def on_device(phases: list[Phase], device: torch.device, autocast: Any = None, loss: str = "auto",
              compile: bool | str = "off") -> list[Phase]:
    """The phases as `device` runs them: on CUDA, under bf16 (or fp16) autocast, activations and logits at the
    widths measured there (HALF_*), each training phase compiled as compute.compile `compile` decides for its
    steps, and its loss as compute.loss `loss` resolves for the device and that (scalecl.compute.loss) where the
    head allows it. Pure arithmetic: no GPU is needed to evaluate it. Elsewhere the phases as they are (CPU
    estimates: float32, the model's own loss)."""
    if device.type != "cuda":
        return phases
    from scalecl.compute.loss import resolve_loss
    from scalecl.compute.perf import compile_mode

    half = autocast in (torch.bfloat16, torch.float16)
    out = []
    for p in phases:
        trains = p.train and not p.scoring
        whole = trains and compile_mode(compile, device, p.steps or None) in ("model", "graphs")
        fused = resolve_loss(loss, device, whole) != "model"  # chunked, or Liger's / CCE's, which hold less
        out.append(p._replace(half=half, compiled=whole, loss="chunked" if fused and p.plain_head and trains
                              else "model"))
    return out


def estimate(phases: list[Phase], device: torch.device, world: int = 1, autocast: Any = None,
             rate: float | None = None, loss: str = "auto", compile: bool | str = "off") -> Estimate:
    """Peak memory (the largest phase plus what the process holds now: interpreter, torch, the prepared data)
    and time of a sweep; `loss` and `compile` are compute.loss and compute.compile (on CUDA the chunked loss and
    a compiled model's own loss hold less: on_device)."""
    phases = on_device(phases, device, autocast, loss, compile)
    peak_phase = max(phases, key=Phase.bytes)
    flops = sum(p.flops() for p in phases)
    if device.type == "cuda":
        from scalecl.compute.perf import peak_tflops

        peak = peak_tflops(device, autocast).get("tflops")
        seconds = flops / (peak * 1e12 * GPU_MFU) if peak else None
        how = f"{GPU_MFU:.0%} of the GPU's peak" if peak else "no known peak"
        free = int(torch.cuda.mem_get_info(device)[0])
        return Estimate(peak_phase.bytes(), 0, peak_phase, free, seconds, how, world)
    rate = rate if rate is not None else cpu_matmul_rate()
    seconds = flops / (rate * CPU_EFFICIENCY * world)
    how = f"{CPU_EFFICIENCY:.0%} of a measured {rate / 1e9:.0f} GFLOP/s matmul"
    base = process_memory()
    return Estimate(world * (base + peak_phase.bytes()), world * base, peak_phase, available_memory(), seconds,
                    how, world)


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.0f} MiB"


def _duration(s: float) -> str:
    if s >= 2 * 86400:
        return f"{s / 86400:,.0f} days"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def describe(e: Estimate) -> str:
    """The estimate as one line."""
    parts = ", ".join(f"{k} {_size(v)}" for k, v in e.phase.parts().items() if v)
    where = "GPU memory" if e.baseline == 0 else "memory" + (f" ({e.world} processes)" if e.world > 1 else "")
    avail = f" of {_size(e.available)} available" if e.available is not None else ""
    time_part = (f"; time ~{_duration(e.seconds)} (rough: FLOPs / {e.rate})" if e.seconds is not None
                 else "; time unknown")
    base = f"; + {_size(e.baseline)} the process holds with its data" if e.baseline else ""
    return (f"estimate: peak {where} ~{_size(e.peak)}{avail} in {e.phase.name} ({e.phase.rows} x {e.phase.seq} "
            f"tokens, {e.phase.vocab:,} head rows: {parts}{base}){time_part}")


def check_fits(e: Estimate) -> None:
    """One ScaleclError when the estimated peak, plus the estimate's margin (MEMORY_MARGIN), passes the memory
    available, naming the keys that shrink it."""
    from scalecl.common.errors import ScaleclError

    if e.available is None or e.peak * MEMORY_MARGIN <= e.available or not env("SCALECL_MEMORY_CHECK"):
        return
    micro = next((k for k in e.phase.keys if k.endswith("micro_batch")), None)
    note = f" ({micro} below the batch keeps the batch: it accumulates)" if micro else ""
    options = all(k.startswith("--") for k in e.phase.keys)  # a command's options (eval-ppl), not --set keys
    raise ScaleclError(f"this run needs about {_size(e.peak)} of {'GPU ' if e.baseline == 0 else ''}memory at its "
                       f"peak ({e.phase.name}: {e.phase.rows} x {e.phase.seq} tokens, logits "
                       f"{_size(e.phase.parts()['logits'])}; with the estimate's {round(100 * (MEMORY_MARGIN - 1))}% "
                       f"margin "
                       f"{_size(e.peak * MEMORY_MARGIN)}), more than the {_size(e.available)} available; shrink "
                       f"it with {'' if options else '--set '}{', '.join(e.phase.keys)}{note}, or set "
                       f"SCALECL_MEMORY_CHECK=0 to try anyway")


def sweep_estimate(exp: Any, methods: list[str], device: torch.device, world: int) -> Estimate:
    """The estimate of an experiment of the sweep (scalecl.experiments.sweep) for the methods it will train: its phases
    (`exp.budget_phases`, each experiment's own list) on this device."""
    from scalecl.compute.perf import autocast_dtype

    cc = exp.rc.compute
    return estimate(exp.budget_phases(methods, world), device, world, autocast_dtype(exp.rc.dtype, device, cc.cpu_bf16),
                    loss=cc.loss, compile=cc.compile)
