"""LoRA baseline through `peft` (never re-implemented): every attention and MLP matrix gets a low-rank update."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import ClassVar

from peft import LoraConfig, PeftModel, get_peft_model
from transformers import PretrainedConfig, PreTrainedModel

from ..base_models import arch_of
from ..errors import ScaleclError
from .base import Method, register


def lora_target_regex(config: PretrainedConfig) -> str:
    """Full-path regex of the targeted linears (peft full-matches a string target).

    A full path avoids any suffix ambiguity: GPT-NeoX "dense" is attention.dense only, never
    mlp.dense_h_to_4h / dense_4h_to_h, which are targeted by their own names.
    """
    arch = arch_of(config)
    paths = [p for p in arch.linears if p.rsplit(".", 1)[-1] in arch.lora_targets]
    return rf"{re.escape(arch.layers)}\.\d+\.({'|'.join(map(re.escape, paths))})"


@register
@dataclass
class LoRA(Method):
    """rank r, alpha (None = 2r, scale alpha/r = 2), dropout on the LoRA input (0 for exact tests)."""

    name: ClassVar[str] = "lora"
    rank: int = 8  # paper CPT: 256
    alpha: float | None = None
    dropout: float = 0.0

    def check(self, config: PretrainedConfig) -> None:
        arch_of(config)
        if not isinstance(self.rank, int) or self.rank <= 0:
            raise ScaleclError(f"lora rank must be a positive integer, got {self.rank}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ScaleclError(f"lora dropout must lie in [0, 1), got {self.dropout}")

    def apply(self, model: PreTrainedModel, init_weights: bool = True) -> PeftModel:
        self.check(model.config)
        base_config = model.config.to_dict()
        cfg = LoraConfig(
            r=self.rank, lora_alpha=self.alpha if self.alpha is not None else 2 * self.rank,
            lora_dropout=self.dropout, target_modules=lora_target_regex(model.config), bias="none",
            init_lora_weights=init_weights,  # B = 0 so the adapted model starts at the base function
        )
        with warnings.catch_warnings():  # peft calls a transformers API deprecated in 5.x
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            peft_model = get_peft_model(model, cfg)  # freezes every base parameter
        peft_model.scalecl_base_config = base_config  # load rebuilds the plain base, then re-applies LoRA
        return peft_model

    def describe(self) -> str:
        alpha = self.alpha if self.alpha is not None else 2 * self.rank
        return (f"LoRA (peft): rank {self.rank}, alpha {alpha:g}, dropout {self.dropout:g} on every attention "
                f"and MLP matrix; base weights frozen")


def merge_lora(model: PeftModel) -> PreTrainedModel:
    """Fold the low-rank updates into the base weights: a plain transformers model for eval or export."""
    return model.merge_and_unload()
