"""Means and 95% Student-t intervals over replicate runs.

The interval of n values is mean +- t_{(1+level)/2, n-1} * s / sqrt(n), s the sample standard deviation
(n - 1 in the denominator), the t quantile from scipy. With one value there is no interval: its bounds are NaN.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

LEVEL = 0.95


@cache  # a figure asks for the same few quantiles at every step of every curve
def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (scipy.stats.t.ppf)."""
    from scipy.stats import t

    return float(t.ppf(p, df))


@dataclass(frozen=True)
class Interval:
    """Mean of n values and its Student-t interval; lo, hi, half and sd are NaN when n < 2."""

    n: int
    mean: float
    lo: float
    hi: float
    half: float
    sd: float

    @property
    def note(self) -> str:
        """What a table says about the interval: 't interval, n = k', or 'n=1 (no interval)'."""
        return interval_note(self.n)


def interval_note(n: int) -> str:
    """'t interval, n = k' for n >= 2 values, else 'n=<n> (no interval)'."""
    return f"t interval, n = {n}" if n >= 2 else f"n={n} (no interval)"


def t_interval(values: Iterable[float], level: float = LEVEL) -> Interval:
    """The mean of the finite values given and its `level` Student-t interval over them."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return Interval(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    mean = math.fsum(xs) / n
    if n == 1:
        return Interval(1, mean, math.nan, math.nan, math.nan, math.nan)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)
    return Interval(n, mean, mean - half, mean + half, half, sd)


def binomial_se(p: float, n: int | None) -> float:
    """Standard error sqrt(p (1 - p) / n) of an accuracy p measured on n questions (NaN when n is unknown)."""
    if n is None or n <= 0 or p is None or not math.isfinite(p) or not 0 <= p <= 1:
        return math.nan
    return math.sqrt(p * (1 - p) / n)


MAX_UNITS = 100  # units_needed reports "more than this" beyond it


def units_needed(mean: float, sd: float, level: float = LEVEL) -> int | None:
    """The fewest units (n >= 2) whose t interval, mean +- t_{(1+level)/2, n-1} sd / sqrt(n), would exclude 0 if
    another n units gave the same mean and sd: a planning number for a paired difference the runs cannot tell
    apart yet (at or below the units it has when its interval already excludes 0). None when no n up to MAX_UNITS
    does (a mean of 0, or too small against its sd); NaN inputs give None."""
    if not (math.isfinite(mean) and math.isfinite(sd)) or mean == 0:
        return None
    if sd == 0:
        return 2
    for n in range(2, MAX_UNITS + 1):
        if t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n) < abs(mean):
            return n
    return None
