"""`ScaleConfig`: SCALE's options as a user gives them, checked with one-line errors (paper Sections 3-4).

The options themselves (names, types, defaults, choices, meanings) are declared once, on
`scalecl.modeling.scale_spec.ScaleSpec`: the standalone model code that checkpoints ship, which cannot
import scalecl. ScaleConfig is that declaration plus the checks a user can fail; the SCALE methods' options
and the `scalecl upscale` flags take their defaults, choices and help from the same place (`option_help`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from scalecl.common.errors import ScaleclError
from scalecl.common.schema import MAX_SIZE, show_bound, show_text, show_value
from scalecl.modeling.scale_spec import (
    COLLAB_MODULES,
    EMBED_INITS,
    INITS,
    ROUTERS,
    VARIANTS,
    ScaleSpec,
    option_help,
    resolve_l_fp,
)

__all__ = ["COLLAB_MODULES", "EMBED_INITS", "INITS", "ROUTERS", "VARIANTS", "ScaleConfig", "option_help"]


@dataclass(frozen=True)
class ScaleConfig(ScaleSpec):
    """How to widen a decoder and which upscaled blocks train: the fields, defaults and meanings of
    `ScaleSpec` (variant, hidden_up, ffn_up, l_fp, collab, init, tau, router, embed_init), validated.

    Lists (from JSON) and comma strings (from the command line, "svd,zero") become tuples. Names and ranges
    are checked on construction; sizes that need the model are checked by `upscale.check_sizes`.
    """

    def __post_init__(self) -> None:
        # normalise lists from JSON and strings from the CLI ("attn", "svd,zero") into hashable tuples
        for name in ("collab", "init"):
            v = getattr(self, name)
            object.__setattr__(self, name, tuple(v.split(",")) if isinstance(v, str) else tuple(v))
        self.validate()

    def validate(self) -> None:
        """Checks that need no model: names and ranges."""
        if self.variant not in VARIANTS:
            raise ScaleclError(f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        if len(self.init) != 2 or any(i not in INITS for i in self.init):
            got = show_text(",".join(map(str, self.init)))
            raise ScaleclError(f"init must be a pair of {'/'.join(INITS)} for (W21, W22), got {got}")
        if not self.collab or any(c not in COLLAB_MODULES for c in self.collab) or len(set(self.collab)) < len(self.collab):
            raise ScaleclError(f"collab must be attn, mlp or attn,mlp; got {show_text(','.join(map(str, self.collab)))}")
        for name, low in (("hidden_up", 1), ("ffn_up", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_SIZE:
                raise ScaleclError(f"{name} must be an integer in {low}..{show_bound(MAX_SIZE)}, the largest "
                                   f"model size the suite accepts; got {show_value(v)}")
        if not -1.0 <= float(self.tau) <= 1.0:
            raise ScaleclError(f"tau must lie in [-1, 1], got {self.tau}")
        if self.l_fp is not None and (isinstance(self.l_fp, bool) or not isinstance(self.l_fp, int) or self.l_fp < 0):
            raise ScaleclError(f"l_fp must be a non-negative integer, got {show_value(self.l_fp)}")
        if self.router not in ROUTERS:
            raise ScaleclError(f"unknown router {self.router!r}; choose one of {', '.join(ROUTERS)}")
        if self.embed_init not in EMBED_INITS:
            raise ScaleclError(f"unknown embed_init {self.embed_init!r}; choose one of {', '.join(EMBED_INITS)}")

    def resolved_l_fp(self, num_layers: int) -> int:
        """The number of function-preserving layers for a model with `num_layers` layers."""
        if self.l_fp is not None and self.l_fp > num_layers:
            raise ScaleclError(f"l_fp must lie in 0..{num_layers} for this model, got {self.l_fp}")
        if self.variant == "preserve" and self.l_fp not in (None, num_layers):
            raise ScaleclError(
                f"preserve keeps every W12 frozen (l_fp = {num_layers}); got l_fp={self.l_fp}: use adapt or route"
            )
        return resolve_l_fp(self.variant, self.l_fp, num_layers)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScaleConfig:
        """Inverse of to_dict; unknown keys are one ScaleclError."""
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ScaleclError(f"unknown ScaleConfig keys: {', '.join(sorted(unknown))}")
        return cls(**d)
