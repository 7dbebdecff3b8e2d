"""Dataclass configs: the only schema. Values mirror the CLI flags one to one."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from .errors import ScaleclError

VARIANTS = ("preserve", "adapt", "route")
INITS = ("zero", "rnd", "svd")
COLLAB_MODULES = ("attn", "mlp")


@dataclass(frozen=True)
class ScaleConfig:
    """How to widen a decoder and which upscaled blocks train (paper Sections 3-4, spec/method.md).

    variant:   "preserve" (every W12 frozen at zero, Eq. 3), "adapt" (W12 trains above l_fp, Eq. 4),
               "route" (both paths, cosine router, Eq. 5).
    hidden_up: channels added to the residual stream and to attention (a multiple of head_dim).
    ffn_up:    intermediate units added to every MLP.
    l_fp:      number of lowest layers whose W12 stays frozen at zero. None means L for preserve and
               L - 1 for adapt/route (only the top layer collaborates, the paper's biography setting).
    collab:    modules whose W12 trains in collaborative layers ("attn", "mlp" or both).
    init:      initialisation of (W21, W22), each "zero", "rnd" (He normal) or "svd" (paper Fig. 5).
    tau:       Route's cosine threshold in [-1, 1]. The paper gives no value; 0.9 is this project's
               default and is always recorded with the run.
    """

    variant: str = "route"
    hidden_up: int = 128
    ffn_up: int = 128
    l_fp: int | None = None
    collab: tuple[str, ...] = ("attn", "mlp")
    init: tuple[str, str] = ("svd", "zero")
    tau: float = 0.9

    def __post_init__(self) -> None:
        # normalise lists coming from JSON / the CLI into tuples so the config stays hashable
        object.__setattr__(self, "collab", tuple(self.collab))
        object.__setattr__(self, "init", tuple(self.init))
        self.validate()

    def validate(self) -> None:
        """Checks that need no model: names and ranges."""
        if self.variant not in VARIANTS:
            raise ScaleclError(f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        if len(self.init) != 2 or any(i not in INITS for i in self.init):
            raise ScaleclError(
                f"init must be a pair of {'/'.join(INITS)} for (W21, W22), got {','.join(map(str, self.init))}"
            )
        if not self.collab or any(c not in COLLAB_MODULES for c in self.collab):
            raise ScaleclError(f"collab must be attn, mlp or attn,mlp; got {','.join(map(str, self.collab))}")
        if not isinstance(self.hidden_up, int) or self.hidden_up <= 0:
            raise ScaleclError(f"hidden_up must be a positive integer, got {self.hidden_up}")
        if not isinstance(self.ffn_up, int) or self.ffn_up < 0:
            raise ScaleclError(f"ffn_up must be a non-negative integer, got {self.ffn_up}")
        if not -1.0 <= float(self.tau) <= 1.0:
            raise ScaleclError(f"tau must lie in [-1, 1], got {self.tau}")
        if self.l_fp is not None and (not isinstance(self.l_fp, int) or self.l_fp < 0):
            raise ScaleclError(f"l_fp must be a non-negative integer, got {self.l_fp}")

    def resolved_l_fp(self, num_layers: int) -> int:
        """The number of function-preserving layers for a model with `num_layers` layers."""
        if self.l_fp is None:
            return num_layers if self.variant == "preserve" else num_layers - 1
        if self.l_fp > num_layers:
            raise ScaleclError(f"l_fp must lie in 0..{num_layers} for this model, got {self.l_fp}")
        if self.variant == "preserve" and self.l_fp != num_layers:
            raise ScaleclError(
                f"preserve keeps every W12 frozen (l_fp = {num_layers}); got l_fp={self.l_fp}: use adapt or route"
            )
        return self.l_fp

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["collab"] = list(self.collab)
        d["init"] = list(self.init)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScaleConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ScaleclError(f"unknown ScaleConfig keys: {', '.join(sorted(unknown))}")
        return cls(**d)
