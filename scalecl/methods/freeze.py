"""Freeze baseline (Zheng et al. 2025): the input embedding and the bottom k decoder blocks stay frozen.

With tied embeddings (Llama-3.2-1B) the output head is the same tensor as the input embedding, so it is
frozen too: freezing the embedding is the method's definition, and untying would change the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from scalecl.common.errors import ScaleclError
from scalecl.common.schema import MAX_SIZE, show_bound, show_value
from scalecl.methods.base import Method, register

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel


@register
@dataclass
class Freeze(Method):
    """Low layers hold general knowledge: keep them (and the embedding) fixed, train the rest fully."""

    name: ClassVar[str] = "freeze"
    delta: ClassVar[bool] = True  # frozen tensors stay the base's: a delta checkpoint stores the rest
    k: int = 3  # paper CPT on Llama-3.2-1B

    def __post_init__(self) -> None:
        """The check that needs no model (k against the layers: check)."""
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 0 <= self.k <= MAX_SIZE:
            raise ScaleclError(f"freeze k must be an integer in 0..{show_bound(MAX_SIZE)}, the largest model size "
                               f"the suite accepts; got {show_value(self.k)}")

    def check(self, config: PretrainedConfig) -> None:
        from scalecl.models.build import arch_of

        arch_of(config)
        n_layers = config.num_hidden_layers
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 0 <= self.k <= n_layers:
            raise ScaleclError(f"freeze k must lie in 0..{n_layers} (the model's layers), got {self.k}")

    def apply(self, model: PreTrainedModel, init_weights: bool = True) -> PreTrainedModel:
        from scalecl.models.build import arch_of, decoder_layers

        self.check(model.config)
        for p in model.parameters():
            p.requires_grad_(True)
        frozen = [model.get_submodule(arch_of(model.config).embed), *decoder_layers(model)[: self.k]]
        for module in frozen:
            for p in module.parameters():
                p.requires_grad_(False)
        return model

    def describe(self) -> str:
        return (f"Freeze: input embedding (and a head tied to it) and the bottom {self.k} blocks frozen; "
                f"the other blocks, final norm and an untied head train")
