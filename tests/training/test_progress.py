"""Progress when the output is not a terminal (log files, nohup, CI): plain lines, not silence."""

from __future__ import annotations

import time

from scalecl.training.progress import LineProgress, progress_bar


def test_line_progress_reports_start_throttled_updates_and_completion():
    lines: list[str] = []
    p = LineProgress(every=3600, write=lines.append)
    with p:
        task = p.add_task("stage 1: pre-train", total=10, loss="-")
        for step in range(1, 10):
            p.update(task, completed=step, loss=f"{1 / step:.3f}")
        assert lines == ["stage 1: pre-train: step 0/10"]  # throttled: nothing between
        p.update(task, completed=10, loss="0.100")
    assert len(lines) == 2 and lines[1].startswith("stage 1: pre-train: step 10/10 (100%) loss 0.100, 0:00:0")
    assert "ETA" not in lines[1]


def test_line_progress_gives_a_remaining_time_from_the_rate_since_start():
    lines: list[str] = []
    p = LineProgress(every=0, write=lines.append)
    task = p.add_task("stage 3: fft", total=100, completed=20)  # resumed at step 20
    time.sleep(0.05)
    p.update(task, completed=40, loss="2.000")
    assert lines[-1].startswith("stage 3: fft: step 40/100 (40%) loss 2.000, ") and ", ETA 0:00:0" in lines[-1]


def test_progress_bar_is_plain_lines_when_output_is_not_a_terminal():
    assert isinstance(progress_bar(), LineProgress)  # pytest captures the output: not a terminal
