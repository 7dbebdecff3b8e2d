"""lm-evaluation-harness around a model in memory: lm-eval's HFLM wrapped so that it neither re-ties the head nor
swaps a tensor, checking before any forward that the tasks' requests fit the length; the length's default; the
train/eval flags restored afterwards."""

from __future__ import annotations

import functools
import logging
from contextlib import contextmanager
from typing import Any

from scalecl.common.errors import ScaleclError

DEFAULT_MAX_LENGTH_CAP = 2048


def default_max_length(model, cap: int = DEFAULT_MAX_LENGTH_CAP) -> int:
    """The model's position limit capped at `cap` (Llama-3.2-1B declares 131072: never use that blindly)."""
    config = model.config
    for attr in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return min(value, cap)
    return cap


def head_is_tied(model) -> bool:
    """Whether the output head uses the input embedding's weight tensor (and SCALE's weight_up, if any)."""
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if emb is None or head is None or emb.weight is not head.weight:
        return False
    up_e, up_h = getattr(emb, "weight_up", None), getattr(head, "weight_up", None)
    return up_e is up_h


@contextmanager
def _no_retie(model):
    """Make ``model.tie_weights()`` a no-op while lm-eval wraps the model.

    HFLM calls it on every model object it is given; with ``config.tie_word_embeddings`` true, transformers
    would point the head back at the embedding and a separately trained head would be lost. The model is
    evaluated exactly as it was loaded (``load_model`` already ties what the checkpoint shares).
    """
    had = "tie_weights" in vars(model)
    old = vars(model).get("tie_weights")
    object.__setattr__(model, "tie_weights", lambda *args, **kwargs: None)
    try:
        yield model
    finally:
        if had:
            object.__setattr__(model, "tie_weights", old)
        else:
            del model.__dict__["tie_weights"]


def _param_identity(model) -> list[tuple[str, int, int]]:
    return [(n, id(p), p.data_ptr()) for n, p in model.named_parameters(remove_duplicate=False)]


@functools.cache
def _checked_hflm() -> type:
    """lm-eval's HFLM, checking that the requests fit `max_length` before any forward.

    What lm-eval needs of max_length depends on the tasks, so no range of --max-length states it: it asserts
    deep inside (huggingface.py) that every scored continuation has at most max_length tokens (a choice's answer
    tokens: 1 passes the option's range, 2-token answers fail), and that a generation of max_gen_toks tokens
    leaves room for a prompt. Here both are one ScaleclError naming --max-length and the least it must be,
    before the first forward (lm-eval hands a request type's whole list over at once).
    """
    from lm_eval.models.huggingface import HFLM
    from lm_eval.models.utils import normalize_gen_kwargs

    class CheckedHFLM(HFLM):
        def _loglikelihood_tokens(self, requests, *args: Any, **kwargs: Any):
            longest = max((len(cont) for _, _, cont in requests), default=0)
            if longest > self.max_length:
                raise ScaleclError(f"--max-length {self.max_length} is shorter than an answer the tasks score "
                                   f"({longest} tokens); give at least {longest}")
            return super()._loglikelihood_tokens(requests, *args, **kwargs)

        def generate_until(self, requests, *args: Any, **kwargs: Any):
            gen = max((normalize_gen_kwargs(dict(r.args[1]), self.max_gen_toks)["max_gen_toks"] for r in requests),
                      default=0)
            if requests and gen >= self.max_length:
                raise ScaleclError(f"--max-length {self.max_length} leaves no room for a prompt: the tasks generate "
                                   f"up to {gen} tokens; give more than {gen}")
            return super().generate_until(requests, *args, **kwargs)

    return CheckedHFLM


def wrap_model(model, tokenizer, *, batch_size: int | str = 8, max_length: int | None = None):
    """lm-eval's HFLM around the in-memory model, without letting it re-tie the head, checking that the tasks'
    requests fit `max_length` (_checked_hflm).

    Parameter identity is checked before and after, so no tensor can have been swapped or re-tied.
    Returns (lm, max_length). The model must already be on the device to evaluate on (HFLM reads
    ``model.device`` for a model object).
    """
    HFLM = _checked_hflm()  # noqa: N806 (lm-eval's class, checked)

    max_length = int(max_length or default_max_length(model))
    before = _param_identity(model)
    hf_log = logging.getLogger("lm_eval.models.huggingface")
    level = hf_log.level
    hf_log.setLevel(logging.ERROR)  # its warnings about model objects ("arguments may be ignored") do not apply
    try:
        with _no_retie(model):
            lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)
    finally:
        hf_log.setLevel(level)
    if _param_identity(model) != before:
        raise ScaleclError("lm-eval changed the model's parameters while wrapping it (re-tied head?)")
    return lm, max_length


@contextmanager
def preserve_mode(model):
    """Restore every module's train/eval flag afterwards (HFLM puts the model in eval mode)."""
    flags = [(m, m.training) for m in model.modules()]
    try:
        yield model
    finally:
        for m, flag in flags:
            m.training = flag
