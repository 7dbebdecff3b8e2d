"""The preliminary studies of paper Sec. 3 as one-command sweeps over continual pre-training runs.

  init:   (W21, W22) initialisation pairs with SCALE-Preserve (Fig. 5)
  l_fp:   number of function-preserving lower layers with SCALE-Adapt (Fig. 6)
  collab: collaborative module, attention vs MLP, with SCALE-Adapt at l_fp = L/2 (Fig. 7)

Every run is an ordinary `train-cpt` run (same cached base, same data), written under
`<out>/<study>/`, which `scalecl plot` turns into the figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .config import load_preset
from .errors import ScaleclError

STUDIES = {
    "init": ("scale-preserve", "init", "zero,rnd;rnd,zero;svd,svd;svd,zero"),
    "l_fp": ("scale-adapt", "l_fp", None),  # default: 0..L
    "collab": ("scale-adapt", "collab", "attn;mlp"),
}


def _layers(rc) -> int:
    if rc.base == "builtin":
        return rc.model.layers
    from .models import load_base_config

    return load_base_config(rc.base).num_hidden_layers


def study_values(study: str, rc, values: str | None) -> list[str]:
    """The swept values as --set strings; l_fp accepts a range 'a..b'."""
    if study not in STUDIES:
        raise ScaleclError(f"unknown study {study!r}; choose one of {', '.join(STUDIES)}")
    method, key, default = STUDIES[study]
    text = values or default or f"0..{_layers(rc)}"
    if study == "l_fp" and ".." in text:
        lo, _, hi = text.partition("..")
        try:
            return [str(v) for v in range(int(lo), int(hi) + 1)]
        except ValueError:
            raise ScaleclError(f"l_fp values must be integers or a range a..b, got {text!r}") from None
    return [v.strip() for v in text.split(";") if v.strip()]


def run_study(
    study: str, preset: str, values: str | None, sets: list[str], out: Path, cache: Path, checkpoints: Path,
    force: bool = False, device: str | None = None,
) -> list[dict[str, Any]]:
    """Run one CPT run per swept value; returns their result dicts."""
    from .cpt import run_cpt

    rc = load_preset("cpt", preset, sets)
    method, key, _ = STUDIES.get(study, (None, None, None))
    vals = study_values(study, rc, values)
    extra = [f"methods.{method}.l_fp={_layers(rc) // 2}"] if study == "collab" else []
    configs = [load_preset("cpt", preset, sets + extra + [f"methods.{method}.{key}={v}"]) for v in vals]
    results = []
    for v, cfg in zip(vals, configs, strict=True):
        results += run_cpt(cfg, [method], out / study, cache, checkpoints / study / v.replace(",", "-"),
                           preset, force=force, device=device)
    return results
