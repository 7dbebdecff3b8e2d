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

    def subset(self, idx: np.ndarray | torch.Tensor, whole_width: bool = False) -> QATensors:
        """The rows `idx`, cut to their longest row (`whole_width`: kept at the set's width, one shape for every
        subset, as a compiled model wants)."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        t = self.ids.shape[1] if whole_width else int(self.total_len[idx].max()) if len(idx) else 1
        return QATensors(self.ids[idx, :t], self.prompt_len[idx], self.total_len[idx], self.attribute[idx],
                         self.attributes, self.pad_id)


def encode_qa(
    tokenizer, prompts: Sequence[str], answers: Sequence[str], attribute: Sequence[int], attributes: Sequence[str]
) -> QATensors:
    """Tokenise prompts and answers separately (answer + EOS) so the answer boundary is exact.

    Batched through the tokenizer's Rust backend where it has one (`encode_plain`), each distinct answer once
    (answers repeat: shared values), and the rows filled by numpy: the same ids as tokenising every string by
    itself, in seconds for the paper's 1.2M pairs.
    """
    from scalecl.data.tokenizer import encode_plain

    p_ids = encode_plain(tokenizer, prompts)
    distinct = list(dict.fromkeys(answers))
    by_answer = dict(zip(distinct, encode_plain(tokenizer, distinct), strict=True))
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    a_ids = [by_answer[a] for a in answers]
    p_len = np.fromiter(map(len, p_ids), dtype=np.int64, count=len(p_ids))
    a_len = np.fromiter(map(len, a_ids), dtype=np.int64, count=len(a_ids)) + 1  # + EOS
    total = p_len + a_len
    n, t = len(p_ids), int(total.max()) if len(p_ids) else 1
    ids = np.full((n, t), pad, dtype=np.int64)
    flat = np.fromiter((i for p, a in zip(p_ids, a_ids, strict=True) for i in (*p, *a, eos)), dtype=np.int64,
                       count=int(total.sum()))
    rows = np.repeat(np.arange(n), total)
    cols = np.arange(len(flat)) - np.repeat(np.cumsum(total) - total, total)
    ids[rows, cols] = flat  # (N, T): row i holds prompt + answer + EOS, then padding
    return QATensors(
        torch.from_numpy(ids), torch.from_numpy(p_len), torch.from_numpy(total),
        torch.as_tensor(np.asarray(attribute), dtype=torch.long), tuple(attributes), pad,
    )


def qa_train_batch(qa: QATensors, idx: torch.Tensor, whole_width: bool = False) -> dict[str, torch.Tensor]:
    """Inputs with the loss on answer + EOS only (-100 on prompt and padding); `whole_width`: at the set's width
    (QATensors.subset)."""
    sub = qa.subset(idx, whole_width)
    pos = torch.arange(sub.ids.shape[1])
    answer = (pos[None] >= sub.prompt_len[:, None]) & (pos[None] < sub.total_len[:, None])
    mask = pos[None] < sub.total_len[:, None]
    labels = torch.where(answer, sub.ids, torch.full_like(sub.ids, -100))
    return {"input_ids": sub.ids, "attention_mask": mask.long(), "labels": labels}


def qa_batches(qa: QATensors, batch_size: int, seed: int, whole_width: bool = False
               ) -> Iterator[dict[str, torch.Tensor]]:
    """Endless shuffled epochs of QA training batches, each cut to its longest row, or with `whole_width` all of
    the set's width: one shape, so that a compiled model (CUDA graphs above all) is not compiled again per width.
    The rows, their order and their labels are the same either way; the extra positions are padding, masked and
    unlabelled."""
    g = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(qa), generator=g)
        for i in range(0, len(order) - batch_size + 1 if len(order) >= batch_size else 1, batch_size):
            yield qa_train_batch(qa, order[i : i + batch_size], whole_width)


QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def value_summary(key: str, v: torch.Tensor) -> dict[str, float]:
    """`<key>/mean` and `<key>/q05` ... `<key>/q95` (QUANTILES) of a 1-D tensor of per-position values."""
    v = v.double()
    qs = torch.quantile(v, torch.tensor(QUANTILES, dtype=torch.float64)).tolist()
    return {f"{key}/mean": v.mean().item()} | {f"{key}/q{round(100 * q):02d}": x
                                               for q, x in zip(QUANTILES, qs, strict=True)}


@dataclass
class _EvalBatch:
    """Rows of one evaluation forward: `ids` cut to the rows' common length (no padding)."""

    rows: torch.Tensor  # (B,) indices into the QATensors
    ids: torch.Tensor  # (B, T)
    prompt_len: torch.Tensor  # (B,)
    total_len: torch.Tensor  # (B,)
    target: torch.Tensor  # (B,) the first answer token (beyond a prompt-only `ids`)


def eval_batches(qa: QATensors, batch_size: int, whole: bool, width: int = 0) -> list[_EvalBatch]:
    """The evaluation forwards of a QA set, built once per set and batch size and kept on it.

    Rows are grouped by length, so no forward computes padding: by prompt length, inputs cut to the prompt
    (`whole=False`: the scored position, the prompt's last token, is causal and sees nothing after it), or by
    prompt + answer + EOS length (`whole=True`: every real token, for per-token metrics and exact match).
    width > 0 (fixed shapes, `fixed_width`): rows in the set's order, each right-padded to `width` tokens (a
    compiled model then sees one shape: scalecl.evaluation.qa._device_batch pads the rows too).
    """
    key = (batch_size, whole, width)
    cache = qa.__dict__.setdefault("_eval_batches", {})
    if key not in cache:
        out = []
        if width:
            ids = torch.full((len(qa), width), qa.pad_id, dtype=qa.ids.dtype)
            ids[:, : qa.ids.shape[1]] = qa.ids  # (N, width)
            for s in range(0, len(qa), batch_size):
                r = torch.arange(s, min(s + batch_size, len(qa)))
                out.append(_EvalBatch(r, ids[r], qa.prompt_len[r], qa.total_len[r], qa.ids[r, qa.prompt_len[r]]))
            cache[key] = out
            return out
        length = qa.total_len if whole else qa.prompt_len
        for t in torch.unique(length).tolist():
            rows = torch.nonzero(length == t).flatten()
            for s in range(0, len(rows), batch_size):
                r = rows[s : s + batch_size]
                target = qa.ids[r, qa.prompt_len[r]]
                out.append(_EvalBatch(r, qa.ids[r, :t].contiguous(), qa.prompt_len[r], qa.total_len[r], target))
        cache[key] = out
    return cache[key]


FIXED_MULTIPLE = 16  # fixed-shape evaluation pads every QA set to a multiple of this many tokens


def fixed_width(qa: QATensors) -> int:
    """The width every fixed-shape evaluation batch of `qa` is padded to: its longest sequence rounded up to a
    multiple of FIXED_MULTIPLE, so that QA sets of one tokenizer mostly share one shape."""
    return -(-qa.ids.shape[1] // FIXED_MULTIPLE) * FIXED_MULTIPLE


def _device_batch(b: _EvalBatch, device: torch.device, whole: bool, rows: int) -> tuple:
    """(ids, mask, prompt lengths, total lengths, targets) of one forward on the device. rows > 0 (fixed shapes):
    right-padded to `rows` rows with copies of the first (their results are dropped), and the mask marks the
    real tokens (whole) or the prompt (else); otherwise every token of a length group is real."""
    ids, pl, total, target = (t.to(device) for t in (b.ids, b.prompt_len, b.total_len, b.target))
    if not rows:
        return ids, torch.ones_like(ids), pl, total, target
    extra = rows - ids.shape[0]
    if extra > 0:
        ids, pl, total, target = (torch.cat([t, t[:1].expand(extra, *t.shape[1:])]) for t in (ids, pl, total, target))
    end = total if whole else pl
    mask = (torch.arange(ids.shape[1], device=device)[None] < end[:, None]).long()  # (rows, width)
    return ids, mask, pl, total, target


def _routed(model: nn.Module) -> bool:
    """Whether the model's head routes between two paths (SCALE-Route): it needs the hidden state of every
    position of the forward, so its head cannot be cut to the scored positions."""
    return getattr(getattr(model, "scale_state", None), "mode", None) == "route"


def _per_token_metrics(stats, method) -> bool:
    """Whether numbers over every real token may be asked for (a stats callable, or a method that overrides
    `metrics`): then the first forward reads every token, and the rest do only if it returned any."""
    if stats is not None:
        return True
    if method is None:
        return False
    from scalecl.methods.base import Method

    return type(method).metrics is not Method.metrics


def qa_accuracy(
    model: nn.Module, qa: QATensors, batch_size: int = 256, exact: bool = False,
    stats: Callable[[torch.Tensor], dict[str, float]] | None = None, method=None, fast: bool | str = True,
    progress: Callable[[int], None] | None = None,
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

    fast (default): rows grouped by length without padding (`eval_batches`), inputs cut to the prompt unless
    every token is needed (exact match, per-token metrics), and the head applied at the scored position only
    (`logits_to_keep`; SCALE-Route's routed head runs on every position, since its routing metrics do), under
    inference_mode. The numbers are those of fast=False, the plain computation (batches in order, padded,
    logits at every position): counts (accuracy, exact match) equal, float numbers to float32 rounding (an
    unpadded batch runs SDPA's causal kernel, a padded one the masked kernel; tests/evaluation/test_qa_fast.py). Quantiles and means do not depend on the row order:
    per-row values are put back in the QA set's order before they are summarised.

    progress(n) is called after every forward with the number of questions it scored (every question is
    counted once; scalecl.training.progress.eval_progress makes one); it reads nothing back and changes no number.

    fast="fixed" (the fast path as it runs where the model is compiled, scalecl.compute.perf.compiled): every
    forward has one shape, `batch_size` rows of `fixed_width(qa)` tokens, right-padded (mask) where a row is shorter and
    filled with copies of a row that is dropped where the set has fewer rows, so that a compiled model is not
    compiled again for every length. The numbers are those of the unpadded path: counts equal, floats to
    float32 rounding (the masked SDPA kernel; tests/evaluation/test_qa_fast.py).
    """
    if method is not None and stats is None:
        stats = lambda mask: method.metrics(model, mask)  # noqa: E731
    was_training = model.training
    model.eval()
    from scalecl.compute.parallel import is_fsdp
    from scalecl.compute.perf import compiled

    # inference_mode, except under FSDP: its gathered parameters are made in the first forward and reused by
    # training, which may not update a tensor made in inference mode
    try:
        with torch.no_grad() if is_fsdp(model) else torch.inference_mode():
            fixed = fast == "fixed" or compiled(model)
            rows = _rows_fast(model, qa, (batch_size, fixed), exact, stats, method, progress) if fast else \
                _rows_plain(model, qa, batch_size, exact, stats, method, progress)
    finally:
        model.train(was_training)
    return _summarise(qa, exact, *rows)


def _score_batch(model, ids, mask, pl, total, target, exact, keep_head_at_scored: bool):
    """One forward: (hard (B,), soft (B,), exact match (B,) or None, the mask of real tokens)."""
    device = ids.device
    rows = torch.arange(ids.shape[0], device=device)
    if keep_head_at_scored:  # transformers' CausalLMs apply the head at these positions only
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=(pl - 1)[:, None],
                       use_cache=False).logits.float()  # no KV cache: nothing follows an evaluation forward
    else:
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()  # (B, T, V)
    if keep_head_at_scored and logits.shape[1] == 1:
        first = logits[:, 0]  # (B, V)
    else:  # every position (a model that ignores logits_to_keep gives them all)
        first = logits[rows, pl - 1]  # (B, V): predicts the first answer token
    hard = first.argmax(-1) == target
    soft = first.softmax(-1)[rows, target]
    em = None
    if exact:
        pred = logits[:, :-1].argmax(-1) == ids[:, 1:]  # (B, T-1): position t predicts token t+1
        pos = torch.arange(1, ids.shape[1], device=device)[None]
        in_answer = (pos >= pl[:, None]) & (pos < total[:, None])
        em = (pred | ~in_answer).all(-1)
    return hard, soft, em


class _Collect:
    """Per-row results and per-token/per-position metrics, gathered over the batches."""

    def __init__(self, n: int) -> None:
        self.hard = torch.zeros(n, dtype=torch.bool)
        self.soft = torch.zeros(n)
        self.em = torch.zeros(n, dtype=torch.bool)
        self.extra: dict[str, float] = {}
        self.weight = 0
        self.at_answer: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def add(self, who: tuple, idx, ids, mask, pl, scored: tuple) -> bool:
        """Store one batch (`who`: model, method, stats; `scored`: hard, soft, exact match); returns whether
        `stats` gave any number (per-token metrics exist)."""
        model, method, stats = who
        real = len(idx)  # rows beyond it fill a fixed shape: dropped
        hard, soft, em = scored
        self.hard[idx], self.soft[idx] = hard[:real].cpu(), soft[:real].cpu()
        if em is not None:
            self.em[idx] = em[:real].cpu()
        got = False
        if stats is not None:
            n = int(mask.sum())
            for k, v in stats(mask.bool()).items():
                self.extra[k] = self.extra.get(k, 0.0) + v * n
                got = True
            self.weight += n
        if method is not None:
            rows = torch.arange(real, device=ids.device)
            answer = torch.zeros_like(mask, dtype=torch.bool)
            answer[rows, pl[:real] - 1] = True
            for k, v in method.position_values(model, answer).items():
                self.at_answer.setdefault(k, []).append((idx, v.detach().cpu()))
        return got


def _rows_plain(model, qa, batch_size, exact, stats, method, progress) -> tuple:
    """The plain computation: batches in the set's order, right-padded, logits at every position."""
    device = next(model.parameters()).device
    c = _Collect(len(qa))
    for s in range(0, len(qa), batch_size):
        idx = torch.arange(s, min(s + batch_size, len(qa)))
        sub = qa.subset(idx)
        ids = sub.ids.to(device)
        mask = (torch.arange(ids.shape[1], device=device)[None] < sub.total_len.to(device)[:, None]).long()
        pl, total = sub.prompt_len.to(device), sub.total_len.to(device)
        target = ids[torch.arange(len(idx), device=device), pl]
        hard, soft, em = _score_batch(model, ids, mask, pl, total, target, exact, keep_head_at_scored=False)
        c.add((model, method, stats), idx, ids, mask, pl, (hard, soft, em))
        if progress is not None:
            progress(len(idx))
    return c, stats is not None


def _rows_fast(model, qa, batching: tuple[int, bool], exact, stats, method, progress) -> tuple:
    """The fast computation (see qa_accuracy): grouped by length, prompt-only where it can, head at the scored
    position where it can; `batching` is (batch size, fixed shapes)."""
    batch_size, fixed = batching
    device = next(model.parameters()).device
    c = _Collect(len(qa))
    whole = exact or _per_token_metrics(stats, method)
    cut_head = not exact and not _routed(model)
    per_token = stats is not None
    width, rows = (fixed_width(qa), batch_size) if fixed else (0, 0)
    plan = eval_batches(qa, batch_size, whole, width)
    i = 0
    while i < len(plan):
        b = plan[i]
        ids, mask, pl, total, target = _device_batch(b, device, whole, rows)
        hard, soft, em = _score_batch(model, ids, mask, pl, total, target, exact, keep_head_at_scored=cut_head)
        n = len(b.rows)
        if n < ids.shape[0]:  # rows added for the fixed shape: counted nowhere
            mask = mask.clone()
            mask[n:] = 0
        got = c.add((model, method, stats if per_token else None), b.rows, ids, mask, pl, (hard, soft, em))
        if progress is not None:
            progress(n)  # a re-planned rest leaves these rows out: each question counts once
        i += 1
        if whole and not exact and i == 1 and not got and len(plan) > 1:
            # the first forward over every token gave no per-token number: the rest need only the prompts
            done = set(b.rows.tolist())
            plan = [p for p in eval_batches(qa, batch_size, False, width)]
            plan = [_without(p, done) for p in plan]
            plan = [p for p in plan if len(p.rows)]
            per_token, whole, i = False, False, 0
    return c, per_token


def _without(b: _EvalBatch, done: set[int]) -> _EvalBatch:
    keep = torch.tensor([r not in done for r in b.rows.tolist()], dtype=torch.bool)
    if bool(keep.all()):
        return b
    return _EvalBatch(b.rows[keep], b.ids[keep], b.prompt_len[keep], b.total_len[keep], b.target[keep])


def _summarise(qa: QATensors, exact: bool, c: _Collect, per_token: bool) -> dict[str, float]:
    """The recorded numbers from the per-row results (in the set's order) and the per-token sums."""
    hard_t, soft_t = c.hard.float(), c.soft
    out = {"acc": hard_t.mean().item(), "soft_acc": soft_t.mean().item()}
    em_t = c.em.float() if exact else None
    if exact:
        out["exact_match"] = em_t.mean().item()
    if per_token:
        out |= {k: v / max(c.weight, 1) for k, v in c.extra.items()}
    for k, parts in c.at_answer.items():
        order = torch.cat([idx for idx, _ in parts]).argsort()
        v = torch.cat([x for _, x in parts])[order]  # back in the set's order
        if v.dtype == torch.bool:
            out[f"answer/{k}"] = v.float().mean().item()
        else:
            out |= value_summary(f"answer/{k}", v)
    for a, name in enumerate(qa.attributes):
        sel = qa.attribute == a
        if sel.any():
            out[f"acc/{name}"] = hard_t[sel].mean().item()
            if exact:
                out[f"exact_match/{name}"] = em_t[sel].mean().item()
    return out
