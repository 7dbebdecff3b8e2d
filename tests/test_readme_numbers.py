"""Every interval the README's claims table quotes is a row of a table `scalecl plot` wrote from the run files.

The slow report test checks that paper_figures/ is what `scalecl plot` makes from results/; this test checks
that each `mean [lo, hi]` and `mean ± half-width` of the README's claims table is one row of one of those tables,
rounded once from the raw values to the digits the README shows (so a number copied wrong, rounded twice or left
stale fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
NUM = r"[+\-−]?\d[\d,]*(?:\.\d+)?"


def _value(text: str) -> float:
    return float(text.replace("−", "-").replace(",", ""))


def _rounds_to(x: float, text: str) -> bool:
    """Whether x shows as `text` at text's decimals (one rounding from the raw value)."""
    digits = len(text.split(".")[1]) if "." in text else 0
    return bool(x == x) and abs(round(x, digits) - _value(text)) < 10 ** -(digits + 3)


def claims_table() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("| paper claim |")
    return text[start: text.index("\n\n", start)]


def table_intervals() -> list[tuple[float, float, float, str]]:
    """(mean, lo, hi, file) of every interval in the committed tables: a mean column beside its _ci_lo/_ci_hi,
    and the paired tables' diff_mean."""
    out = []
    for f in sorted((REPO / "paper_figures").glob("*.csv")):
        df = pd.read_csv(f)
        means = [c for c in df.columns if f"{c}_ci_lo" in df.columns and f"{c}_ci_hi" in df.columns]
        means += ["diff_mean"] if "diff_mean" in df.columns else []
        for c in means:
            lo, hi = ("diff_ci_lo", "diff_ci_hi") if c == "diff_mean" else (f"{c}_ci_lo", f"{c}_ci_hi")
            out += [(m, a, b, f.name) for m, a, b in zip(df[c], df[lo], df[hi], strict=True)
                    if all(isinstance(v, float | int) for v in (m, a, b))]
    return out


def quoted() -> list[tuple[str, tuple[str, ...]]]:
    """The README's intervals: ('bracket', (mean, lo, hi)) and ('pm', (mean, half-width))."""
    rows = claims_table()
    return ([("bracket", m.groups()) for m in re.finditer(rf"({NUM}) \[({NUM}), ({NUM})\]", rows)] +
            [("pm", m.groups()) for m in re.finditer(rf"({NUM}) ± ({NUM})", rows)])


def test_the_claims_table_quotes_intervals():
    assert len(quoted()) >= 10  # the parser still finds the README's intervals


@pytest.mark.parametrize(("kind", "numbers"), quoted(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else v)
def test_each_quoted_interval_is_a_row_of_a_plotted_table(kind, numbers):
    rows = table_intervals()
    if kind == "bracket":
        hits = [f for m, lo, hi, f in rows if all(_rounds_to(x, t) for x, t in zip((m, lo, hi), numbers, strict=True))]
    else:
        hits = [f for m, _, hi, f in rows if _rounds_to(m, numbers[0]) and _rounds_to(hi - m, numbers[1])]
    assert hits, f"no table in paper_figures/ has the interval {numbers} the README quotes"
