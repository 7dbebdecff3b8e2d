"""LoRA baseline through `peft` (never re-implemented): every attention and MLP matrix gets a low-rank update."""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from scalecl.common.errors import ScaleclError
from scalecl.common.schema import MAX_SIZE, show_bound, show_value
from scalecl.methods.base import Method, register

if TYPE_CHECKING:  # peft and the model code load where a model is changed: importing a method loads no torch
    from peft import PeftModel
    from transformers import PretrainedConfig, PreTrainedModel


def lora_target_regex(config: PretrainedConfig) -> str:
    """Full-path regex of the targeted linears (peft full-matches a string target).

    A full path avoids any suffix ambiguity: GPT-NeoX "dense" is attention.dense only, never
    mlp.dense_h_to_4h / dense_4h_to_h, which are targeted by their own names.
    """
    from scalecl.models.build import arch_of

    arch = arch_of(config)
    paths = [p for p in arch.linears if p.rsplit(".", 1)[-1] in arch.lora_targets]
    return rf"{re.escape(arch.layers)}\.\d+\.({'|'.join(map(re.escape, paths))})"


@register
@dataclass
class LoRA(Method):
    """rank r, alpha (None = 2r, scale alpha/r = 2), dropout on the LoRA input (0 for exact tests)."""

    name: ClassVar[str] = "lora"
    layout: ClassVar[str] = "lora"  # peft's adapter format (scalecl.training.layouts.LoraLayout)
    rank: int = 8  # paper CPT: 256
    alpha: float | None = None
    dropout: float = 0.0

    def __post_init__(self) -> None:
        """Checks that need no model (the rank against the layers: check)."""
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 1 <= self.rank <= MAX_SIZE:
            raise ScaleclError(f"lora rank must be an integer in 1..{show_bound(MAX_SIZE)}, the largest model size "
                               f"the suite accepts; got {show_value(self.rank)}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, int | float) or not 0.0 <= self.dropout < 1.0:
            raise ScaleclError(f"lora dropout must lie in [0, 1), got {show_value(self.dropout)}")
        if self.alpha is not None and (isinstance(self.alpha, bool) or not isinstance(self.alpha, int | float)
                                       or not math.isfinite(self.alpha)):
            raise ScaleclError(f"lora alpha must be a finite number or none, got {show_value(self.alpha)}")
        if self.alpha is not None and self.alpha <= 0:  # alpha/r scales the update: 0 trains nothing, < 0 flips it
            raise ScaleclError(f"lora alpha must be positive (the update is scaled by alpha/rank), got {self.alpha:g}")

    def check(self, config: PretrainedConfig) -> None:
        from scalecl.models.build import arch_of, head_dim, kv_heads

        arch_of(config)
        self.__post_init__()
        # the targeted matrices' smaller sides: hidden, FFN, and the key/value projections' heads x head_dim
        side = min(config.hidden_size, getattr(config, "intermediate_size", None) or config.hidden_size,
                   kv_heads(config) * head_dim(config))
        if self.rank > side:
            raise ScaleclError(f"lora rank={self.rank} exceeds {side}, the smaller side of this model's smallest "
                               f"targeted matrix: an update of that matrix has at most rank {side}")

    def apply(self, model: PreTrainedModel, init_weights: bool = True) -> PeftModel:
        from peft import LoraConfig, get_peft_model

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

    @classmethod
    def from_model(cls, model) -> LoRA | None:
        """A peft model's LoRA options (its adapter config), else None."""
        from peft import PeftModel

        if not isinstance(model, PeftModel):
            return None
        c = model.peft_config["default"]
        return cls.from_options(rank=c.r, alpha=c.lora_alpha, dropout=c.lora_dropout)

    def merge(self, model: PeftModel) -> PreTrainedModel:
        return merge_lora(model)


def merge_lora(model: PeftModel) -> PreTrainedModel:
    """Fold the low-rank updates into the base weights: a plain transformers model for eval or export."""
    return model.merge_and_unload()
