"""Speed of a training step: TF32, activation checkpointing, torch.compile, and what the step achieves (MFU).

**Model FLOPs and MFU.** A run reports model FLOPs utilisation the usual way (PaLM, Chowdhery et al. 2022,
Appendix B; nanoGPT's `estimate_mfu`):

    model FLOPs per token = 6 N + 12 L H Q T

- N: parameters that take part in a matrix product per token: every parameter except the input-embedding
  table (a lookup), plus the output head's matrix when it is tied to that table. Frozen parameters count
  like trainable ones, and SCALE's widened matrices count whole ([[W, W12], [W21, W22]], zero W12 included).
- 6 N: 2 N for the forward, 4 N for the backward (the input gradient and the weight gradient).
- 12 L H Q T: attention scores and weighted values (L layers, H heads of width Q, T tokens of context),
  forward and backward, without halving for the causal mask.

This is a convention, not the arithmetic the step actually does. With frozen weights the backward skips
their weight gradients (and SCALE's block-wise backward skips more). Route runs its forked layers twice;
that work is not counted. So MFU compares methods of one shape by the useful work each delivers per second.
It counts the tokens the model reads, padding excluded. MFU = model FLOPs per second / the device's dense
peak at the step's precision (PEAK_TFLOPS; bf16 under bf16 autocast, TF32 for float32 products when
TF32 is on, else fp32). For a device missing from the table MFU is null, unless SCALECL_PEAK_TFLOPS
gives the peak.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from scalecl.common.environment import env
from scalecl.common.errors import ScaleclError

# Dense (no structured sparsity) peak TFLOP/s from NVIDIA's datasheets (their sparsity figures halved).
# H200 SXM has the H100 SXM's compute; "NVL" are the PCIe-card variants of the same chips.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 SXM": {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.5, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"bf16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "H200": {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H200 NVL": {"bf16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "A100": {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5},  # SXM and PCIe, 40 and 80 GB alike
}
AUTO_SYNC_CUDA = 50  # compute.sync_every = 0 on CUDA: read loss and gradient norm every 50 steps


def device_kind(name: str | None) -> str | None:
    """The PEAK_TFLOPS row of a CUDA device name ('NVIDIA H100 80GB HBM3' -> 'H100 SXM'), or None."""
    if not name:
        return None
    n = name.upper()
    for chip in ("H200", "H100"):
        if chip in n:
            if "NVL" in n:
                return f"{chip} NVL"
            if chip == "H100" and "PCIE" in n:
                return "H100 PCIe"
            return "H100 SXM" if chip == "H100" else "H200"
    return "A100" if "A100" in n else None


def precision(device: torch.device, autocast: torch.dtype | None) -> str:
    """The precision of the step's matrix products: bf16 (autocast), tf32 or fp32."""
    if autocast == torch.bfloat16:
        return "bf16"
    if device.type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "fp32"


def peak_tflops(device: torch.device, autocast: torch.dtype | None) -> dict[str, Any]:
    """The dense peak this step is measured against: {"tflops", "device", "precision", "source"}; tflops None
    when unknown (CPU, an unlisted GPU) and SCALECL_PEAK_TFLOPS is not set."""
    prec = precision(device, autocast)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    value = env("SCALECL_PEAK_TFLOPS")  # finite, > 0 (scalecl.common.environment)
    if value is not None:
        return {"tflops": value, "device": name or device.type, "precision": prec, "source": "SCALECL_PEAK_TFLOPS"}
    kind = device_kind(name)
    value = PEAK_TFLOPS[kind][prec] if kind else None
    return {"tflops": value, "device": name or device.type, "precision": prec,
            "source": f"datasheet {kind} {prec} dense" if kind else None}


@dataclass(frozen=True)
class ModelFlops:
    """Model FLOPs of one token's forward and backward: 6 N + 12 L H Q T (module docstring)."""

    matmul_params: int  # N
    layers: int  # L
    attn_width: int  # H * Q

    def per_token(self, seq_len: int) -> float:
        return 6.0 * self.matmul_params + 12.0 * self.layers * self.attn_width * seq_len

    def to_dict(self) -> dict[str, int]:
        return {"matmul_params": self.matmul_params, "layers": self.layers, "attn_width": self.attn_width}


def model_flops(model: nn.Module) -> ModelFlops:
    """N, L and H*Q of a causal LM (plain, LoRA through peft, LLaMA Pro, SCALE; sharded or not)."""
    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    emb_ids = {id(p) for p in emb.parameters()}
    seen: set[int] = set()
    n = 0
    for p in model.parameters():
        if id(p) not in seen and id(p) not in emb_ids:
            n += p.numel()  # a DTensor reports its global size
        seen.add(id(p))
    if head is not None:
        n += sum(p.numel() for p in head.parameters() if id(p) in emb_ids)  # a head tied to the embedding
    cfg = model.config
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ModelFlops(int(n), int(cfg.num_hidden_layers), int(cfg.num_attention_heads * hd))


# ---------------------------------------------------------------------------------------------------------
# options of compute: checked before any work, applied to the model before training


def check_compute(cc, device: torch.device, world: int) -> None:
    """User errors in `compute.*` (and SCALECL_SCALE_PRODUCTS) as one line, before anything is built."""
    import torch.distributed as dist

    if cc.parallel == "fsdp" and world > 1:
        if not dist.is_available():
            raise ScaleclError("compute.parallel=fsdp needs torch.distributed, which this torch build lacks")
        try:
            from torch.distributed.fsdp import fully_shard  # noqa: F401
        except ImportError:
            raise ScaleclError(f"compute.parallel=fsdp needs PyTorch FSDP2 (torch.distributed.fsdp.fully_shard, "
                               f"torch >= 2.6); this is torch {torch.__version__}") from None
    if compile_mode(cc.compile, device) == "graphs" and device.type != "cuda":
        raise ScaleclError(f"compute.compile=graphs replays CUDA graphs: it needs a CUDA device, not {device.type}; "
                           f"use compute.compile=model")
    if compile_mode(cc.compile, device) != "off":
        if device.type not in ("cpu", "cuda"):
            raise ScaleclError(f"compute.compile is supported on cpu and cuda, not {device.type}")
        if device.type == "cpu" and not any(shutil.which(c) for c in (os.environ.get("CXX") or "g++", "c++",
                                                                         "clang++")):
            raise ScaleclError("compute.compile on CPU needs a C++ compiler (g++ or clang++) for inductor's "
                               "kernels; install one or leave compute.compile off")
    env("SCALECL_SCALE_PRODUCTS")  # blocks or concat, else one error (the command checked it at its start)


def configure_device(device: torch.device, tf32: bool) -> None:
    """Process-wide settings of a CUDA run: TF32 for float32 matrix products (compute.tf32)."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high" if tf32 else "highest")


def sync_every(cc, device: torch.device) -> int:
    """compute.sync_every, with 0 resolved per device (the GPU runs ahead of the host between reads)."""
    return cc.sync_every or (AUTO_SYNC_CUDA if device.type == "cuda" else 1)


def hf_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute every decoder block in the backward (transformers' own, non-reentrant, so frozen inputs and
    Route's fork hook, which runs outside the recomputed forward, need nothing special)."""
    base = hf_model(model)
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.x
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    base.config.use_cache = False


# compute.compile=auto compiles a run of at least SCALECL_COMPILE_MIN_STEPS steps (default 2,000). Compiling a model
# costs tens of seconds (not yet measured here: benchmarks/bench_gpu.py records each configuration's warm-up); on an
# H200 the whole model compiled saved 18 ms per QA step (40 -> 22 ms) and 54 per stage-1 step (161 -> 107 ms): a
# few thousand steps repay it. gpu_check.sh lowers it for its scaled biography run, whose stages stand for longer ones


def compile_mode(value: bool | str, device: torch.device, steps: int | None = None) -> str:
    """compute.compile for a device and a run of `steps` steps: "model", "graphs", "blocks" or "off". "auto": the whole
    model on CUDA for a run of at least SCALECL_COMPILE_MIN_STEPS steps (None: any), off elsewhere, so that CPU
    runs keep their numbers; true: every block."""
    if value == "auto":
        long_run = steps is None or steps >= env("SCALECL_COMPILE_MIN_STEPS")
        return "model" if device.type == "cuda" and long_run else "off"
    if isinstance(value, bool):
        return "blocks" if value else "off"
    return value


def compile_model(model: nn.Module, mode: str, backend: str | Any = "inductor") -> None:
    """torch.compile in place (nn.Module.compile: names, state dict and hooks unchanged): the whole model
    ("model": one graph for the forward, so no Python runs between blocks; "graphs": the same, replayed as CUDA
    graphs, inductor's mode="reduce-overhead", for steps bound by kernel launches) or every decoder block
    ("blocks").

    Compiling happens at the first forward: a model that fails then trains eagerly (scalecl.training.loop
    retries its first step after `uncompile`). Forwards run without a KV cache (the step's loss passes
    use_cache=False), so the graph does not change between steps.
    """
    from scalecl.models.build import decoder_layers

    model._scalecl_compile = mode  # what the result records (scalecl.compute.parallel.describe)
    if mode == "model":
        model.compile(backend=backend)
    elif mode == "graphs":  # CUDA graphs are inductor's; another backend (a CPU test's) traces the same graph
        model.compile(**({"mode": "reduce-overhead"} if backend == "inductor" else {"backend": backend}))
    elif mode == "blocks":
        for layer in decoder_layers(hf_model(model)):
            layer.compile(backend=backend)


def compiled(model: nn.Module) -> bool:
    """Whether any module of `model` runs through torch.compile."""
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())


def _compiled_as(model: nn.Module, modes: tuple[str, ...]) -> bool:
    """Whether a module of `model` (the model itself, or the one a wrapper such as DDP holds) runs through
    torch.compile as compile_model made it in one of `modes`."""
    return any(getattr(m, "_scalecl_compile", None) in modes and getattr(m, "_compiled_call_impl", None) is not None
               for m in model.modules())


def whole_model_compiled(model: nn.Module) -> bool:
    """Whether `model` runs through torch.compile as one graph (compile_model's "model" or "graphs"; not "blocks",
    whose head and loss run eagerly)."""
    return _compiled_as(model, ("model", "graphs"))


def graph_replayed(model: nn.Module) -> bool:
    """Whether `model` runs as CUDA graphs (compile_model's "graphs"): a step must then be marked as begun, and
    an output kept past the next step copied (a replay writes the same memory)."""
    return _compiled_as(model, ("graphs",))


def uncompile(model: nn.Module, why: str) -> None:
    """Undo compile_model: every module runs eagerly again; `why` is kept for the result (compile_failure)."""
    for m in model.modules():
        if getattr(m, "_compiled_call_impl", None) is not None:
            m._compiled_call_impl = None
            m._scalecl_compile_failed = why


def compile_failure(model: nn.Module) -> str | None:
    """Why the model runs eagerly although compile was asked for (None: it did not fail)."""
    return next((m._scalecl_compile_failed for m in model.modules() if hasattr(m, "_scalecl_compile_failed")), None)


def is_compile_error(e: BaseException) -> bool:
    """Whether `e` (or what caused it) was raised by torch.compile's tracing or code generation (dynamo,
    AOTAutograd, inductor), rather than by the computation itself."""
    seen = 0
    while e is not None and seen < 20:
        if type(e).__module__.startswith(("torch._dynamo", "torch._inductor", "torch._functorch")):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def ensure_sdpa(model: nn.Module) -> str:
    """Run attention through torch's scaled_dot_product_attention where transformers supports it.

    transformers 5 already builds GPT-NeoX and Llama with "sdpa"; a model loaded with another choice is
    switched. Returns the implementation in use.
    """
    base = hf_model(model)
    impl = getattr(base.config, "_attn_implementation", None)
    if impl != "sdpa" and getattr(base, "_supports_sdpa", False) and hasattr(base, "set_attn_implementation"):
        base.set_attn_implementation("sdpa")
        impl = base.config._attn_implementation
    return impl or "unknown"


def scale_products() -> str:
    """How SCALE's widened linears form their forward products (SCALECL_SCALE_PRODUCTS; layers.py)."""
    return env("SCALECL_SCALE_PRODUCTS")


def autocast_dtype(dtype: str, device: torch.device, cpu_bf16: bool = False) -> torch.dtype | None:
    """What forwards autocast to: on CUDA, bfloat16 when a config's `dtype` asks for it; on a CPU, float32
    (None) unless `cpu_bf16` (compute.cpu_bf16) asks for bfloat16."""
    if device.type == "cuda":
        return torch.bfloat16 if dtype == "bfloat16" else None
    return torch.bfloat16 if cpu_bf16 and device.type == "cpu" else None


def speed_provenance(cc, device: torch.device, autocast: torch.dtype | None) -> dict[str, Any]:
    """What a result should record about how fast its steps could run."""
    return {"precision": precision(device, autocast), "tf32": bool(cc.tf32) if device.type == "cuda" else None,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "scale_products": scale_products(), "peak": peak_tflops(device, autocast)}
