"""Parameter accounting per module kind, shown by the CLI before anything trains, and what the end-of-run
tables compare a run with (its chance floor, the FFT run of the same base)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


# ---------------------------------------------------------------------------------------------------------
# End-of-run tables: what a result is compared with


def base_identity(result: dict[str, Any]) -> tuple | None:
    """What a finished run started from: CPT, the base model's folder; biography, the cached stages 1-2 (its base
    seed and the stages' recorded final losses, which differ between any two cache entries). None if unknown."""
    if result.get("experiment") == "cpt":
        base = result.get("base")
        return ("cpt", base.get("source")) if isinstance(base, dict) and base.get("source") else None
    stages = [result.get(s) for s in ("stage1", "stage2")]
    if not all(isinstance(s, dict) and "final_loss" in s for s in stages):
        return None
    seeds = result.get("seeds") if isinstance(result.get("seeds"), dict) else {}
    return ("bio", result.get("preset"), seeds.get("base", 0), *(s["final_loss"] for s in stages))


def fft_reference(results: list[dict[str, Any]], folders: Sequence[Path]) -> dict[str, Any] | None:
    """The FFT run of the same base as the sweep's runs: among them, else a finished one in the first of
    `folders` that has one (the newest there); None when there is none or the runs do not share one base."""
    bases = {base_identity(r) for r in results}
    if len(bases) != 1 or None in bases:
        return None
    base = bases.pop()
    found = [r for r in results if r.get("method") == "fft"]
    for folder in folders:
        if found:
            break
        found = _finished_fft(folder, base)
    return max(found, key=_finished) if found else None


def _finished_fft(out: Path, base: tuple) -> list[dict[str, Any]]:
    """The finished FFT runs of `base` in the folder `out` (none when it does not exist)."""
    found: list[dict[str, Any]] = []
    if out.is_dir():
        from scalecl.common.errors import ScaleclError
        from scalecl.common.readers import read_json

        for f in out.glob("*fft*/result.json"):
            try:
                r = read_json(f, "run result")
            except ScaleclError:  # a damaged result is `scalecl plot`'s to report, not the summary's
                continue
            if isinstance(r, dict) and r.get("method") == "fft" and base_identity(r) == base:
                found.append(r)
    return found


def _finished(result: dict[str, Any]) -> str:
    prov = result.get("provenance") if isinstance(result.get("provenance"), dict) else {}
    return str(prov.get("finished") or prov.get("date") or "")


def chance_floor(results: list[dict[str, Any]], part: str) -> float | None:
    """Biography: the accuracy of always answering an attribute's most common first token (`priors`, pooled over
    attributes) on `part` (task0_heldout, task1), if the runs record one and agree on it."""
    floors = {r.get("priors", {}).get(part, {}).get("pooled") for r in results}
    return floors.pop() if len(floors) == 1 and None not in floors else None
