"""Table 2 in the paper's layout from small synthetic eval-harness results (run.json + items.jsonl as eval-harness
writes them): the base row, the methods, the English average, each method's paired difference from the base
(per checkpoint over items, over checkpoints where there are several), the Korean columns marked as needing the hub,
one table per protocol. The expected differences are counted from the synthetic items, not copied numbers."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.report import Plot, table2_frames
from scalecl.report.table2 import NEEDS_HUB, harness_results, protocols

runner = CliRunner()
TASKS = {"arc_challenge": ("acc_norm", {"arc_challenge": 40}), "hellaswag": ("acc_norm", {"hellaswag": 60}),
         "mmlu": ("acc", {"mmlu_anatomy": 30, "mmlu_virology": 50}), "winogrande": ("acc", {"winogrande": 40})}


def _items(correct: dict[str, list[int]]) -> list[dict]:
    """Rows of items.jsonl: per lm-eval task, item i correct or not (acc and acc_norm alike)."""
    return [{"task": t, "doc_id": i, "doc_hash": f"{t}-{i}", "acc": float(c), "acc_norm": float(c)}
            for t, values in correct.items() for i, c in enumerate(values)]


def write_harness(root: Path, name: str, method: str | None, correct: dict[str, list[int]], *, per_task=None,
                  seed=0, extra_scores=()) -> Path:
    """A results folder as eval-harness writes it: scores per unit (the mean of its items), units, settings."""
    d = root / "harness" / name
    d.mkdir(parents=True)
    items = _items(correct)
    scores = []
    for unit, (metric, tasks) in TASKS.items():
        vals = [r[metric] for r in items if r["task"] in tasks]
        scores.append({"kind": "task", "task": unit, "language": "english", "metric": metric,
                       "score": 100 * sum(vals) / len(vals), "stderr": None, "n": len(vals), "paper": None})
    scores += list(extra_scores)
    eng = [s["score"] for s in scores if s["language"] == "english"]
    scores.append({"kind": "average", "task": "english_avg", "language": "english", "metric": f"mean({len(eng)}/5)",
                   "score": sum(eng) / len(eng), "stderr": None, "n": len(eng), "paper": None})
    settings = {"tasks": list(TASKS), "include_paths": [], "num_fewshot": 0, "limit": None, "max_length": 2048,
                "dtype": "float32"}
    if per_task is not None:
        settings |= {"limit_per_task": per_task, "subset_seed": seed}
    run = {"model": f"/ckpt/{name}", "method": method, "options": {}, "settings": settings, "scores": scores,
           "units": {u: dict(t) for u, (_, t) in TASKS.items()}, "data": {"package": {}, "hub": []}}
    (d / "run.json").write_text(json.dumps(run))
    (d / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    return d


def _base_correct(rng: random.Random) -> dict[str, list[int]]:
    return {t: [rng.random() < 0.5 for _ in range(n)] for _, tasks in TASKS.values() for t, n in tasks.items()}


def _flip(correct: dict[str, list[int]], rng: random.Random, share: float) -> dict[str, list[int]]:
    return {t: [1 - c if rng.random() < share else c for c in v] for t, v in correct.items()}


def _diff(a: dict[str, list[int]], b: dict[str, list[int]], tasks) -> float:
    """B - A in points over the items of `tasks`, counted directly."""
    pairs = [(x, y) for t in tasks for x, y in zip(a[t], b[t], strict=True)]
    return 100 * sum(int(y) - int(x) for x, y in pairs) / len(pairs)


@pytest.fixture
def results(tmp_path):
    rng = random.Random(0)
    base = _base_correct(rng)
    ffts = [_flip(base, rng, 0.2), _flip(base, rng, 0.3)]
    route = _flip(base, rng, 0.05)
    res = tmp_path / "results"
    write_harness(res, "base-1", None, base, per_task=100)
    write_harness(res, "fft-s0-final-1", "fft", ffts[0], per_task=100)
    write_harness(res, "fft-s1-final-1", "fft", ffts[1], per_task=100)
    write_harness(res, "route-final-1", "scale-route", route, per_task=100)
    write_harness(res, "base-full", None, base)  # another protocol: the full sets
    write_harness(res, "route-full", "scale-route", route)
    return res, base, ffts, route


def test_table2_rows_averages_and_paired_differences(results):
    res, base, ffts, route = results
    plot = Plot.of(res)
    by_tag = protocols(harness_results(plot))
    assert set(by_tag) == {"n100-s0", "full"}
    runs = by_tag["n100-s0"]
    base_run = next(r for r in runs if r.run["method"] is None)
    df, paired = table2_frames(base_run, runs)
    t = df.set_index("method")
    assert list(t.index) == ["base", "FFT", "SCALE-Route"] and t.loc["FFT", "checkpoints"] == 2
    assert t.loc["base", "TruthfulQA"] == NEEDS_HUB and t.loc["FFT", "KoBEST COPA"] == NEEDS_HUB
    mmlu_tasks = list(TASKS["mmlu"][1])
    for task, col, tasks in (("arc_challenge", "ARC-C", ["arc_challenge"]), ("mmlu", "MMLU", mmlu_tasks)):
        scores = [100 * sum(int(v) for tt in tasks for v in f[tt]) / sum(len(f[tt]) for tt in tasks) for f in ffts]
        assert t.loc["FFT", col] == pytest.approx(sum(scores) / 2)
        rows = paired[(paired["method"] == "FFT") & (paired["task"] == task)]
        assert list(rows["diff"]) == pytest.approx([_diff(base, f, tasks) for f in ffts] + [
            sum(_diff(base, f, tasks) for f in ffts) / 2])
        assert rows.iloc[0]["n"] == sum(len(base[tt]) for tt in tasks) and rows.iloc[-1]["n"] == 2
        assert rows.iloc[0]["ci_lo"] < rows.iloc[0]["diff"] < rows.iloc[0]["ci_hi"]
    # the English average's difference: the mean of the tasks' paired differences, per checkpoint
    units = {u: list(tasks) for u, (_, tasks) in TASKS.items()}
    route_avg = sum(_diff(base, route, ts) for ts in units.values()) / len(units)
    assert t.loc["SCALE-Route", "english_avg_diff"] == pytest.approx(route_avg)
    assert t.loc["SCALE-Route", "english_avg_interval"].startswith("normal, average of 4")
    fft_avg = [sum(_diff(base, f, ts) for ts in units.values()) / len(units) for f in ffts]
    assert t.loc["FFT", "english_avg_diff"] == pytest.approx(sum(fft_avg) / 2)
    assert t.loc["FFT", "english_avg_interval"] == "t over 2 checkpoints"
    half = abs(fft_avg[0] - fft_avg[1]) / 2 * 12.706204736174703  # t_0.975,1 * s / sqrt(2)
    assert t.loc["FFT", "english_avg_diff_hi"] - t.loc["FFT", "english_avg_diff"] == pytest.approx(half)
    assert math.isnan(t.loc["base"].get("english_avg_diff", math.nan))


def test_plot_writes_table2_per_protocol_with_a_figure(results, tmp_path, all_figure_formats):
    res = results[0]
    out = tmp_path / "figs"
    r = runner.invoke(app, ["plot", "--results", str(res), "--out", str(out)])
    assert r.exit_code == 0, r.output
    for tag in ("n100-s0", "full"):
        for stem in (f"table2_{tag}", f"table2_paired_{tag}"):
            assert all((out / f"{stem}.{ext}").is_file() for ext in ("csv", "md", "tex", "inputs.txt")), stem
        assert (out / f"table2_{tag}.png").stat().st_size > 0 and (out / f"table2_{tag}.pdf").is_file()
    md = (out / "table2_n100-s0.md").read_text()
    header = md.splitlines()[0]
    for col in ("ARC-C", "HellaSwag", "MMLU", "TruthfulQA", "Winogrande", "English avg (4/5)",
                "Δ English avg (4/5) vs base [95%]", "KoBEST BoolQ", "KoBEST COPA", "KoBEST HellaSwag", "Korean avg"):
        assert col in header, col
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert sum(line.count(NEEDS_HUB) for line in table) == 3 * 5  # TruthfulQA, KoBEST and its average, 3 rows
    assert "t over 2 checkpoints" not in md and "Protocol:" in md
    inputs = (out / "table2_n100-s0.inputs.txt").read_text()
    assert "base-1" in inputs and "fft-s1-final-1" in inputs and "route-full" not in inputs
    full = pd.read_csv(out / "table2_full.csv").set_index("method")
    assert list(full.index) == ["base", "SCALE-Route"]
    assert pd.read_csv(out / "table2_harness.csv").shape[0] == 6  # the per-checkpoint table is still made


def _korean_run(root: Path, name: str, model: str, method: str | None, correct: list[int]) -> None:
    """KoBEST COPA scored on another machine (with the hub): the same checkpoint's path, another folder."""
    d = root / "harness" / name
    d.mkdir(parents=True)
    score = 100 * sum(correct) / len(correct)
    run = {"model": model, "method": method, "options": {}, "units": {"kobest_copa": {"kobest_copa": len(correct)}},
           "settings": {"tasks": ["kobest_copa"], "num_fewshot": 0, "limit": None, "max_length": 2048,
                        "dtype": "float32"},
           "scores": [{"kind": "task", "task": "kobest_copa", "language": "korean", "metric": "acc", "score": score},
                      {"kind": "average", "task": "korean_avg", "language": "korean", "metric": "mean(1/3)",
                       "score": score}]}
    (d / "run.json").write_text(json.dumps(run))
    (d / "items.jsonl").write_text("".join(json.dumps({"task": "kobest_copa", "doc_id": i, "doc_hash": str(i),
                                                       "acc": float(c)}) + "\n" for i, c in enumerate(correct)))


def test_korean_columns_join_a_run_made_where_the_hub_served_them(tmp_path):
    """The same checkpoints' KoBEST results from another machine (same protocol, same checkpoint folder names)
    join their English rows: the Korean columns show scores and the Korean average its paired difference."""
    rng = random.Random(1)
    base = _base_correct(rng)
    res = tmp_path / "results"
    write_harness(res, "base", None, base)
    write_harness(res, "route", "scale-route", _flip(base, rng, 0.1))
    ko_base, ko_route = [i % 2 for i in range(40)], [1] * 40
    _korean_run(res, "ko-base", "/elsewhere/ckpt/base", None, ko_base)
    _korean_run(res, "ko-route", "/elsewhere/ckpt/route", "scale-route", ko_route)
    plot = Plot.of(res)
    runs = protocols(harness_results(plot))["full"]
    assert len(runs) == 2 and sorted(len(r.folders) for r in runs) == [2, 2]
    df, paired = table2_frames(next(r for r in runs if r.run["method"] is None), runs)
    t = df.set_index("method")
    assert t.loc["SCALE-Route", "KoBEST COPA"] == 100.0 and t.loc["base", "KoBEST COPA"] == 50.0
    assert t.loc["base", "KoBEST BoolQ"] == NEEDS_HUB and t.loc["SCALE-Route", "korean_avg"] == 100.0
    assert t.loc["SCALE-Route", "korean_avg_diff"] == pytest.approx(50.0)
    assert set(paired["task"]) >= {"kobest_copa", "korean_avg", "english_avg"}


def test_results_that_cannot_pair_are_left_out_with_why(tmp_path):
    """Two base models in one protocol, or items that are other documents: no table, and the reason."""
    rng = random.Random(2)
    base = _base_correct(rng)
    res = tmp_path / "results"
    write_harness(res, "base-a", None, base)
    write_harness(res, "base-b", None, base)
    d = write_harness(res, "route", "scale-route", base)
    plot = Plot.of(res, tmp_path / "figs")
    plot.files = None
    from scalecl.report.table2 import table2_paper

    assert table2_paper(plot) == []
    assert any("exactly one base model" in why for why in plot.skipped.values())
    (res / "harness" / "base-b" / "run.json").unlink()
    (d / "items.jsonl").write_text((d / "items.jsonl").read_text().replace('"doc_hash": "hellaswag-3"',
                                                                           '"doc_hash": "other"'))
    plot = Plot.of(res, tmp_path / "figs")
    assert table2_paper(plot) == []
    assert any("not the same document" in why for why in plot.skipped.values())


def test_a_second_results_folder_is_marked_yours_and_never_replaces_the_first(results, tmp_path):
    """Table 2 and the harness table over two results folders: a checkpoint evaluated only in the second is a row
    of its own marked '(yours)', never averaged with the first folder's checkpoints of that method; the same
    checkpoint and tasks evaluated in both is the first folder's, the other one 'skipped:' line naming it."""
    res, base, ffts, route = results
    mine = tmp_path / "mine"
    rng = random.Random(1)
    write_harness(mine, "fft-s5-final-1", "fft", _flip(base, rng, 0.4), per_task=100)  # a checkpoint of its own
    again = write_harness(mine, "route-final-1", "scale-route", _flip(base, rng, 0.5), per_task=100)  # the same one
    plot = Plot.of([res, mine])
    runs = protocols(harness_results(plot), plot)["n100-s0"]
    base_run = next(r for r in runs if r.run["method"] is None)
    df, _ = table2_frames(base_run, runs)
    t = df.set_index("method")
    assert list(t.index) == ["base", "FFT", "FFT (yours)", "SCALE-Route"]
    assert t.loc["FFT", "checkpoints"] == 2 and t.loc["FFT (yours)", "checkpoints"] == 1
    route_only = df[df["method"] == "SCALE-Route"]
    assert route_only["ARC-C"].item() == pytest.approx(100 * sum(route["arc_challenge"]) / 40)  # the first folder's
    why = plot.skipped[str(again / "run.json")]
    assert "results/harness/route-final-1" in why and "first results folder's" in why
    out = tmp_path / "figs"
    r = runner.invoke(app, ["plot", "--results", str(res), "--results", str(mine), "--out", str(out), "--formats",
                            "png", "--dpi", "50"])
    assert r.exit_code == 0, r.output
    assert "(yours)" in (out / "table2_n100-s0.md").read_text() and "skipped:" in r.output
    harness = pd.read_csv(out / "table2_harness.csv")
    assert sorted(harness["method"]) == sorted(["base", "base", "fft", "fft", "fft (yours)", "scale-route",
                                                "scale-route", "scale-route (yours)"])
