"""The training step's loss without the whole float32 logits: a chunked linear cross-entropy (compute.loss).

A causal LM's own loss (transformers' ForCausalLMLoss) applies the head to every position, keeps the logits
(B x T x V, in bf16 under autocast), copies them to float32 and keeps their float32 log-softmax for the
backward: at the `gpu` biography preset's stage 1 (96 x 512 tokens, 50,304 rows) that was 23 of its 44.3 GiB
and 30% of its step (issue 43). The chunked loss here instead

- takes the final hidden states from the model (its head, while the loss runs, hands back its input), and only
  at the positions that have a label (QA batches: the answer, a fifth of the tokens);
- applies the head to CHUNK_ELEMENTS logits at a time, and computes each chunk's loss and its gradients (of the
  hidden states, the head's weight and bias) at once, in the forward, so no logits outlive their chunk and the
  backward only scales the gradients it kept (Liger-Kernel's fused linear cross-entropy does the same in
  Triton; this is plain PyTorch).

The numbers: the mean cross-entropy over the labelled positions, as the model's own loss (ignore_index -100);
in float32 equal to it and its gradients to float32 rounding (tests/compute/test_loss.py); under bf16 autocast
the head's product runs in bf16 as the model's would, the softmax in float32, and the weight gradient is summed
over chunks in float32 (the model's own: one bf16 product), so the two agree within bf16 rounding.

Which loss a run uses: compute.loss ("auto": on CUDA the chunked loss for a model that runs eagerly and the
model's own for a whole model compiled, where inductor fuses the logits' float32 copies: on one H200 at the
`gpu` preset's stage 1 the compiled model's own loss stepped in 101.6 ms (32.2 GiB) against 146.5 ms (19.3 GiB)
with the chunked loss, whose chunks run outside the graph; the model's own elsewhere, so CPU runs keep their
numbers bit for bit); "liger" and "cce" use Liger-Kernel's or Cut Cross-Entropy's fused loss when installed
(both need Triton and a GPU; neither is a dependency). The chunked and fused losses apply where the head is a
plain linear layer of a transformers CausalLM whose logits are the head's output (no soft-capping), in one
process or under DDP; anywhere else (SCALE's widened head, FSDP) the model's own loss runs, and the result
says so (`speed.loss`).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scalecl.common.errors import ScaleclError

IGNORE_INDEX = -100
# logits of one chunk: 64M elements, 256 MiB in float32 (a 50,304-row head: 1,334 positions per chunk; the
# labelled positions of a QA step, 48 answers of a few tokens, fit in one, so it costs one product, not dozens)
CHUNK_ELEMENTS = 1 << 26
_FUSED = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}


def chunk_positions(vocab: int, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    """Positions per chunk of the head: about `chunk_elements` logits, at least 16 positions."""
    return max(16, chunk_elements // max(vocab, 1))


# ---------------------------------------------------------------------------------------------------------
# the chunked linear cross-entropy


def _product_dtype(h: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype of the head's product: the autocast dtype where autocast is on (as the model's head would
    run), else the weights'."""
    kind = h.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return weight.dtype


def _chunked(h, weight, bias, targets, chunk: int, dtype: torch.dtype, needs: tuple[bool, bool, bool]):
    """(loss, dh, dweight, dbias) of the mean cross-entropy of `h @ weight.T + bias` (h (N, d), targets (N,)),
    a chunk of positions at a time; a gradient is None where `needs` says it is not wanted."""
    n = h.shape[0]
    with torch.autocast(h.device.type, enabled=False):
        w = weight.to(dtype)
        b = bias.to(dtype) if bias is not None else None
        gh = torch.empty_like(h) if needs[0] else None
        gw = torch.zeros_like(weight, dtype=torch.float32) if needs[1] else None
        gb = torch.zeros_like(bias, dtype=torch.float32) if needs[2] and bias is not None else None
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        for s in range(0, n, chunk):
            x, y = h[s : s + chunk].to(dtype), targets[s : s + chunk]  # (c, d), (c,)
            z = F.linear(x, w, b).float()  # (c, V): the chunk's logits, in float32 as the model's loss reads them
            lse = torch.logsumexp(z, dim=-1)  # (c,)
            total += (lse - z.gather(1, y[:, None]).squeeze(1)).sum()
            if not any(needs):
                continue
            g = z.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
            g[torch.arange(len(y), device=g.device), y] -= 1.0
            g = g.div_(n).to(dtype)  # (c, V): d loss / d logits
            if gh is not None:
                gh[s : s + chunk] = (g @ w).to(h.dtype)  # (c, d)
            if gw is not None:
                gw += (g.t() @ x).float()  # (V, d)
            if gb is not None:
                gb += g.float().sum(0)
            del g, z
    return total / n, gh, gw, gb


class _LinearCrossEntropy(torch.autograd.Function):
    """_chunked as an autograd function: the gradients are made in the forward, the backward scales them."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, chunk: int, dtype: torch.dtype):
        loss, gh, gw, gb = _chunked(h, weight, bias, targets, chunk, dtype, tuple(ctx.needs_input_grad[:3]))
        ctx.save_for_backward(gh, gw, gb)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        gh, gw, gb = ctx.saved_tensors
        g = grad_out.float()
        return (None if gh is None else gh * g.to(gh.dtype), None if gw is None else (gw * g).to(ctx.dtypes[0]),
                None if gb is None else (gb * g).to(ctx.dtypes[1]), None, None, None)


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                         chunk: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of the head `weight` (V, d) (and `bias`) applied to hidden states `h` (N, d) against
    `targets` (N,), never holding more than one chunk of logits; differentiable in h, weight and bias.

    Every target must be a class (select the labelled positions first: `select_labelled`)."""
    chunk = chunk or chunk_positions(weight.shape[0])
    dtype = _product_dtype(h, weight)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, weight, bias)):
        return _LinearCrossEntropy.apply(h, weight, bias, targets, chunk, dtype)
    with torch.no_grad():
        return _chunked(h, weight, bias, targets, chunk, dtype, (False, False, False))[0]


def select_labelled(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, targets) of a causal LM's labels (B, T): the flat positions b * T + t (t < T - 1) whose next
    label is not IGNORE_INDEX, and those labels. Made on the host (the batch before it moves), so the device
    is never read to find them."""
    b, t = labels.shape
    nxt = labels[:, 1:]  # (B, T-1): position t predicts label t + 1
    pos = (nxt != IGNORE_INDEX).nonzero()  # (n, 2)
    return pos[:, 0] * t + pos[:, 1], nxt[pos[:, 0], pos[:, 1]]


# ---------------------------------------------------------------------------------------------------------
# the step's loss: the model's own, or the chunked (or a fused) loss on the model's final hidden states


class ModelLoss:
    """The model's own loss (`model(**batch).loss`), without a KV cache: nothing follows a training forward."""

    name = "model"

    def host(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The host batch as the step reads it (here: as it is)."""
        return batch

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(**batch, use_cache=False).loss

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}


class _HiddenHead(nn.Linear):
    """A head (nn.Linear) that hands back its input while `emit_hidden` is set: the model's forward then returns
    its final hidden states as `logits`. State dict, parameters and every other forward are the nn.Linear's."""

    emit_hidden = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.emit_hidden else super().forward(x)


@contextlib.contextmanager
def _emitting(head: _HiddenHead) -> Iterator[None]:
    head.emit_hidden = True
    try:
        yield
    finally:
        head.emit_hidden = False


class HeadLoss(ModelLoss):
    """The chunked linear cross-entropy (or a fused one, `fused`) at the labelled positions of the model's final
    hidden states. `head` is the model's output layer, made a _HiddenHead."""

    def __init__(self, head: _HiddenHead, kind: str = "chunked", chunk: int | None = None) -> None:
        self.head, self.name, self.chunk = head, kind, chunk or chunk_positions(head.out_features)

    def host(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        rows, targets = select_labelled(batch["labels"])
        return {k: v for k, v in batch.items() if k != "labels"} | {"loss_rows": rows, "loss_targets": targets}

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k not in ("loss_rows", "loss_targets")}
        with _emitting(self.head):
            h = model(**inputs, use_cache=False).logits  # (B, T, d): the final hidden states
        h = h.reshape(-1, h.shape[-1]).index_select(0, batch["loss_rows"])  # (n, d)
        head, y = self.head, batch["loss_targets"]
        if self.name == "chunked":
            return linear_cross_entropy(h, head.weight, head.bias, y, self.chunk)
        return _fused(self.name, h, head.weight, head.bias, y)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "chunk_positions": self.chunk if self.name == "chunked" else None}


def _fused(kind: str, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor):
    """Liger-Kernel's or Cut Cross-Entropy's fused linear cross-entropy, in the autocast dtype (as the head would
    run); the mean over the rows."""
    dtype = _product_dtype(h, weight)
    h, w = h.to(dtype), weight.to(dtype)
    b = bias.to(dtype) if bias is not None else None
    if kind == "liger":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        return liger_fused_linear_cross_entropy(h, w, y, b)
    from cut_cross_entropy import linear_cross_entropy as cce

    if b is not None:
        raise ScaleclError("compute.loss=cce: Cut Cross-Entropy takes no head bias; use chunked")
    return cce(h, w, y)


def head_of(model: nn.Module) -> nn.Module | None:
    """The output layer the chunked loss can use, or None: a plain nn.Linear head of a transformers CausalLM of a
    known family whose logits are the head's output (no soft-capping), the model itself that CausalLM (or peft's
    wrapper of it: not a module that does more with its logits), neither FSDP-sharded nor a SCALE model (its head
    is SCALE's own)."""
    from transformers import PreTrainedModel

    from scalecl.compute.parallel import is_ddp, is_fsdp
    from scalecl.compute.perf import hf_model
    from scalecl.modeling.scale_arch import ARCHS

    if is_fsdp(model):
        return None
    base = hf_model(model.module if is_ddp(model) else model)
    if not isinstance(base, PreTrainedModel):  # e.g. a wrapper that averages the logits with another model's
        return None
    cfg = getattr(base, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in ARCHS or not hasattr(base, "get_output_embeddings"):
        return None
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None) is not None:
        return None
    head = base.get_output_embeddings()
    return head if type(head) in (nn.Linear, _HiddenHead) else None


def resolve_loss(kind: str, device: torch.device, compiled: bool = False) -> str:
    """compute.loss for a device and a model (`compiled`: the whole model runs through torch.compile): "auto" is
    the chunked loss on CUDA for an eager model, the model's own for a compiled one (faster, measured: module
    docstring) and on every other device."""
    if kind == "auto":
        return "chunked" if device.type == "cuda" and not compiled else "model"
    return kind


def check_loss(kind: str, device: torch.device) -> None:
    """One ScaleclError before any work for a fused loss that cannot run here."""
    if kind in _FUSED:
        if importlib.util.find_spec(_FUSED[kind]) is None:
            raise ScaleclError(f"compute.loss={kind} needs {_FUSED[kind].replace('_', '-')} (pip install "
                               f"{'liger-kernel' if kind == 'liger' else 'cut-cross-entropy'}; it needs Triton), "
                               f"or use compute.loss=chunked")
        if device.type != "cuda":
            raise ScaleclError(f"compute.loss={kind} runs on CUDA only (a Triton kernel); use chunked or model")


def step_loss(model: nn.Module, kind: str, device: torch.device) -> ModelLoss:
    """The loss a run's steps use (compute.loss resolved for the device and the model): HeadLoss where the
    model's head allows it (its class becomes _HiddenHead: same parameters, same forward), else ModelLoss."""
    from scalecl.compute.perf import whole_model_compiled

    kind = resolve_loss(kind, device, whole_model_compiled(model))
    head = head_of(model) if kind != "model" else None
    if head is None:
        return ModelLoss()
    if type(head) is nn.Linear:
        head.__class__ = _HiddenHead
    return HeadLoss(head, kind)
