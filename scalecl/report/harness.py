"""Table 2: the lm-evaluation-harness scores of every evaluated checkpoint (`run.json` of eval-harness), with
the paper's language averages beside them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from scalecl.common.errors import ScaleclError
from scalecl.common.readers import read_json
from scalecl.report.context import Plot
from scalecl.report.registry import table
from scalecl.report.runs import YOURS, find_files, marked
from scalecl.report.tables import write_table


def harness_runs(plot: Plot) -> Iterator[tuple[Path, dict]]:
    """(path, record) of every run.json under the roots that holds scores (an eval-harness result), folder by
    folder in the plot's order; one that cannot be read is skipped with why. A record from a results folder after
    the first is marked 'yours' (scalecl.report.runs.marked), as load_runs marks training runs."""
    seen: set[Path] = set()
    for index, root in enumerate(plot.roots):
        for f in find_files(root, "run.json"):
            if f.resolve() in seen:  # nested folders given twice: each result once
                continue
            seen.add(f.resolve())
            try:
                run = read_json(f, "harness result")
            except ScaleclError as e:
                plot.skip(f, str(e))
                continue
            if "scores" in run:
                yield f, ({**run, YOURS: True} if index else run)


def table2(plot: Plot) -> pd.DataFrame:
    """Harness scores per evaluated checkpoint, with the language averages and the paper's averages beside."""
    from scalecl.evaluation.harness_scores import PAPER_ROWS

    rows = []
    for f, run in harness_runs(plot):
        if not (isinstance(run["scores"], list) and isinstance(run.get("model"), str) and all(
                isinstance(sc, dict) and isinstance(sc.get("task"), str) and "score" in sc for sc in run["scores"])):
            plot.skip(f, f"harness result {f} is malformed (its model or scores)")
            continue
        method = run.get("method")
        row = {"method": marked(method or "base", run), "model": Path(run["model"]).name}
        for sc in run["scores"]:
            row[sc["task"]] = sc["score"]
        paper = PAPER_ROWS.get(method, (None, {}))[1]
        row["paper_english_avg"] = paper.get("english")
        row["paper_korean_avg"] = paper.get("korean")
        rows.append(row)
    return pd.DataFrame(rows)


@table("table2", each_experiment=False)
def table2_harness(plot: Plot) -> list[Path]:
    """table2_harness (md/csv/tex), when some checkpoint was evaluated."""
    harness = table2(plot)
    return write_table(plot, harness, "table2_harness") if len(harness) else []
