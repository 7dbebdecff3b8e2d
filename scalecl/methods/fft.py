"""Full fine-tuning: every parameter trains (the paper's FFT baseline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from scalecl.methods.base import Method, register

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@register
@dataclass
class FFT(Method):
    name: ClassVar[str] = "fft"

    def apply(self, model: PreTrainedModel, init_weights: bool = True) -> PreTrainedModel:
        for p in model.parameters():
            p.requires_grad_(True)
        return model

    def describe(self) -> str:
        return "FFT: every parameter trains"
