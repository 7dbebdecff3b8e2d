"""Perplexity, representation forgetting and upscaled-weight norms: the CPT measurements (paper Fig. 4, 7, 9).

Perplexity is token-weighted: exp(sum of next-token NLL over every scored token / number of scored
tokens), where a chunk of T tokens scores T - 1 (position t predicts token t + 1). Evaluation sets are
packed chunks (scalecl.data.corpus.eval_chunks), so the number is independent of the batch size.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from scalecl.compute.parallel import local, lockstep_padding


def _dist() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@torch.no_grad()
def perplexity(
    model: nn.Module, chunks: Sequence[torch.Tensor], batch_size: int = 16,
    autocast_dtype: torch.dtype | None = None, stats: Callable[[torch.Tensor], dict[str, float]] | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """Token-weighted perplexity of `model` on chunks of token ids (1-D tensors, equal lengths except the last).

    Returns ppl, nll (mean per scored token), tokens (scored), sequences, seq_len (the longest chunk).
    stats(mask) is called after every forward with its (B, T) mask of scored positions (e.g. a method's
    routing fractions) and its numbers are averaged weighted by scored tokens. Under torch.distributed each
    process scores every world-th batch and the sums are all-reduced, so every process returns the same.
    progress(n) is called after every batch with its number of chunks, the batches other processes score
    included (so one process's count is the job's; scalecl.training.loop.eval_progress makes one); it reads nothing
    back and changes no number.
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
        model(input_ids=batches[0][:1, :2].to(device))  # FSDP: every process runs as many forwards
    for b, ids in enumerate(batches):
        if b % world == rank and ids.shape[1] >= 2:
            sums += _score(model, ids.to(device), autocast_dtype, stats, extra)
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


def _score(model: nn.Module, ids: torch.Tensor, autocast_dtype, stats, extra: dict[str, float]) -> torch.Tensor:
    """One batch (B, T): its (NLL sum, scored tokens); stats' numbers, weighted by scored tokens, into `extra`."""
    device = ids.device
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        logits = model(input_ids=ids).logits  # (B, T, V)
    nll = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")
    n = ids[:, 1:].numel()
    if stats is not None:
        mask = torch.ones(ids.shape, dtype=torch.bool, device=device)
        for k, v in stats(mask).items():
            extra[k] = extra.get(k, 0.0) + v * n
    return torch.tensor([nll.item(), n], dtype=torch.float64, device=device)


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
        h = model(input_ids=ids, output_hidden_states=True, logits_to_keep=1).hidden_states[-1]  # no (B, T, V) logits
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
