"""The biography experiment's data (paper Sec. 5.1; spec biography.md): the people of a data preset, the
tokenizer (a word-level one trained on them and cached, or a real one), the tokenised QA sets of Task 0 and
Task 1, the stage-1 model's config with the tokenizer's rows, the vocabulary rows no stage trains as a target,
and the chance floor of each attribute. scalecl.experiments.bio prepares them once per sweep
(BioExperiment.prepare); the generator, the texts and the tokenizer themselves live in scalecl.data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalecl.common.errors import ScaleclError
from scalecl.common.schema import config_hash
from scalecl.data.biography import ATTRIBUTES, BioConfig, People, generate_people, preset, qa_pairs, ranges
from scalecl.data.tokenizer import cached_bio_tokenizer, first_answer_tokens, open_tokenizer
from scalecl.evaluation.qa import QATensors, encode_qa
from scalecl.experiments.config import BioRunConfig
from scalecl.models.build import shape_config

# Version of the pre-training text format (leading space); part of the tokenizer and stage-1 cache keys, so
# caches written by an older format are never reused.
TEXT_FORMAT = 2
# what to use instead of a --tokenizer that cannot be loaded
LOCAL_HINT = "; offline, use --tokenizer local (a word-level tokenizer trained on the generated corpus)"


@dataclass
class BioData:
    """A sweep's prepared data: the data preset's config, its people, the tokenizer (and where it came from) and
    the tokenised QA sets."""

    cfg: BioConfig
    people: People
    tokenizer: Any
    tokenizer_dir: str | None
    qa: dict[str, QATensors]  # task0_train, task0_heldout, task1


def bio_config(rc: BioRunConfig) -> BioConfig:
    """The data preset with the config's overrides and base seed, or one error naming the bad value."""
    try:
        return preset(rc.data, seed=rc.seed, **rc.data_overrides)
    except (ValueError, TypeError) as e:
        raise ScaleclError(f"biography data: {e}") from None


def prepare_data(rc: BioRunConfig, cache: Path, tokenizer=None, *, rebuild: bool = False) -> BioData:
    """People, tokenizer (trained locally and cached unless one is given) and tokenised QA sets; `rebuild`
    (--force): a damaged cached tokenizer is set aside and trained again."""
    cfg = bio_config(rc)
    people = generate_people(cfg)
    if rc.tokenizer == "local":
        tok_dir = cache / f"tokenizer-{config_hash(asdict(cfg), TEXT_FORMAT)}"
        tokenizer = cached_bio_tokenizer(people, tok_dir, rebuild=rebuild,
                                         check=lambda tok: vocab_rows(rc, len(tok)))  # before the cache is written
        tok_src = str(tok_dir)
    else:
        tokenizer = tokenizer or open_tokenizer(rc.tokenizer, LOCAL_HINT)
        tok_src = rc.tokenizer
    vocab_rows(rc, len(tokenizer))
    r = ranges(cfg)
    qa = {}
    for name, (a, b) in (("task0_train", r.task0_train), ("task0_heldout", r.task0_heldout), ("task1", r.task1)):
        pairs = qa_pairs(people, a, b)
        probe = pairs.select(np.arange(min(len(pairs), 6_000)))  # a sample: the full check costs ~100 s at paper scale
        first_answer_tokens(tokenizer, probe.prompts, probe.answers)  # the metric's token must be well defined
        qa[name] = encode_qa(tokenizer, pairs.prompts, pairs.answers, pairs.attributes, ATTRIBUTES)
    return BioData(cfg, people, tokenizer, tok_src, qa)


def vocab_rows(rc: BioRunConfig, n_tokens: int) -> int:
    """Rows of the embedding and head: the tokenizer's size, or model.vocab when it pads beyond it."""
    if rc.model.vocab and rc.model.vocab < n_tokens:
        raise ScaleclError(f"model.vocab={rc.model.vocab} is smaller than the tokenizer's {n_tokens} tokens")
    return rc.model.vocab or n_tokens


def base_model_config(rc: BioRunConfig, tokenizer=None):
    """The stage-1 model's config (with a placeholder vocabulary when no tokenizer is given: sizes only)."""
    if tokenizer is None:
        return shape_config(rc.model, max(rc.model.vocab, 8))
    return shape_config(rc.model, vocab_rows(rc, len(tokenizer)), eos_token_id=tokenizer.eos_token_id,
                        bos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)


def never_target_rows(docs: list[list[int]], qa_sets, rows: int, eos: int) -> torch.Tensor:
    """(rows,) bool: the vocabulary rows no stage ever trains as a target, i.e. tokens that appear in no
    pre-training biography, in no QA answer and are not EOS (model.vocab padding rows, unused tokens)."""
    seen = np.zeros(rows, dtype=bool)
    seen[np.concatenate([np.asarray(d, dtype=np.int64) for d in docs] + [np.asarray([eos])])] = True
    for qa in qa_sets:
        pos = torch.arange(qa.ids.shape[1])[None]
        answer = (pos >= qa.prompt_len[:, None]) & (pos < qa.total_len[:, None])  # answer tokens and EOS
        seen[qa.ids[answer].numpy()] = True
    return torch.from_numpy(~seen)


def attribute_priors(qa: QATensors) -> dict[str, float]:
    """Chance floor per attribute: accuracy of always answering the most common first token."""
    first = qa.ids[torch.arange(len(qa)), qa.prompt_len]
    out = {}
    for a, name in enumerate(qa.attributes):
        vals = first[qa.attribute == a]
        if len(vals):
            out[name] = vals.bincount().max().item() / len(vals)
    out["pooled"] = sum(out[n] * (qa.attribute == a).sum().item() for a, n in enumerate(qa.attributes)
                        if n in out) / len(qa)
    return out


def qa_slice(qa: QATensors, people: int) -> QATensors:
    """The QA pairs of the first `people` people of a set (every attribute of each)."""
    return qa.subset(torch.arange(min(len(qa), people * len(ATTRIBUTES))))
