"""SCALE's options, declared once: names, types, defaults, choices and meanings (paper Sections 3-4).

Standalone (the standard library only): copied verbatim into every SCALE checkpoint with the rest of the model
code (`scale_surgery` imports it), and imported by the `scalecl` command line for its flags' defaults and help
without loading torch. This is the lowest layer (scalecl cannot be imported here), so everything above
derives from it: `ScaleConfig` (a ScaleSpec that validates), the SCALE methods' options and the `scalecl
upscale` flags.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

# the values each option can take (ScaleConfig checks them)
VARIANTS = ("preserve", "adapt", "route")
INITS = ("zero", "rnd", "svd")
COLLAB_MODULES = ("attn", "mlp")
ROUTERS = ("logit", "centered", "prob")
EMBED_INITS = ("zero", "rnd")


def _option(default: Any, help_text: str) -> Any:
    """A ScaleSpec field: its default, plus the one-line help the user-facing layers show (CLI flags)."""
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class ScaleSpec:
    """One widening as plain values (paper Sections 3-4, spec/method.md): SCALE's options, declared once.

    variant:   "preserve" (every W12 frozen at zero, Eq. 3), "adapt" (W12 trains above l_fp, Eq. 4),
               "route" (both paths, cosine router, Eq. 5).
    hidden_up: channels added to the residual stream and to attention (a multiple of head_dim).
    ffn_up:    intermediate units added to every MLP.
    l_fp:      number of lowest layers whose W12 stays frozen at zero. None means L for preserve and
               L - 1 for adapt/route (only the top layer collaborates, the paper's biography setting);
               see `resolve_l_fp`. A spec recorded in a checkpoint always holds the resolved number.
    collab:    modules whose W12 trains in collaborative layers ("attn", "mlp" or both).
    init:      initialisation of (W21, W22), each "zero", "rnd" (He normal) or "svd" (paper Fig. 5).
    tau:       Route's cosine threshold in [-1, 1]. The arXiv paper gives no value; 0.5 is this project's
               default, chosen on base seeds 0-2 and confirmed on held-out base seeds 3-5 of the biography
               benchmark (results/studies/tau-heldout), and always recorded with the run.
    router:    what Route's cosine compares: "logit" (the paper's Eq. 5, raw logits), "centered" (logits
               centred over the vocabulary, z - mean_v z, so a uniform shift does not count) or "prob"
               (softmax probabilities). The decision is hard in every case.
    embed_init: the new embedding columns: "zero" (default) or "rnd" (normal, std = the base config's
               initializer_range, 0.02 for GPT-NeoX and Llama). "rnd" needs untied embeddings: the head's
               new columns start at zero only then, and with them the base function.
    """

    variant: str = _option("route", "preserve | adapt | route (paper Eq. 3, 4, 5).")
    hidden_up: int = _option(
        128, "Channels added to the residual stream and attention (multiple of head_dim).")
    ffn_up: int = _option(128, "Intermediate units added to every MLP.")
    l_fp: int | None = _option(
        None, "Lowest layers whose W12 stays frozen at zero (0..L). Default: L for preserve, L-1 otherwise.")
    collab: tuple[str, ...] = _option(
        ("attn", "mlp"), "Modules whose W12 trains in collaborative layers: attn, mlp or attn,mlp.")
    init: tuple[str, str] = _option(
        ("svd", "zero"), "Initialisation of W21,W22: each zero, rnd or svd (paper Fig. 5).")
    tau: float = _option(0.5, "Route's cosine threshold in [-1, 1] (the arXiv paper gives no value; 0.5 chosen "
                         "and confirmed on held-out biography bases).")
    router: str = _option(
        "logit", "What Route's cosine compares: logit (paper Eq. 5, raw logits), centered (logits centred "
        "over the vocabulary) or prob (softmax probabilities).")
    embed_init: str = _option(
        "zero", "New embedding columns: zero, or rnd (normal, std = the base's initializer_range; untied "
        "embeddings only, so the head's new columns still start at zero).")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (lists for tuples)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScaleSpec:
        """Inverse of to_dict; unknown keys are an error, never silently dropped."""
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown SCALE spec keys: {', '.join(sorted(unknown))}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def resolve_l_fp(variant: str, l_fp: int | None, num_layers: int) -> int:
    """The number of function-preserving layers: l_fp as given, else L for preserve and L - 1 otherwise."""
    if l_fp is not None:
        return l_fp
    return num_layers if variant == "preserve" else num_layers - 1


def option_help(name: str) -> str:
    """The one-line help of a SCALE option (declared on ScaleSpec), e.g. for a command-line flag."""
    return next(f.metadata["help"] for f in fields(ScaleSpec) if f.name == name)
