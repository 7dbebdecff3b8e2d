"""What continual pre-training evaluates on and how its results are shown: the held-out sets of both domains
and the representation batch (`EvalSets`), the final held-out evaluation's sets and lengths (`FinalSet`,
`final_lengths`), the per-position values of SCALE-Route's router summarised per evaluation (`method_stats`,
`route_stats`), and the end-of-run tables (`CPT_TABLE`, `heldout_table`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from rich.markup import escape

from scalecl.common.errors import ScaleclError
from scalecl.data.corpus import EvalChunks
from scalecl.evaluation.qa import value_summary
from scalecl.experiments.base import EndTable
from scalecl.methods import Method


@dataclass
class EvalSets:
    """What every method is evaluated on: tokenised held-out chunks of both domains and the base's final
    hidden state on a fixed batch of old-domain chunks (Fig. 4a)."""

    old_chunks: EvalChunks
    new_chunks: EvalChunks
    old_spec: str
    new_spec: str
    rep_ids: torch.Tensor  # (rep_batch, T)
    h0: torch.Tensor | None = None  # (rep_batch, T, d), set once the base exists
    d_model: int = 0

    def tokens(self, split: str) -> int:
        return (self.old_chunks if split == "old" else self.new_chunks).scored

    def record(self, split: str) -> dict[str, Any]:
        """What a held-out set holds, for result.json: its slice, documents, tokens and sequences."""
        chunks = self.old_chunks if split == "old" else self.new_chunks
        return {"slice": self.old_spec if split == "old" else self.new_spec, "tokens": chunks.scored,
                "sequences": len(chunks), "documents": chunks.documents, "tokens_packed": chunks.packed}

    def line(self, split: str) -> str:
        """One held-out set, in words (rich markup escaped): the tokens scored, of how many documents of what."""
        chunks, spec = (self.old_chunks, self.old_spec) if split == "old" else (self.new_chunks, self.new_spec)
        return escape(f"{chunks.scored:,} tokens scored, {chunks.documents:,} documents of {spec}")


@dataclass
class FinalSet:
    """One held-out set of the final evaluation: its slice in words, its chunks at each length, and the scores
    (length -> "base" / "end" -> perplexity's record)."""

    slice: str
    chunks: dict[int, EvalChunks]
    scores: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)


def final_lengths(rc: Any, n_pos: int | None) -> list[int]:
    """The lengths of the final held-out evaluation: the training length, then eval.final_context (0: the
    model's positions, at most eval-ppl's default length) when it differs; none when eval.final_take is -1."""
    from scalecl.experiments.eval_ppl import DEFAULT_SEQ_LEN

    if rc.eval.final_take < 0:
        return []
    seq, ctx = rc.train.seq_len, rc.eval.final_context or min(n_pos or DEFAULT_SEQ_LEN, DEFAULT_SEQ_LEN)
    if n_pos is not None and ctx > n_pos:
        raise ScaleclError(f"eval.final_context={ctx} exceeds the model's {n_pos} positions")
    if ctx < 2:
        raise ScaleclError(f"eval.final_context must be at least 2, got {ctx}")
    return [seq] if ctx == seq else [seq, ctx]


def method_stats(method: Method, model, mask: torch.Tensor, at: dict[str, list[torch.Tensor]]) -> dict[str, float]:
    """The method's per-token metrics of one evaluation forward; its values at every position (SCALE-Route:
    router score, and the never-row logit shares when measured) are appended to `at`."""
    for k, v in method.position_values(model, mask).items():
        if k != "route_preserve":  # the routing fraction is already a per-token metric
            at.setdefault(k, []).append(v.detach().double().cpu())
    return method.metrics(model, mask)


def route_stats(at: dict[str, list[torch.Tensor]]) -> dict[str, float]:
    """Mean and 5/25/50/75/95% quantiles of each per-position value over an evaluation set (under several
    processes: over this process's share). route_score is the router's cosine (or probability), never_share_<path>
    the share of that path's logit norm on the never rows."""
    out: dict[str, float] = {}
    for k, parts in sorted(at.items()):
        if len(v := torch.cat(parts)):
            out |= {name: round(x, 6) for name, x in value_summary(k, v).items()}
    return out


def _summary_cells(r: dict[str, Any]) -> list[str] | None:
    s = r.get("summary", {})
    if "old_ppl_start" not in s:
        return None
    return [f"{s['old_ppl_start']:.3f}", f"{s['old_ppl_end']:.3f}", f"{s['new_ppl_start']:.2f}",
            f"{s['new_ppl_end']:.3f}", f"{s['rep_cos_end']:.4f}", f"{r['trainable_params']:,}"]


def _chance_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    """A uniform guess's perplexity (the vocabulary size), for the builtin base whose vocabulary is configured."""
    vocab = {r.get("config", {}).get("builtin", {}).get("vocab") for r in results}
    if len(vocab) == 1 and isinstance(v := vocab.pop(), int) and results[0].get("config", {}).get("base") == "builtin":
        return [["chance (uniform over the vocabulary)", *[f"{v:,}"] * 4, "", ""]]
    return []


CPT_TABLE = EndTable("continual pre-training: forgetting (old-domain PPL) vs learning (new-domain PPL)",
                     ("old PPL start", "old PPL end", "new PPL start", "new PPL end", "rep cos end", "trainable"),
                     _summary_cells, _chance_rows)


def heldout_table(results: list[dict[str, Any]], labels: list[str] | None = None):
    """The final held-out evaluation's whole-set perplexities (result.json `heldout`), start (the base) -> end, per
    set and length, as a table; None when no result has one."""
    from rich.table import Table

    shown = [(lab, r) for lab, r in zip(labels or [r["method"] for r in results], results, strict=True)
             if isinstance(r.get("heldout"), dict)]
    if not shown:
        return None
    held = shown[0][1]["heldout"]
    cols = [(split, n) for split in ("old", "new") if split in held for n in held[split]["at"]]
    table = Table(title="final held-out evaluation: whole-set perplexity, base -> final model (result.json heldout)")
    table.add_column("run" if labels else "method", no_wrap=True)
    for split, n in cols:
        docs = held[split]["documents"]
        table.add_column(f"{split} PPL at {int(n):,} ({docs:,} docs)", justify="right")
    for label, r in shown:
        at = [r["heldout"].get(split, {}).get("at", {}).get(n) for split, n in cols]
        table.add_row(label, *(f"{a['start']['ppl']:.3f} -> {a['end']['ppl']:.3f}" if a else "" for a in at))
    return table
