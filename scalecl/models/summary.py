"""Parameter accounting per module kind, shown by the CLI before anything trains."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

KINDS = ("embedding", "attention", "mlp", "norm", "head", "other")


def module_kind(name: str) -> str:
    """Classify a parameter name of a GPT-NeoX/Llama model (plain, upscaled, LoRA or expanded)."""
    if "embed_in" in name or "embed_tokens" in name:
        return "embedding"
    if name.startswith(("lm_head", "base_model.model.lm_head")) or ".lm_head." in name or "embed_out" in name:
        return "head"
    if "norm" in name:
        return "norm"
    if "attention" in name or "self_attn" in name:
        return "attention"
    if "mlp" in name:
        return "mlp"
    return "other"


def param_counts(model: nn.Module) -> tuple[Counter, Counter]:
    """(total, trainable) parameter counts per kind; shared tensors counted once."""
    total, train = Counter(), Counter()
    for name, p in model.named_parameters():
        k = module_kind(name)
        total[k] += p.numel()
        if p.requires_grad:
            train[k] += p.numel()
    return total, train


def param_rows(base_total: Counter, total: Counter, train: Counter) -> list[tuple[str, int, int, int]]:
    """Rows (kind, base, added, trainable) plus a total row, for kinds that have parameters."""
    rows = [(k, base_total[k], total[k] - base_total[k], train[k]) for k in KINDS if total[k] or base_total[k]]
    rows.append(("total", sum(base_total.values()), sum(total.values()) - sum(base_total.values()),
                 sum(train.values())))
    return rows
