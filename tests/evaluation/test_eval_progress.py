"""Evaluations show progress (issue 22): on a terminal a task of the live bar, in a log file plain lines at the
start, every SCALECL_PROGRESS_EVERY seconds and at the end; counting changes no number."""

from __future__ import annotations

import re

import pytest
import torch
from typer.testing import CliRunner

import scalecl.training.progress as progress_module
from scalecl.cli import app
from scalecl.evaluation.perplexity import perplexity
from scalecl.evaluation.qa import qa_accuracy
from scalecl.methods import get_method
from scalecl.models.build import model_from_config, tiny_config
from scalecl.training.progress import LineProgress, eval_progress, progress_bar

runner = CliRunner()
# the fast biography run of tests/training/test_kill_and_resume.py
BIO = ["train-bio", "--preset", "tiny", "--set", "stage1.steps=24", "--set", "stage2.steps=6", "--set",
       "stage3.steps=12", "--set", "eval.dense_until=6", "--set", "eval.dense_every=3", "--set", "eval.every=6"]
CPT = ["train-cpt", "--preset", "tiny", "--set", "pretrain.steps=8", "--set", "train.steps=8", "--set", "eval.every=4"]


@pytest.fixture
def every_batch(monkeypatch):
    """Progress lines at every update (no interval), the display updated after every batch."""
    monkeypatch.setenv("SCALECL_PROGRESS_EVERY", "0")
    monkeypatch.setattr(progress_module, "EVAL_TICK_S", 0.0)


def test_an_evaluation_in_a_log_prints_its_start_progress_and_end(every_batch):
    lines: list[str] = []
    with LineProgress(write=lines.append):
        with eval_progress("fft: full-range evaluation", 2_400, "questions") as advance:
            for _ in range(3):
                advance(800)
    assert lines[0] == "fft: full-range evaluation: 0/2,400 questions"
    assert lines[1].startswith("fft: full-range evaluation: 800/2,400 questions (33%), 0:00:00 elapsed, ETA ")
    assert lines[-1].startswith("fft: full-range evaluation: 2,400/2,400 questions (100%), 0:00:00 elapsed")
    assert len(lines) == 4 and "ETA" not in lines[-1]


def test_a_quiet_evaluation_prints_only_when_it_outlasts_the_interval(every_batch):
    lines: list[str] = []
    with LineProgress(every=3600, write=lines.append) as display:
        with eval_progress("stage 3: fft: evaluation at step 3", 100, "questions", quiet=True) as advance:
            advance(100)
        assert lines == [] and display.tasks == {}  # a short one: nothing, and its task is gone
        display.every = 0
        with eval_progress("stage 3: fft: evaluation at step 6", 100, "questions", quiet=True) as advance:
            advance(50)
    assert [ln.split(",")[0] for ln in lines] == ["stage 3: fft: evaluation at step 6: 50/100 questions (50%)",
                                                 "stage 3: fft: evaluation at step 6: 100/100 questions (100%)"]


def test_updates_are_throttled_to_the_tick(monkeypatch):
    seen: list[int] = []
    monkeypatch.setattr(LineProgress, "update", lambda self, task, completed=None, **f: seen.append(completed))
    monkeypatch.setattr(progress_module, "EVAL_TICK_S", 3600.0)
    with LineProgress(write=lambda line: None):
        with eval_progress("eval", 1_000, "questions") as advance:
            for _ in range(1_000):
                advance(1)
    assert seen == [1_000]  # a thousand batches, one update: the end


def test_without_a_display_nothing_is_shown(capsys):
    with eval_progress("eval", 10, "questions") as advance:
        advance(10)  # no display entered (a non-main process, a library call): a no-op
        assert progress_module._SHOWING == []  # no display was entered for it
    assert capsys.readouterr() == ("", "")  # and nothing was printed, during or after


def test_on_a_terminal_an_evaluation_is_a_task_of_the_live_bar_removed_at_its_end(monkeypatch, every_batch):
    monkeypatch.setattr("rich.console.Console.is_terminal", property(lambda self: True))
    with progress_bar() as bar:
        assert not isinstance(bar, LineProgress)
        train_task = bar.add_task("stage 3: fft", total=12, loss="2.000")
        with eval_progress("stage 3: fft: evaluation at step 3", 360, "questions", quiet=True) as advance:
            advance(120)
            (task,) = [t for t in bar.tasks if t.id != train_task]
            assert (task.completed, task.total, task.fields["unit"]) == (120, 360, "questions")
            assert [str(c.render(task)) for c in bar.columns if type(c).__name__ == "_FieldsColumn"] == ["questions"]
        assert [t.id for t in bar.tasks] == [train_task]
    assert progress_module._SHOWING == []



@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("exact", [False, True])
def test_counting_questions_changes_no_number(tiny_qa, fast, exact):
    tok, qa = tiny_qa
    torch.manual_seed(0)
    method = get_method("scale-route", hidden_up=32, ffn_up=16, l_fp=1)
    model = method.apply(model_from_config(tiny_config("gpt_neox", vocab_size=len(tok)), seed=3))
    plain = qa_accuracy(model, qa, 64, exact=exact, method=method, fast=fast)
    counts: list[int] = []
    counted = qa_accuracy(model, qa, 64, exact=exact, method=method, fast=fast, progress=counts.append)
    assert counted == plain  # bit-identical
    assert sum(counts) == len(qa) and len(counts) > 1


def test_counting_sequences_changes_no_number():
    model = model_from_config(tiny_config("llama", vocab_size=97), seed=1)
    g = torch.Generator().manual_seed(2)
    chunks = [torch.randint(0, 97, (24,), generator=g) for _ in range(9)] + [torch.randint(0, 97, (7,), generator=g)]
    counts: list[int] = []
    assert perplexity(model, chunks, 4, progress=counts.append) == perplexity(model, chunks, 4)
    assert counts == [4, 4, 1, 1]  # batches by length, longest first


def _evaluation_lines(output: str, desc: str) -> list[tuple[int, int]]:
    """(done, total) of every line of one evaluation's progress in a log."""
    found = re.findall(rf"^{re.escape(desc)}: ([\d,]+)/([\d,]+) \w+", output, flags=re.M)
    return [(int(a.replace(",", "")), int(b.replace(",", ""))) for a, b in found]


def test_biography_run_logs_every_evaluation(tmp_path, every_batch):
    res = runner.invoke(app, [*BIO, "--method", "fft", "--out", str(tmp_path / "out"), "--cache",
                              str(tmp_path / "cache"), "--checkpoints", str(tmp_path / "ckpt")])
    assert res.exit_code == 0, res.output
    out = res.output
    stage2 = _evaluation_lines(out, "stage 2: Task 0 accuracy")
    assert stage2[0][0] == 0 and stage2[-1][0] == stage2[-1][1] > 0  # start ... end
    for step in (0, 3, 6, 12):  # the in-training ones are quiet: no start line, but with no interval they print
        lines = _evaluation_lines(out, f"stage 3: fft: evaluation at step {step}")
        assert lines and lines[-1][0] == lines[-1][1] and all(0 < d <= t for d, t in lines)
    final = _evaluation_lines(out, "fft: full-range evaluation")
    assert final[0][0] == 0 and len(final) >= 3 and final[-1][0] == final[-1][1] > final[1][0] > 0
    assert re.search(r"^fft: full-range evaluation: [\d,]+/[\d,]+ questions \(100%\), 0:00:\d\d elapsed$", out,
                     flags=re.M)
    assert out.index("evaluating the full Task 0") < out.index("fft: full-range evaluation: 0/") < out.index("wrote")


def test_cpt_run_logs_every_evaluation(tmp_path, every_batch):
    res = runner.invoke(app, [*CPT, "--method", "fft", "--out", str(tmp_path / "out"), "--cache",
                              str(tmp_path / "cache"), "--checkpoints", str(tmp_path / "ckpt")])
    assert res.exit_code == 0, res.output
    for step in (0, 4, 8):
        lines = _evaluation_lines(res.output, f"cpt: fft: evaluation at step {step}")
        assert lines[0][0] == 0 and len(lines) >= 3 and lines[-1][0] == lines[-1][1] > lines[1][0] > 0
    assert re.search(r"^cpt: fft: evaluation at step 8: [\d,]+/[\d,]+ sequences \(100%\), 0:00:\d\d elapsed$",
                     res.output, flags=re.M)



def test_eval_ppl_progress_goes_to_stderr(local, tmp_path):
    """`scalecl eval-ppl` shows its progress on stderr (lines when not a terminal); stdout keeps only the record
    (--json)."""
    import json

    r = CliRunner().invoke(app, ["eval-ppl", "--model", str(local / "llama"), "--dataset", str(local / "corpus" / "en"),
                                 "--split", "test", "--take", "3", "--seq-len", "32", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["ppl"] > 1
    assert "eval-ppl: 0/" in r.stderr and "sequences (100%)" in r.stderr
