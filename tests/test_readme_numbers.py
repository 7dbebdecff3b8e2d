"""Every interval the README's claims table quotes is a row of a table `scalecl plot` wrote from the run files.

The slow report test checks that paper_figures/ is what `scalecl plot` makes from results/; this test checks
that each `mean [lo, hi]` and `mean ± half-width` of the README's claims table is one row of one of those tables,
rounded once from the raw values to the digits the README shows (so a number copied wrong, rounded twice or left
stale fails here)."""

from __future__ import annotations

import json
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
    """(mean, lo, hi, file) of every interval in the committed tables: a mean column beside its _ci_lo/_ci_hi (or,
    in Table 2, _lo/_hi), and the paired tables' diff_mean (Table 2's: diff, ci_lo, ci_hi)."""
    out = []
    for f in sorted((REPO / "paper_figures").glob("*.csv")):
        df = pd.read_csv(f)
        cols = [(c, f"{c}_ci_lo", f"{c}_ci_hi") for c in df.columns]  # a mean beside its interval
        cols += [(c, f"{c}_lo", f"{c}_hi") for c in df.columns]  # Table 2: <average>_diff, _diff_lo, _diff_hi
        cols += [("diff_mean", "diff_ci_lo", "diff_ci_hi"), ("diff", "ci_lo", "ci_hi")]  # paired tables
        for c, lo, hi in cols:
            if not {c, lo, hi} <= set(df.columns):
                continue
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


# -- the claims table's numbers that are not intervals, recomputed from the committed run files ---------------

def claim_row(start: str) -> str:
    """The claims table's row whose first cell starts with `start`."""
    (row,) = [r for r in claims_table().splitlines() if r.startswith(f"| {start}")]
    return row


def runs(folder: str, method: str, **where) -> list[tuple[dict, list[dict]]]:
    """(result, evaluations) of the committed runs in results/<folder> of `method` whose lr, tau and model rows
    (vocab; 0 = the tokenizer's) are as given, in base and run seed order."""
    out = []
    for f in sorted((REPO / "results" / folder).glob("*/result.json")):
        r = json.loads(f.read_text())
        got = {"lr": r["lr"], "tau": r["method_options"].get("tau"), "vocab": r["config"]["model"].get("vocab", 0)}
        if r["method"] == method and all(got[k] == pytest.approx(v) for k, v in where.items()):
            evals = [json.loads(line) for line in (f.parent / "metrics.jsonl").read_text().splitlines()]
            out.append((r, [e for e in evals if "task0/acc" in e]))
    return sorted(out, key=lambda rm: (rm[0]["seeds"]["base"], rm[0]["seeds"]["run"]))


def span(values, digits: int) -> str:
    """'lo-hi' of the values at `digits` decimals (integers without)."""
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}-{hi:.{digits}f}" if digits else f"{lo:.0f}-{hi:.0f}"


def test_fft_reaches_its_lowest_task0_within_the_steps_the_readme_says():
    row = claim_row("Bio: FFT's Task 0 accuracy collapses")
    fft = runs("bio", "fft", lr=1e-4)
    assert [r["seeds"]["base"] for r, _ in fft] == [0, 1, 2]
    lowest = [min(ev, key=lambda e: e["task0/acc"])["step"] for _, ev in fft]
    steps = {ev[-1]["step"] for _, ev in fft}
    bound, total = map(int, re.search(r"reached within (\d+) of (\d+) steps", row).groups())
    assert steps == {total} and max(lowest) <= bound, lowest


def test_routes_early_task0_is_what_the_readme_says():
    """Route at the default tau on the tokenizer's head: the first step below 0.95 and Task 0 at step 200 on each
    base; at 50,304 rows (tau = 0.9): the range of Task 0 from step 10 through step 200 over base 0's run seeds."""
    row = claim_row("Bio: SCALE-Route holds Task 0 near 100%")
    route = runs("bio", "scale-route", lr=1e-3, tau=0.5)
    assert [r["seeds"]["base"] for r, _ in route] == [0, 1, 2]
    first = [next(e["step"] for e in ev if e["task0/acc"] < 0.95) for _, ev in route]
    at200 = [next(e["task0/acc"] for e in ev if e["step"] == 200) for _, ev in route]
    assert f"below 0.95 at steps {span(first, 0)} of 600, {span(at200, 2)} at step 200 (3 base seeds)" in row
    wide = [ev for r, ev in runs("studies/vocab", "scale-route", vocab=50304, tau=0.9) if r["seeds"]["base"] == 0]
    assert len(wide) == 3
    early = [e["task0/acc"] for ev in wide for e in ev if 10 <= e["step"] <= 200]
    assert f"{span(early, 2)} through step 200 (3 run seeds, one base)" in row
