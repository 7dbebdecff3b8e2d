"""Experiment trackers (`--report-to`): accelerate's integrations, one tracker run per scalecl run."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from scalecl.common.errors import ScaleclError

REPORT_TO = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}  # -> module


def check_report_to(names: str | Collection[str] | None) -> tuple[str, ...]:
    """`--report-to` as a tuple of tracker names, each installed: one clear error otherwise, before any work."""
    import importlib.util

    from scalecl.common.schema import split_items

    items = split_items(names, "--report-to") if isinstance(names, str) and names.strip() else \
        list(names or []) if not isinstance(names, str) else []
    items = [n for n in items if n and n != "none"]
    for n in items:
        if n not in REPORT_TO:
            raise ScaleclError(f"--report-to {n!r}: choose none or any of {', '.join(REPORT_TO)}")
        if importlib.util.find_spec(REPORT_TO[n]) is None:
            raise ScaleclError(f"--report-to {n}: the {REPORT_TO[n]} package is not installed (pip install "
                               f"{REPORT_TO[n]})")
    return tuple(dict.fromkeys(items))


def _flat_config(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> flat {a.b.c: scalar} (trackers take scalars as hyperparameters)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flat_config(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, bool | int | float | str) or v is None else str(v)
    return out


def open_trackers(names: tuple[str, ...], run_name: str, logging_dir: Path, config: dict[str, Any]) -> list[Any]:
    """Started accelerate trackers for one run, its resolved config stored as hyperparameters."""
    if not names:
        return []
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    trackers = []
    for n in names:
        cls = LOGGER_TYPE_TO_CLASS[n]
        if n == "tensorboard":
            t = cls(run_name, logging_dir)  # events in <run dir>/tensorboard/<run name>
        elif n == "mlflow":
            t = cls(experiment_name="scalecl", logging_dir=str(logging_dir), run_name=run_name)
        else:  # wandb, trackio: one project, one run per scalecl run
            t = cls("scalecl", name=run_name)
        t.start()
        t.store_init_configuration({k: v for k, v in _flat_config(config).items() if v is not None})
        trackers.append(t)
    return trackers
