"""The one interface every method implements, and the registry the CLI and training loop use.

A method takes a base model, returns the model to train with `requires_grad` set on exactly the parameters
that train, and describes itself. The training loop builds its optimizer from `trainable_parameters(model)`
and never branches on a method's name. A method also owns how its model is checkpointed: the layout it declares
(`layout`, written and read by scalecl.training.layouts), how a saved model shows it (`from_model`,
`check_model`) and whether it exports as a plain model (`check_merge`, `merge`); so the checkpoint code asks the
method instead of comparing names.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

from scalecl.common.errors import ScaleclError
from scalecl.common.schema import coerce, show_text

if TYPE_CHECKING:  # importing a method loads no torch: the CLI checks its options before torch loads
    from torch import nn
    from transformers import PreTrainedModel

REGISTRY: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Add a method class to the registry under its `name`; a name registered twice is a programming error."""
    if cls.name in REGISTRY:
        raise ValueError(f"method {cls.name!r} is already registered (by {REGISTRY[cls.name].__qualname__})")
    REGISTRY[cls.name] = cls
    return cls


@dataclass
class Method:
    """Base class: subclasses are dataclasses whose fields are the method's options."""

    name: ClassVar[str] = ""
    # whether a checkpoint can hold only what the method trains (save_model(..., delta=True)): a method that keeps
    # part of its base frozen and unchanged
    delta: ClassVar[bool] = False
    # the layout of the method's full checkpoint (scalecl.training.layouts, scalecl.json `layout`): "plain", a
    # transformers folder its model loads from as any model; a method whose model is not one names its own
    layout: ClassVar[str] = "plain"
    # the table under a config's `methods` that holds options shared by a family of methods (`methods.scale`: every
    # SCALE variant), or None; a method's own table (`methods.<name>`) applies on top
    options_group: ClassVar[str | None] = None
    plain_head: ClassVar[bool] = True  # the model's head is a plain linear layer (the chunked loss applies)

    def shape(self, layers: int, width: int, ffn: int) -> tuple[int, int, int, int]:
        """(layers, hidden width, FFN width, paths a token takes) of the model the method trains, from its base's
        (the memory and time estimate reads them: scalecl.experiments.budget)."""
        return layers, width, ffn, 1

    def numerics(self) -> dict[str, Any]:
        """What changes the last bits of this method's runs besides its options and the machine (it names the
        run): none by default."""
        return {}

    def check(self, config) -> None:
        """Validate options against a base config before any heavy work (raise ScaleclError)."""

    def apply(self, model: PreTrainedModel, init_weights: bool = True) -> PreTrainedModel:
        """Return the model to train, with requires_grad set on exactly the trainable parameters.

        A method that changes the model's structure sets `model.scalecl_base_config` (the config dict it
        started from) so that checkpoints can be rebuilt; init_weights=False skips any initialisation
        that a checkpoint load will overwrite anyway."""
        raise NotImplementedError

    def describe(self) -> str:
        """One line saying what trains."""
        raise NotImplementedError

    def metrics(self, model: PreTrainedModel, mask=None) -> dict[str, float]:
        """Extra numbers about the last forward (e.g. Route's routing fractions over the `mask` positions)."""
        return {}

    def position_values(self, model: PreTrainedModel, mask) -> dict[str, Any]:
        """Per-position numbers of the last forward at the (B, T) `mask` positions, each a 1-D tensor (e.g.
        Route's decision and router score where a metric is scored); evaluation summarises them."""
        return {}

    def attach(self, model: PreTrainedModel, never_rows=None) -> PreTrainedModel:
        """What the method's model takes from the experiment besides its weights, whether built for step 0 or
        loaded from a checkpoint to resume: nothing by default (SCALE-Route: `never_rows`, the (V,) bool mask of
        vocabulary rows never a training target, whose share of the logits it measures)."""
        return model

    @classmethod
    def from_model(cls, model: nn.Module) -> Method | None:
        """The method that built `model` with its options, read off the model itself, or None: a method whose
        model carries no trace of it (a plain transformers model) answers None."""
        return None

    def check_model(self, model: nn.Module) -> None:
        """Raise ScaleclError unless `model` is one this method, with these options, builds (what save_model
        checks beyond the tensors' names and shapes: SCALE's widening)."""

    @classmethod
    def check_merge(cls) -> None:
        """Raise ScaleclError if the method's model cannot be written as a plain transformers model of the base's
        structure (`scalecl merge`)."""

    def merge(self, model: PreTrainedModel) -> PreTrainedModel:
        """The method's model as a plain transformers model (`scalecl merge`): itself by default."""
        return model

    def options(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def coerce_options(cls, opts: dict[str, Any], where: str = "") -> dict[str, Any]:
        """Options converted to their declared types (command-line text parsed, wrong types one clear error)."""
        known = {f.name for f in fields(cls)}
        unknown = set(opts) - known
        if unknown:
            raise ScaleclError(f"method {cls.name} has no option(s) {', '.join(map(show_text, sorted(unknown)))}; "
                               f"options: {', '.join(sorted(known)) or 'none'}")
        hints = typing.get_type_hints(cls)
        return {k: coerce(v, hints[k], f"{where}.{k}" if where else f"option {k} of {cls.name}")
                for k, v in opts.items()}

    @classmethod
    def from_options(cls, **opts: Any) -> Method:
        return cls(**cls.coerce_options(opts))


# The order methods are run, listed and drawn in: the baselines, then SCALE's variants (paper Table 1).
METHOD_ORDER = ("fft", "lora", "freeze", "llama-pro", "scale-preserve", "scale-adapt", "scale-route")


def method_names() -> list[str]:
    """Registered methods in METHOD_ORDER (any other registered method after them)."""
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}
    return sorted(REGISTRY, key=lambda m: rank.get(m, len(rank)))


def get_method(name: str, **opts: Any) -> Method:
    """Build a registered method by its CLI name with its options."""
    if name not in REGISTRY:
        raise ScaleclError(f"unknown method {name!r}; choose one of {', '.join(method_names())}")
    return REGISTRY[name].from_options(**opts)


def options_class(key: str) -> type[Method]:
    """The method class whose options a config's `methods.<key>` table holds: a method's own, or for a group
    (options_group) its member with the most options (SCALE's variants share theirs)."""
    if key in REGISTRY:
        return REGISTRY[key]
    members = [cls for cls in REGISTRY.values() if cls.options_group == key]
    if not members:
        raise ScaleclError(f"unknown method {key!r}; choose one of {', '.join(method_names())} or a group "
                           f"({', '.join(option_groups())})")
    return max(members, key=lambda cls: len(fields(cls)))


def option_groups() -> list[str]:
    """The config tables that hold options of several methods (`scale`)."""
    return sorted({cls.options_group for cls in REGISTRY.values() if cls.options_group})


def method_of_model(model: nn.Module) -> Method | None:
    """The method that built `model`, as the model itself shows it (Method.from_model), or None."""
    for cls in REGISTRY.values():
        found = cls.from_model(model)
        if found is not None:
            return found
    return None


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Name -> parameter for everything that trains (shared tensors listed once)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
