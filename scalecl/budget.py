"""Trainable-parameter budgets of every method at the paper's settings, counted on meta-device models.

Meta tensors carry shapes only, so the 1B model is "built" in milliseconds and without memory; methods are
applied with init_weights=False (SCALE's SVD initialisation cannot run on meta tensors).

It sits above the methods and the experiment configs (it reads the bio paper preset), not in methods/.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import torch
from transformers import AutoModelForCausalLM, GPTNeoXConfig, LlamaConfig, PretrainedConfig

from .base_models import shape_config
from .config import load_preset
from .methods import count_parameters, get_method


def pythia_160m_config() -> GPTNeoXConfig:
    """EleutherAI/pythia-160m (spec/evaluation.md), without downloading it."""
    return GPTNeoXConfig(
        vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        rotary_pct=0.25, rotary_emb_base=10000, max_position_embeddings=2048, use_parallel_residual=True,
        tie_word_embeddings=False,
    )


def llama_32_1b_config() -> LlamaConfig:
    """meta-llama/Llama-3.2-1B (spec/evaluation.md), without downloading it."""
    return LlamaConfig(
        vocab_size=128256, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        head_dim=64, intermediate_size=8192, tie_word_embeddings=True, rope_theta=5e5,
        max_position_embeddings=131072, rms_norm_eps=1e-5,
    )


def biography_paper_config() -> GPTNeoXConfig:
    """The `bio` paper preset's model as it runs: Pythia-160M's shape with the rows its vocabulary has in force
    (model.vocab = 50,304: the Pythia tokenizer, padded as Pythia pads it). The embedding and head columns that
    SCALE adds scale with those rows, so a budget counted with another vocabulary would not be this run's."""
    rc = load_preset("bio", "paper")
    if not rc.model.vocab:
        raise ValueError("the bio paper preset must fix model.vocab for its budget to be known without a tokenizer")
    return shape_config(rc.model, rc.model.vocab)


def _biography_methods() -> list[tuple[str, dict[str, Any]]]:
    """The methods the paper ran on the biography task, with the bio paper preset's options."""
    rc = load_preset("bio", "paper")
    return [("fft", {})] + [(m, rc.method_options(m)) for m in ("llama-pro", "scale-preserve", "scale-adapt",
                                                                "scale-route")]


class BudgetRow(NamedTuple):
    setting: str
    method: str
    trainable: int
    total: int
    options: dict[str, Any]
    vocab: int = 0  # rows of the embedding and head in force


def trainable_counts(config: PretrainedConfig, method_name: str, **opts: Any) -> tuple[int, int]:
    """(trainable, total) parameters of `method_name` with `opts` applied to a model of `config`."""
    method = get_method(method_name, **opts)
    method.check(config)
    config = copy.deepcopy(config)  # structural methods edit the config in place
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model = method.apply(model, init_weights=False)
    return count_parameters(model, trainable_only=True), count_parameters(model)


# The paper's two settings (Sec. 5; spec/method.md sections 3-4). SCALE's collab is left at its default. The
# biography setting is read from the bio paper preset (its vocabulary and options are the ones that run).
PAPER_SETTINGS: dict[str, tuple[Any, Any]] = {
    "biography / Pythia-160M": (biography_paper_config, _biography_methods),
    "Korean CPT / Llama-3.2-1B": (llama_32_1b_config, lambda: [
        ("fft", {}),
        ("lora", {"rank": 256}),
        ("freeze", {"k": 3}),
        ("llama-pro", {"n": 4}),  # 16 -> 20 layers
        ("scale-preserve", {"hidden_up": 256, "ffn_up": 1024}),
        ("scale-adapt", {"hidden_up": 256, "ffn_up": 1024, "l_fp": 3}),
        ("scale-route", {"hidden_up": 256, "ffn_up": 1024, "l_fp": 3}),
    ]),
}


def paper_budgets() -> list[BudgetRow]:
    """One row per (setting, method) so a reader can check that the budgets are comparable."""
    rows = []
    for setting, (make_config, methods) in PAPER_SETTINGS.items():
        config = make_config()
        for name, opts in methods():
            trainable, total = trainable_counts(config, name, **opts)
            rows.append(BudgetRow(setting, name, trainable, total, opts, config.vocab_size))
    return rows
