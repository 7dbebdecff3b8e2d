"""`scalecl plot` over several results folders: the first is the reference, runs from later folders are marked
'(yours)' and kept apart, and of runs with one setting and seeds the first folder's is drawn, the other named in
one printed line and in the inputs file. Synthetic result folders with known numbers."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.experiments.reports import BIO_REPORT
from scalecl.report import Plot, inputs_text, load_runs, summary_table
from tests.report.test_replicates import bio_run

runner = CliRunner()


def committed_and_yours(tmp_path: Path) -> tuple[Path, Path]:
    """results/: FFT on base seeds 0 and 1. runs/: FFT on base seed 1 again (another number, newer) and 2."""
    results, runs = tmp_path / "results", tmp_path / "runs"
    for b, final in ((0, 0.1), (1, 0.2)):
        bio_run(results, "fft", b, final0=final)
    bio_run(runs, "fft", 1, final0=0.9, date="2026-12-05T00:00:00")
    bio_run(runs, "fft", 2, final0=0.3, date="2026-12-05T00:00:00")
    return results, runs


def test_the_first_folder_wins_and_the_other_is_named(tmp_path):
    results, runs = committed_and_yours(tmp_path)
    plot = Plot.of([results, runs])
    df = load_runs(plot, BIO_REPORT)
    ours = df[df["setting"] == ""]
    assert ours["base_seed"].tolist() == [0, 1]
    assert ours.set_index("base_seed").loc[1, "result"]["final"]["task0_heldout"]["acc"] == 0.2  # not runs/'s 0.9
    yours = df[df["setting"] == "yours"]
    assert yours["base_seed"].tolist() == [2]  # base seed 1 of runs/ is left out, seed 2 drawn
    assert df["group"].nunique() == 2  # never averaged with the committed runs
    [(path, why)] = plot.skipped.items()
    assert path.startswith(str(runs)) and "s1-r0" in path
    assert "same setting and seeds (base 1, run 0)" in why and str(results) in why and "first results folder" in why
    text = inputs_text(df, "table")
    assert "drawn instead of" in text and str(runs / "bio") in text


def test_tables_and_legends_mark_runs_from_a_later_folder(tmp_path):
    results, runs = committed_and_yours(tmp_path)
    table = summary_table(Plot.of([results, runs]), BIO_REPORT)
    assert sorted(table["setting"].fillna("")) == ["", "yours"]
    assert table.set_index("setting").loc["yours", "n"] == 1


def test_giving_your_folder_first_makes_it_the_reference(tmp_path):
    results, runs = committed_and_yours(tmp_path)
    df = load_runs(Plot.of([runs, results]), BIO_REPORT)
    mine = df[df["setting"] == ""]
    assert mine["base_seed"].tolist() == [1, 2]
    assert mine.set_index("base_seed").loc[1, "result"]["final"]["task0_heldout"]["acc"] == 0.9
    assert df[df["setting"] == "yours"]["base_seed"].tolist() == [0]  # results/'s base seed 1 left out


def test_within_one_folder_the_newer_is_drawn_and_the_older_named(tmp_path):
    root = tmp_path / "r"
    older = bio_run(root, "fft", 1, final0=0.9, date="2026-11-01T00:00:00")
    bio_run(root, "fft", 1, final0=0.2, date="2026-12-01T00:00:00")
    plot = Plot.of(root)
    df = load_runs(plot, BIO_REPORT)
    assert df["result"].map(lambda r: r["final"]["task0_heldout"]["acc"]).tolist() == [0.2]
    assert list(plot.skipped) == [str(older / "result.json")]
    assert "the newer" in plot.skipped[str(older / "result.json")]


def test_plot_by_default_reads_the_committed_runs_first_and_says_what_it_left_out(tmp_path, monkeypatch):
    committed_and_yours(tmp_path)
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["plot", "--out", "figs"])
    assert res.exit_code == 0, res.output
    said = [ln for ln in res.output.splitlines() if ln.startswith("skipped:")]
    assert len(said) == 1 and "which is drawn instead" in said[0] and said[0].count("s1-r0") == 2
    table = (tmp_path / "figs" / "table_bio.md").read_text()
    assert "yours" in table
    inputs = (tmp_path / "figs" / "table_bio.inputs.txt").read_text()
    assert "drawn instead of runs/bio/" in inputs
