"""Standard continual-learning metrics of a run, derived from its result.json and metrics.jsonl when the report reads
it (`cl.*`, beside the recorded keys, so that every table and paired comparison can name them by path).

Biography (accuracy; the old task is Task 0, the new one Task 1):
  bwt             backward transfer: held-out Task 0 accuracy at the end minus after stage 2, both on the full range
                  (final.task0_heldout.acc - stage2.task0_heldout.acc); negative is forgetting
  task0_auc       the area under the held-out Task 0 curve (slices), divided by the steps it spans: the mean
                  accuracy over Task 1's training, every step weighted alike (trapezoids between evaluations)
  task0_from_max  forgetting from the maximum: the highest Task 0 (slice) of the run minus its last
  task0_at_task1  matched learning: Task 0 (slice) at the first evaluation where Task 1 (slice) reaches
                  MATCHED_TASK1; missing for a run that never does
Continual pre-training (perplexity; the old domain is the base's, lower is better):
  old_ppl_rise     old-domain perplexity at the end minus at step 0 (backward transfer in perplexity; positive
                   is forgetting)
  old_ppl_auc      the mean old-domain perplexity over training (trapezoids between evaluations)
  old_ppl_from_best  the last old-domain perplexity minus the lowest of the run
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from scalecl.common.errors import ScaleclError
from scalecl.common.readers import read_jsonl

MATCHED_TASK1 = 0.8  # the Task 1 accuracy at which bio runs' Task 0 is compared (task0_at_task1)

_CACHE: dict[tuple, pd.DataFrame | None] = {}


def _curve(run_dir: Path) -> pd.DataFrame | None:
    """A run's metrics.jsonl as a frame by step (None when missing or unreadable: its metrics stay blank; the
    figures that need the file record it as skipped). Read once per file version."""
    f = Path(run_dir) / "metrics.jsonl"
    try:
        st = os.stat(f)
    except OSError:
        return None
    key = (str(f.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _CACHE:
        try:
            df = pd.DataFrame(read_jsonl(f, "unreadable log"))
            ok = not df.empty and "step" in df
            _CACHE[key] = df.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True) \
                if ok else None
        except (ScaleclError, TypeError, ValueError):
            _CACHE[key] = None
    return _CACHE[key]


def _series(m: pd.DataFrame | None, col: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, values) of a metric's finite values, or None."""
    if m is None or col not in m:
        return None
    sel = pd.to_numeric(m[col], errors="coerce").notna()
    if not sel.any():
        return None
    return m.loc[sel, "step"].to_numpy(float), pd.to_numeric(m.loc[sel, col]).to_numpy(float)


def curve_mean(steps: np.ndarray, values: np.ndarray) -> float:
    """The area under a curve sampled at `steps`, divided by the steps it spans (trapezoids); a single point
    is its value."""
    if len(steps) == 1 or steps[-1] == steps[0]:
        return float(values[-1])
    return float(np.trapezoid(values, steps) / (steps[-1] - steps[0]))


def _num(v) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def bio_metrics(r: dict, m: pd.DataFrame | None) -> dict[str, float | None]:
    """The biography's continual-learning metrics of one run (see the module docstring)."""
    end, after = _num((r.get("final") or {}).get("task0_heldout", {}).get("acc")), \
        _num((r.get("stage2") or {}).get("task0_heldout", {}).get("acc"))
    out: dict[str, float | None] = {"bwt": end - after if end is not None and after is not None else None,
                                    "task0_auc": None, "task0_from_max": None, "task0_at_task1": None}
    t0, t1 = _series(m, "task0/acc"), _series(m, "task1/acc")
    if t0 is not None:
        out["task0_auc"] = curve_mean(*t0)
        out["task0_from_max"] = float(t0[1].max() - t0[1][-1])
    if t0 is not None and t1 is not None:
        at = dict(zip(*t0, strict=True))
        reached = [s for s, v in zip(*t1, strict=True) if v >= MATCHED_TASK1 and s in at]
        out["task0_at_task1"] = at[reached[0]] if reached else None
    return out


def cpt_metrics(r: dict, m: pd.DataFrame | None) -> dict[str, float | None]:
    """Continual pre-training's continual-learning metrics of one run, in old-domain perplexity."""
    s = r.get("summary") or {}
    start, end = _num(s.get("old_ppl_start")), _num(s.get("old_ppl_end"))
    out: dict[str, float | None] = {"old_ppl_rise": end - start if end is not None and start is not None else None,
                                    "old_ppl_auc": None, "old_ppl_from_best": None}
    old = _series(m, "old/ppl")
    if old is not None:
        out["old_ppl_auc"] = curve_mean(*old)
        out["old_ppl_from_best"] = float(old[1][-1] - old[1].min())
    return out


def with_cl(r: dict, run_dir: Path, metrics: Callable[[dict, pd.DataFrame | None], dict]) -> dict:
    """The result with its `cl` metrics added (a copy; the file is not changed)."""
    return {**r, "cl": metrics(r, _curve(run_dir))}
