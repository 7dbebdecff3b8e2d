"""Perplexity, representation forgetting and upscaled-weight norms: the CPT measurements (paper Fig. 4, 7, 9).

Perplexity is token-weighted: exp(sum of next-token NLL over every scored token / number of scored
tokens), where a chunk of T tokens scores T - 1 (position t predicts token t + 1). Evaluation sets are
packed chunks (scalecl.data.corpus.eval_chunks), so the number is independent of the batch size.

The (B, T, V) logits of a batch can be far larger than the model (8 x 2,048 positions x 49,152 rows is 3.2 GB in
float32, and the loss holds three such tensors). With `logit_block` the head and the cross-entropy run over blocks
of positions holding about `logit_block` logits each instead (`chunked_logits`, `_blocked_nll`), with the same
result up to float rounding. The forward keeps no KV cache (nothing follows it).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from scalecl.compute.parallel import local, lockstep_padding

LOGIT_BLOCK = 1 << 24  # float32 logits per head product when the loss runs by blocks of positions (64 MiB)
# what the model's forward does to the head's output besides the head itself, per family (transformers 5): only
# Gemma's final soft-cap. A family outside this table is scored from its whole logits.
HEAD_FAMILIES = ("gpt_neox", "llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "gemma2", "gemma3_text")


def _dist() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@torch.no_grad()
def perplexity(
    model: nn.Module, chunks: Sequence[torch.Tensor], batch_size: int = 16,
    autocast_dtype: torch.dtype | None = None, stats: Callable[[torch.Tensor], dict[str, float]] | None = None,
    progress: Callable[[int], None] | None = None, logit_block: int | None = None,
) -> dict[str, float]:
    """Token-weighted perplexity of `model` on chunks of token ids (1-D tensors, equal lengths except the last).

    Returns ppl, nll (mean per scored token), tokens (scored), sequences, seq_len (the longest chunk).
    stats(mask) is called after every forward with its (B, T) mask of scored positions (e.g. a method's
    routing fractions) and its numbers are averaged weighted by scored tokens. Under torch.distributed each
    process scores every world-th batch and the sums are all-reduced, so every process returns the same.
    progress(n) is called after every batch with its number of chunks, the batches other processes score
    included (so one process's count is the job's; scalecl.training.progress.eval_progress makes one); it reads nothing
    back and changes no number. logit_block: score by blocks of positions holding about this many logits each
    (chunked_logits; None: the whole batch's logits at once).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    rank, world = _dist()
    by_len: dict[int, list[torch.Tensor]] = {}
    for c in chunks:
        by_len.setdefault(len(c), []).append(c)
    batches = [torch.stack(group[i : i + batch_size]) for n, group in sorted(by_len.items(), reverse=True)
               for i in range(0, len(group), batch_size)]
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # NLL sum, scored tokens
    extra: dict[str, float] = {}
    scored = [b % world for b, ids in enumerate(batches) if ids.shape[1] >= 2]  # the process of each forward
    for _ in range(lockstep_padding(model, scored.count(rank), [scored.count(r) for r in range(world)])):
        model(input_ids=batches[0][:1, :2].to(device), use_cache=False)  # FSDP: every process runs as many forwards
    for b, ids in enumerate(batches):
        if b % world == rank and ids.shape[1] >= 2:
            sums += _score(model, ids.to(device), autocast_dtype, stats, extra, logit_block)
        if progress is not None:
            progress(len(ids))
    if world > 1:
        names: list[list[str]] = [[] for _ in range(world)]
        dist.all_gather_object(names, sorted(extra))  # a process that scored no batch has no stats keys
        keys = sorted(set().union(*names))
        vec = torch.cat([sums, torch.tensor([extra.get(k, 0.0) for k in keys], dtype=torch.float64, device=device)])
        dist.all_reduce(vec)
        sums, extra = vec[:2], dict(zip(keys, vec[2:].tolist(), strict=True))
    model.train(was_training)
    total, tokens = sums.tolist()
    mean = total / max(tokens, 1)
    ppl = math.exp(mean) if mean < 709 else math.inf if mean >= 709 else math.nan  # overflow: inf, not an error
    out = {"ppl": ppl, "nll": mean, "tokens": int(tokens), "sequences": len(chunks),
           "seq_len": max((len(c) for c in chunks), default=0)}
    return out | {k: v / max(tokens, 1) for k, v in extra.items()}


def _score(model: nn.Module, ids: torch.Tensor, autocast_dtype, stats, extra: dict[str, float],
           logit_block: int | None = None) -> torch.Tensor:
    """One batch (B, T): its (NLL sum, scored tokens); stats' numbers, weighted by scored tokens, into `extra`."""
    device = ids.device
    n = ids[:, 1:].numel()
    if logit_block is not None and chunked_logits(model):
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            nll, shares = _blocked_nll(model, ids, logit_positions(ids.shape[0], _vocab(model), logit_block), stats)
        for k, v in shares.items():  # each block's numbers weighted by its positions: the whole mask's
            extra[k] = extra.get(k, 0.0) + v * n / ids.numel()
        return torch.tensor([nll, n], dtype=torch.float64, device=device)
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        logits = model(input_ids=ids, use_cache=False).logits  # (B, T, V); no KV cache: nothing follows
    nll = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")
    if stats is not None:
        mask = torch.ones(ids.shape, dtype=torch.bool, device=device)
        for k, v in stats(mask).items():
            extra[k] = extra.get(k, 0.0) + v * n
    return torch.tensor([nll.item(), n], dtype=torch.float64, device=device)


def chunked_logits(model: nn.Module) -> bool:
    """Whether the loss can run by blocks of positions through the model's head: a family whose forward does
    nothing to the head's output but Gemma's soft-cap (HEAD_FAMILIES), with an output head."""
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) in HEAD_FAMILIES and model.get_output_embeddings() is not None


def logit_positions(rows: int, vocab: int, block: int = LOGIT_BLOCK) -> int:
    """Positions per head product so that its (rows, positions, vocab) logits hold about `block` (at least 1)."""
    return max(1, block // max(1, rows * vocab))


def _vocab(model: nn.Module) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def _blocked_nll(model: nn.Module, ids: torch.Tensor, positions: int, stats) -> tuple[float, dict[str, float]]:
    """The NLL sum of one batch (B, T) from the head's input, `positions` positions at a time: a pre-hook on the
    head takes its input (every layer below runs once), runs the head and the cross-entropy block by block and
    hands the head an empty slice, so the forward's own logits are (B, 0, V). Gemma's soft-cap is applied as its
    forward does. stats(mask) runs after each block's head product with the (B, t) mask of its positions; its
    numbers come back summed, each weighted by its block's positions (over B x T: one call on the whole batch's
    mask, times B x T)."""
    head = model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None)
    rows, length = ids.shape
    out: dict[str, Any] = {"nll": None, "shares": {}}

    def score_blocks(module: nn.Module, args: tuple) -> tuple | None:
        if len(args) != 1:  # called another way: the forward's own logits are scored
            return None
        h = args[0]  # (B, T, d); SCALE-Route: (2B, T, d + d_up), both paths
        total = torch.zeros((), dtype=torch.float64, device=ids.device)
        for s in range(0, length, positions):
            z = module.forward(h[:, s : s + positions])  # (B, t, V)
            if cap is not None:
                z = torch.tanh(z / cap) * cap
            k = min(s + positions, length - 1) - s  # the block's scored positions (the last predicts nothing)
            if k > 0:
                total += F.cross_entropy(z[:, :k].float().flatten(0, 1), ids[:, s + 1 : s + 1 + k].flatten(),
                                         reduction="sum").double()
            if stats is not None:
                mask = torch.ones(rows, z.shape[1], dtype=torch.bool, device=ids.device)
                for key, v in stats(mask).items():
                    out["shares"][key] = out["shares"].get(key, 0.0) + v * mask.numel()
            del z
        out["nll"] = total.item()
        return (h[:, :0],)

    handle = head.register_forward_pre_hook(score_blocks)
    try:
        logits = model(input_ids=ids, use_cache=False).logits  # no KV cache: a layer's K and V are freed
    finally:
        handle.remove()
    if out["nll"] is None:  # the head was not called with its input alone: its logits are whole
        nll = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")
        mask = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
        return nll.item(), {k: v * ids.numel() for k, v in (stats(mask) if stats is not None else {}).items()}
    return out["nll"], out["shares"]


@torch.no_grad()
def final_hidden(model: nn.Module, ids: torch.Tensor, d: int) -> torch.Tensor:
    """(B, T, d) final hidden state (after the final norm) on the first d channels.

    Route runs its adapt path here (scale_path "adapt": W12 as trained), so that the cosine measures how far
    the trained path moved; its preserve path reproduces the base by construction (Theorem 3.1).
    """
    from scalecl.methods.scale import scale_path

    state = getattr(model, "scale_state", None)
    ctx = scale_path(model, "adapt") if state is not None and state.mode == "route" else contextlib.nullcontext()
    was_training = model.training
    model.eval()
    with ctx:
        h = model(input_ids=ids, output_hidden_states=True, logits_to_keep=1, use_cache=False).hidden_states[-1]  # no (B, T, V) logits
    model.train(was_training)
    return h[..., :d].float()


def representation_cosine(h0: torch.Tensor, h: torch.Tensor) -> float:
    """Mean per-token cosine similarity of two (B, T, d) hidden states (paper Fig. 4a)."""
    return F.cosine_similarity(h0.double(), h.double(), dim=-1).mean().item()


def upscaled_norms(model: nn.Module) -> dict[str, float]:
    """Average Frobenius norm of the upscaled blocks of Eq. 1 (paper Fig. 7); empty for other models.

    up_norm: mean over every W12, W21 and W22 block of every widened linear; up_norm/w12: mean over the
    W12 blocks that train (collaborative layers), the part that moves the original function.
    """
    from scalecl.modeling.scale_layers import UpLinear

    blocks, w12 = [], []
    for m in model.modules():
        if isinstance(m, UpLinear):
            blocks += [m.w12, m.w21, m.w22]
            if m.w12.requires_grad:
                w12.append(m.w12)
    if not blocks:
        return {}
    def norm(b: torch.Tensor) -> float:  # FSDP: a sharded block's norm is reduced over every process
        return local(b.detach().float().norm()).item()

    out = {"up_norm": sum(norm(b) for b in blocks) / len(blocks)}
    if w12:
        out["up_norm/w12"] = sum(norm(b) for b in w12) / len(w12)
    return out
