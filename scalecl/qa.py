"""Evaluation: first-token accuracy on QA (biography protocol), batched, no per-item Python loop."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass
class QATensors:
    """QA pairs tokenised as prompt + answer + EOS, right-padded."""

    ids: torch.Tensor  # (N, T) long
    prompt_len: torch.Tensor  # (N,) tokens of the prompt
    total_len: torch.Tensor  # (N,) prompt + answer + EOS
    attribute: torch.Tensor  # (N,) index into attributes
    attributes: tuple[str, ...]
    pad_id: int

    def __len__(self) -> int:
        return self.ids.shape[0]

    def subset(self, idx: np.ndarray | torch.Tensor) -> QATensors:
        idx = torch.as_tensor(idx, dtype=torch.long)
        t = int(self.total_len[idx].max()) if len(idx) else 1
        return QATensors(self.ids[idx, :t], self.prompt_len[idx], self.total_len[idx], self.attribute[idx],
                         self.attributes, self.pad_id)


def encode_qa(
    tokenizer, prompts: Sequence[str], answers: Sequence[str], attribute: Sequence[int], attributes: Sequence[str]
) -> QATensors:
    """Tokenise prompts and answers separately (answer + EOS) so the answer boundary is exact."""
    p_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    a_ids = tokenizer(list(answers), add_special_tokens=False)["input_ids"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    seqs = [p + a + [eos] for p, a in zip(p_ids, a_ids, strict=True)]
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad, dtype=torch.long)
    for i, s in enumerate(seqs):  # tokenisation output is ragged; this fills one row per pair once
        ids[i, : len(s)] = torch.tensor(s)
    return QATensors(
        ids, torch.tensor([len(p) for p in p_ids]), torch.tensor([len(s) for s in seqs]),
        torch.as_tensor(np.asarray(attribute), dtype=torch.long), tuple(attributes), pad,
    )


def qa_train_batch(qa: QATensors, idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """Inputs with the loss on answer + EOS only (-100 on prompt and padding)."""
    sub = qa.subset(idx)
    pos = torch.arange(sub.ids.shape[1])
    answer = (pos[None] >= sub.prompt_len[:, None]) & (pos[None] < sub.total_len[:, None])
    mask = pos[None] < sub.total_len[:, None]
    labels = torch.where(answer, sub.ids, torch.full_like(sub.ids, -100))
    return {"input_ids": sub.ids, "attention_mask": mask.long(), "labels": labels}


def qa_batches(qa: QATensors, batch_size: int, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    """Endless shuffled epochs of QA training batches."""
    g = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(qa), generator=g)
        for i in range(0, len(order) - batch_size + 1 if len(order) >= batch_size else 1, batch_size):
            yield qa_train_batch(qa, order[i : i + batch_size])


QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


@torch.no_grad()
def qa_accuracy(
    model: nn.Module, qa: QATensors, batch_size: int = 256, exact: bool = False,
    stats: Callable[[torch.Tensor], dict[str, float]] | None = None, method=None,
) -> dict[str, float]:
    """Hard and soft first-token accuracy, pooled and per attribute (and greedy exact match if asked).

    Hard: argmax over the whole vocabulary at the last prompt position equals the first answer token.
    Soft: mean probability of that token. Exact match: every answer token and EOS is the argmax under
    teacher forcing, which is exactly when greedy decoding reproduces the answer.
    stats(mask) is called after every batch with its (B, T) mask of real tokens (e.g. a method's routing
    fractions); its numbers are averaged over the batches, weighted by the number of real tokens.
    method: a method whose `metrics(model, mask)` are recorded the same way over every real token, and whose
    `position_values(model, mask)` are recorded at the scored position alone (the last prompt token, whose
    output is the answer's first token): booleans as a fraction ("answer/<key>"), numbers as mean and
    quantiles ("answer/<key>/mean", "answer/<key>/q05" ... "q95"). For SCALE-Route these are the routing
    decision and the router's cosine where the metric is decided.
    """
    if method is not None and stats is None:
        stats = lambda mask: method.metrics(model, mask)  # noqa: E731
    at_answer: dict[str, list[torch.Tensor]] = {}
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    hard, soft, em = [], [], []
    extra: dict[str, float] = {}
    weight = 0
    for s in range(0, len(qa), batch_size):
        sub = qa.subset(torch.arange(s, min(s + batch_size, len(qa))))
        ids = sub.ids.to(device)
        mask = (torch.arange(ids.shape[1], device=device)[None] < sub.total_len.to(device)[:, None]).long()
        logits = model(input_ids=ids, attention_mask=mask).logits.float()  # (B, T, V)
        pl = sub.prompt_len.to(device)
        rows = torch.arange(ids.shape[0], device=device)
        first = logits[rows, pl - 1]  # (B, V): predicts the first answer token
        target = ids[rows, pl]
        if stats is not None:
            n = int(mask.sum())
            for k, v in stats(mask.bool()).items():
                extra[k] = extra.get(k, 0.0) + v * n
            weight += n
        if method is not None:
            answer = torch.zeros_like(mask, dtype=torch.bool)
            answer[rows, pl - 1] = True
            for k, v in method.position_values(model, answer).items():
                at_answer.setdefault(k, []).append(v.detach().cpu())
        hard.append((first.argmax(-1) == target).cpu())
        soft.append(first.softmax(-1)[rows, target].cpu())
        if exact:
            pred = logits[:, :-1].argmax(-1) == ids[:, 1:]  # (B, T-1): position t predicts token t+1
            pos = torch.arange(1, ids.shape[1], device=device)[None]
            in_answer = (pos >= pl[:, None]) & (pos < sub.total_len.to(device)[:, None])
            em.append((pred | ~in_answer).all(-1).cpu())
    model.train(was_training)
    hard_t, soft_t = torch.cat(hard).float(), torch.cat(soft)
    out = {"acc": hard_t.mean().item(), "soft_acc": soft_t.mean().item()}
    em_t = torch.cat(em).float() if exact else None
    if exact:
        out["exact_match"] = em_t.mean().item()
    out |= {k: v / max(weight, 1) for k, v in extra.items()}
    for k, parts in at_answer.items():
        v = torch.cat(parts)
        if v.dtype == torch.bool:
            out[f"answer/{k}"] = v.float().mean().item()
        else:
            v = v.double()
            out[f"answer/{k}/mean"] = v.mean().item()
            qs = torch.quantile(v, torch.tensor(QUANTILES, dtype=torch.float64)).tolist()
            out |= {f"answer/{k}/q{round(100 * q):02d}": x for q, x in zip(QUANTILES, qs, strict=True)}
    for a, name in enumerate(qa.attributes):
        sel = qa.attribute == a
        if sel.any():
            out[f"acc/{name}"] = hard_t[sel].mean().item()
            if exact:
                out[f"exact_match/{name}"] = em_t[sel].mean().item()
    return out
