"""SCALE-Preserve, SCALE-Adapt and SCALE-Route behind the common method interface (paper Sec. 4).

Importing this package loads no torch (the command line checks a method's options before torch loads): the
model surgery (scalecl.methods.scale.upscale, scalecl.modeling.scale_surgery) loads where a model is changed or
read, and `scale_path` / `routing_fractions` load on first use. The function `upscale` is `scalecl.upscale`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from scalecl.common.errors import ScaleclError
from scalecl.methods.base import REGISTRY, Method, register
from scalecl.methods.scale.config import ScaleConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from scalecl.modeling.scale_surgery import routing_fractions, scale_path

__all__ = ["ScaleConfig", "ScaleMethod", "scale_path", "routing_fractions"]
_LAZY = {"scale_path": "scalecl.modeling.scale_surgery", "routing_fractions": "scalecl.modeling.scale_surgery"}


def __getattr__(name: str) -> Any:
    """`scale_path` and `routing_fractions`, imported on first use (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def never_shares(model: PreTrainedModel, st, mask) -> dict[str, Any]:
    """At the (B, T) mask positions of the last routed evaluation forward: for each path, the share of its
    original-channel logit vector's squared norm, sum_v Z_v^2, that lies on vocabulary rows never a training
    target (state.never_rows). A share near 1 means the router's raw-logit cosine is decided by rows the task
    never uses. Empty unless the experiment set never_rows (scalecl.experiments.bio does for SCALE-Route)."""
    never, hidden = getattr(st, "never_rows", None), getattr(st, "path_hidden", None)
    if never is None or hidden is None or hidden[0].shape[:2] != mask.shape:
        return {}
    w = model.get_output_embeddings().weight.float()  # (V, d): the original channels' head
    out = {}
    for path, h in zip(("preserve", "adapt"), hidden, strict=True):
        sq = (h[mask].float() @ w.T).square()  # (n, V)
        out[f"never_share_{path}"] = sq[:, never.to(sq.device)].sum(-1) / sq.sum(-1).clamp_min(1e-30)
    return out


# what a SCALE checkpoint's structure and forward depend on (init and embed_init only decide the first weights)
_BUILT = ("variant", "hidden_up", "ffn_up", "l_fp", "collab", "tau", "router")


@dataclass
class ScaleMethod(Method):
    """Width upscaling; the variant is fixed by the registered subclass."""

    variant: ClassVar[str] = "route"
    delta: ClassVar[bool] = True  # frozen tensors stay the base's: a delta checkpoint stores the rest
    # a transformers folder with SCALE's own model code (remote code): the widened model is no family's own
    layout: ClassVar[str] = "scale"
    options_group: ClassVar[str | None] = "scale"  # methods.scale: options of every variant
    plain_head: ClassVar[bool] = False  # the widened head is SCALE's own
    # the options are ScaleSpec's fields (less the variant), with the defaults declared there (ScaleConfig
    # inherits them): one place defines them
    hidden_up: int = ScaleConfig.hidden_up
    ffn_up: int = ScaleConfig.ffn_up
    l_fp: int | None = ScaleConfig.l_fp
    collab: tuple[str, ...] = ScaleConfig.collab
    init: tuple[str, str] = ScaleConfig.init
    tau: float = ScaleConfig.tau
    router: str = ScaleConfig.router
    embed_init: str = ScaleConfig.embed_init

    def numerics(self) -> dict[str, Any]:
        """SCALECL_SCALE_PRODUCTS when the forward's products are formed otherwise than by blocks (the default,
        left out so that runs at the default keep their names): other last bits, and through training other
        numbers."""
        from scalecl.common.environment import env

        products = env("SCALECL_SCALE_PRODUCTS")
        return {"scale_products": products} if products != "blocks" else {}

    def shape(self, layers: int, width: int, ffn: int) -> tuple[int, int, int, int]:
        """Wider by hidden_up and ffn_up; Route computes both paths for every token."""
        return layers, width + self.hidden_up, ffn + self.ffn_up, 2 if self.variant == "route" else 1

    def __post_init__(self) -> None:
        self.config = ScaleConfig(
            variant=self.variant, hidden_up=self.hidden_up, ffn_up=self.ffn_up, l_fp=self.l_fp,
            collab=self.collab, init=self.init, tau=self.tau, router=self.router, embed_init=self.embed_init,
        )

    def check(self, config) -> None:
        from scalecl.methods.scale.upscale import check_sizes

        check_sizes(config, self.config)

    def apply(self, model: PreTrainedModel, init_weights: bool = True) -> PreTrainedModel:
        from scalecl.methods.scale.upscale import upscale

        return upscale(model, self.config, inplace=True, init_weights=init_weights)

    def describe(self) -> str:
        c = self.config
        if c.variant == "preserve":
            where = "W12 frozen at zero in every layer"
        else:
            above = "in the top layer only" if c.l_fp is None else f"above the lowest {c.l_fp} layers"
            where = f"W12 of {'+'.join(c.collab)} trains {above}"
        extra = f", {c.router} router tau={c.tau}" if c.variant == "route" else ""
        if c.embed_init != "zero":
            extra += f", new embedding columns {c.embed_init}"
        return (f"SCALE-{c.variant.capitalize()}: width +{c.hidden_up} hidden / +{c.ffn_up} FFN; original weights "
                f"frozen; W21, W22, new norms, embedding and head columns train; {where}{extra}")

    def position_values(self, model: PreTrainedModel, mask) -> dict[str, Any]:
        """Route's decision (bool: True = preserve path) and router score at the (B, T) mask positions of the
        last forward; empty for Preserve/Adapt or before a routed forward."""
        st = getattr(model, "scale_state", None)
        routed, score = getattr(st, "preserve_mask", None), getattr(st, "route_score", None)
        if routed is None or score is None or routed.shape != mask.shape:
            return {}
        mask = mask.to(routed.device)
        return {"route_preserve": routed[mask], "route_score": score[mask], **never_shares(model, st, mask)}

    def metrics(self, model: PreTrainedModel, mask=None) -> dict[str, float]:
        from scalecl.modeling.scale_surgery import routing_fractions

        return routing_fractions(model, mask)

    def options(self) -> dict[str, Any]:
        return {k: v for k, v in self.config.to_dict().items() if k != "variant"}

    def attach(self, model: PreTrainedModel, never_rows=None) -> PreTrainedModel:
        """Route's path state takes the experiment's never-target rows (never_shares measures their share)."""
        state = getattr(model, "scale_state", None)
        if state is not None and state.mode == "route" and never_rows is not None:
            state.never_rows = never_rows
        return model

    @classmethod
    def for_variant(cls, variant: str) -> type[ScaleMethod]:
        """The registered SCALE method of a variant ("preserve", "adapt", "route")."""
        found = [c for c in REGISTRY.values() if issubclass(c, ScaleMethod) and c.variant == variant]
        if not found:
            raise ScaleclError(f"no SCALE method has variant {variant!r}")
        return found[0]

    @classmethod
    def from_model(cls, model) -> ScaleMethod | None:
        """A widened model's method: the options asked for (scalecl's upscale), else the widening as built (a model
        loaded through remote code)."""
        if getattr(model, "scale_spec", None) is None:
            return None
        cfg = (getattr(model, "scale_config", None) or model.scale_spec).to_dict()
        return cls.for_variant(cfg.pop("variant")).from_options(**cfg)

    def check_model(self, model) -> None:
        """The widening the model has (else its checkpoint would rebuild another model at load)."""
        from scalecl.methods.scale.upscale import to_spec

        want = to_spec(self.config, model.config.num_hidden_layers).to_dict()
        have = model.scale_spec.to_dict()
        differ = [f"{k} {want[k]!r} (the model has {have[k]!r})" for k in _BUILT if want[k] != have[k]]
        if differ:
            raise ScaleclError(f"method {self.name} does not match the model given to save_model: {', '.join(differ)}")

    @classmethod
    def check_merge(cls) -> None:
        raise ScaleclError(f"{cls.name} cannot be merged into a plain model of the base's shape (split norms, new "
                           f"heads); its checkpoint already loads with AutoModelForCausalLM.from_pretrained(DIR, "
                           f"trust_remote_code=True)")


@register
@dataclass
class ScalePreserve(ScaleMethod):
    name: ClassVar[str] = "scale-preserve"
    variant: ClassVar[str] = "preserve"


@register
@dataclass
class ScaleAdapt(ScaleMethod):
    name: ClassVar[str] = "scale-adapt"
    variant: ClassVar[str] = "adapt"


@register
@dataclass
class ScaleRoute(ScaleMethod):
    name: ClassVar[str] = "scale-route"
    variant: ClassVar[str] = "route"
