"""A method's model averaged with the frozen base it started from: the ensemble controls of SCALE-Route.

SCALE-Route's averaged branch (Eq. 5, every token when tau = -1) outputs (Z_preserve + Z_adapt)/2 + Z_preserve_up,
where Z_preserve, the original channels' logits of the preserve path, are the frozen base model's logits
(Theorem 3.1). Whether what keeps old knowledge is the width or this average with the frozen model is a
question any method can answer: `BaseAverage` gives a trained model M the logits

    Z = (1 - w) Z_M + w Z_base        (w = base_weight, 0.5 as Route's average)

either in training and evaluation (`mode="train"`: M is trained through the average, as Route's adapt path
is) or in evaluation only (`mode="eval"`: M trains exactly as without it, and is averaged with its base when
scored, an ensemble in logit space in the spirit of WiSE-FT). The base never trains; its forward carries no
gradient. A checkpoint of such a model is the checkpoint of M alone (`saved_module`); the experiment that made
it records the average and the base it averages with.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.modeling_outputs import CausalLMOutputWithPast

MODES = ("none", "train", "eval")


class BaseAverage(nn.Module):
    """The logits of `model` averaged with those of the frozen `base` (see the module docstring)."""

    def __init__(self, model: nn.Module, base: nn.Module, mode: str, base_weight: float = 0.5) -> None:
        super().__init__()
        if mode not in ("train", "eval"):
            raise ValueError(f"BaseAverage mode must be 'train' or 'eval', got {mode!r}")
        self.model, self.base = model, base
        self.mode, self.base_weight = mode, float(base_weight)
        for p in base.parameters():
            p.requires_grad_(False)
        base.eval()

    @property
    def config(self):
        return self.model.config

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def train(self, mode: bool = True) -> BaseAverage:
        """Train mode reaches the trained model only: the base always runs as in evaluation."""
        self.training = mode
        self.model.train(mode)
        self.base.eval()
        return self

    def averaging(self) -> bool:
        """Whether this forward averages: always in mode "train", outside training in mode "eval"."""
        return self.mode == "train" or not self.training

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **kw: Any) -> CausalLMOutputWithPast:
        if not self.averaging():  # mode "eval" in training: the model's own forward, its own loss
            return self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kw)
        z = self.model(input_ids=input_ids, attention_mask=attention_mask, **kw).logits  # (B, T', V)
        with torch.no_grad():
            zb = self.base(input_ids=input_ids, attention_mask=attention_mask, **kw).logits  # (B, T', V)
        w = self.base_weight
        logits = (1 - w) * z + w * zb.to(z.dtype)
        loss = None if labels is None else ForCausalLMLoss(logits, labels, logits.shape[-1])
        return CausalLMOutputWithPast(loss=loss, logits=logits)


def saved_module(model: nn.Module) -> nn.Module:
    """What a checkpoint of `model` holds: the trained model of a BaseAverage, else the model itself."""
    return model.model if isinstance(model, BaseAverage) else model
