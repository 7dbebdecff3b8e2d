"""LLaMA Pro baseline (Wu et al. 2024): depth expansion with identity-initialised copies of blocks.

After every L/n original blocks a copy of the block just before is inserted, with its output projections
(weights and biases) zeroed so that it starts as the identity; only the new blocks train.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from scalecl.common.errors import ScaleclError
from scalecl.common.schema import MAX_SIZE, show_bound, show_value
from scalecl.methods.base import Method, register

if TYPE_CHECKING:  # loaded where a model is changed: importing a method loads no torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel


@register
@dataclass
class LlamaPro(Method):
    """New capacity in depth while the original blocks stay untouched (the paper's depth-expansion baseline)."""

    name: ClassVar[str] = "llama-pro"
    delta: ClassVar[bool] = True  # frozen tensors stay the base's: a delta checkpoint stores the rest
    n: int = 4  # paper: Pythia-160M 12 -> 16 layers, Llama-3.2-1B 16 -> 20

    def shape(self, layers: int, width: int, ffn: int) -> tuple[int, int, int, int]:
        """n more layers."""
        return layers + self.n, width, ffn, 1

    def __post_init__(self) -> None:
        """The check that needs no model (n against the layers: check)."""
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= MAX_SIZE:
            raise ScaleclError(f"llama-pro n must be an integer in 1..{show_bound(MAX_SIZE)}, the largest model size "
                               f"the suite accepts; got {show_value(self.n)}")

    def check(self, config: PretrainedConfig) -> None:
        from scalecl.models.build import arch_of

        arch_of(config)
        n_layers = config.num_hidden_layers
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n <= 0 or n_layers % self.n:
            raise ScaleclError(f"llama-pro n must be a positive divisor of the model's {n_layers} layers, got {self.n}")

    def apply(self, model: PreTrainedModel, init_weights: bool = True) -> PreTrainedModel:
        from torch import nn

        from scalecl.models.build import arch_of, decoder_layers, set_submodule

        self.check(model.config)
        if getattr(model, "scalecl_base_config", None) is not None:
            raise ScaleclError("llama-pro needs a plain base model; this one was already changed by a method")
        config, arch = model.config, arch_of(model.config)
        model.scalecl_base_config = config.to_dict()  # before any change: checkpoints rebuild from it
        for p in model.parameters():
            p.requires_grad_(False)
        old = decoder_layers(model)
        step = len(old) // self.n
        blocks: list[nn.Module] = []
        origin: list[int] = []  # original index each new position copies (for per-layer config lists)
        for i, layer in enumerate(old):
            blocks.append(layer)
            origin.append(i)
            if (i + 1) % step == 0:
                blocks.append(self._identity_copy(layer, arch.zero_out, init_weights))
                origin.append(i)
        set_submodule(model, arch.layers, nn.ModuleList(blocks))
        for idx, block in enumerate(blocks):  # KV-cache slots follow the new order
            block.get_submodule(arch.attn_module).layer_idx = idx
            if hasattr(block, "layer_idx"):  # Gemma 3's blocks keep their index too
                block.layer_idx = idx
        config.num_hidden_layers = len(blocks)  # the model loop runs only the first num_hidden_layers
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = [config.layer_types[i] for i in origin]
        return model

    @staticmethod
    def _identity_copy(layer: nn.Module, zero_out: tuple[str, ...], init_weights: bool) -> nn.Module:
        """A trainable copy whose output projections are zero, so the residual block is the identity."""
        import torch

        block = copy.deepcopy(layer)
        if init_weights:
            with torch.no_grad():
                for name in zero_out:
                    for p in block.get_submodule(name).parameters():  # weight and bias
                        p.zero_()
        for p in block.parameters():
            p.requires_grad_(True)
        return block

    def describe(self) -> str:
        return (f"LLaMA Pro: {self.n} identity-initialised blocks inserted (one after every L/{self.n} layers); "
                f"only they train, embeddings, head, final norm and original blocks frozen")
