"""A user's mistake on the command line is one `error:` line before torch, transformers or datasets load.

Each case runs the `scalecl` entry point (scalecl_launch) in a fresh process whose exit hook reports the heavy
modules it imported, so the check is what was imported, not a wall-clock time (the machine's load would decide
that). The times these take are in benchmarks/README.md ("One-line errors", bench_cli_errors.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "datasets", "peft", "pandas", "matplotlib", "lm_eval")

# the entry point, then one line on stderr naming the heavy modules the process imported
PROBE = f"""
import atexit, sys
atexit.register(lambda: sys.stderr.write("HEAVY:" + ",".join(m for m in {HEAVY!r} if m in sys.modules) + "\\n"))
sys.argv = ["scalecl", *sys.argv[1:]]
import scalecl_launch
sys.exit(scalecl_launch.main())
"""

# (arguments, words of the error line); {tmp} is a fresh folder of the test's (absolute: a relative owner/name
# path that does not exist may be a hub id, which only the loader can tell)
CASES = [
    (["train-bio", "--method", "nosuch"], "unknown method 'nosuch'"),
    (["train-bio", "--method", "fft,fft"], "more than once"),
    (["train-bio", "--preset", "nosuch"], "unknown preset 'nosuch'"),
    (["train-bio", "--set", "stage1.steps=abc"], "stage1.steps expects an integer"),
    (["train-bio", "--set", "nokey=1"], "unknown config key nokey"),
    (["train-bio", "--set", "stage3.lr=-1"], "stage3.lr"),
    (["train-bio", "--set", "methods.scale.hidden_up=-1"], "hidden_up must be an integer"),
    (["train-bio", "--set", "lr_scale.nosuch=1"], "unknown method lr_scale.nosuch"),
    (["train-bio", "--seeds", "a"], "--seeds takes integers"),
    (["train-bio", "--stop-after", "0"], "--stop-after must be a step"),
    (["train-bio", "--device", "gpu"], "unknown device 'gpu'"),
    (["train-bio", "--report-to", "nosuch"], "--report-to 'nosuch'"),
    (["train-bio", "--tokenizer", "{tmp}/no-tokenizer"], "tokenizer path"),
    (["train-cpt", "--data", "{tmp}/missing.txt"], "dataset path"),
    (["train-cpt", "--old-eval", "{tmp}/none/*.txt"], "matches no file"),
    (["train-cpt", "--model", "{tmp}/missing-model"], "model path"),
    (["train-cpt", "--model", "{tmp}/missing.gguf"], "GGUF file"),
    (["train-cpt", "--preset", "real", "--set", "lr.fft=0"], "lr.fft must be > 0"),
    (["train-cpt", "--text-unit", "page", "--data", "{tmp}/missing.txt"], "--text-unit must be one of"),
    (["study", "nosuch"], "unknown study 'nosuch'"),
    (["study", "tau", "--values", "0.5;2"], "tau value '2'"),
    (["study", "l_fp", "--preset", "nosuch"], "unknown preset 'nosuch'"),
    (["upscale", "--out", "{tmp}/up", "--random-config", "llama", "--hidden-up", "-3"], "hidden_up must be"),
    (["upscale", "--out", "{tmp}/up", "--model", "{tmp}/missing-model"], "model path"),
    (["upscale", "--out", "{tmp}/up"], "exactly one of --model"),
    (["prepare", "--method", "nosuch", "--out", "{tmp}/p"], "unknown method 'nosuch'"),
    (["prepare", "--method", "lora", "--set", "rank=0", "--out", "{tmp}/p", "--random-config", "llama"], "lora rank"),
    (["merge", "--model", "{tmp}/missing-model", "--out", "{tmp}/m"], "does not exist"),
    (["eval-ppl", "--model", "{tmp}/missing-model", "--data", "builtin:en"], "model path"),
    (["eval-ppl", "--model", "{tmp}", "--data", "{tmp}/missing.txt"], "dataset path"),
    (["eval-ppl", "--model", "{tmp}", "--data", "builtin:en", "--device", "tpu"], "unknown device 'tpu'"),
    (["eval-harness", "--model", "{tmp}/missing-model"], "model path"),
    (["plot", "--results", "{tmp}/missing-results"], "results folder"),
    (["plot", "--formats", "bmp"], "--formats"),
]


def run_probe(args: list[str], cwd: Path, before: str = "", **more: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALECL_")} | more
    env |= {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-c", before + PROBE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=cwd)


def finish(proc: subprocess.Popen) -> tuple[int, list[str], list[str]]:
    """(exit code, stderr lines other than the probe's, heavy modules imported)."""
    _, err = proc.communicate(timeout=300)
    lines = err.strip().splitlines()
    heavy = [ln for ln in lines if ln.startswith("HEAVY:")]
    assert len(heavy) == 1, err[-2000:]
    return proc.returncode, [ln for ln in lines if not ln.startswith("HEAVY:")], \
        [m for m in heavy[0].removeprefix("HEAVY:").split(",") if m]


def test_every_one_line_error_comes_before_torch_loads(tmp_path):
    tmp = tmp_path / "t"
    tmp.mkdir()
    procs = []
    for i in range(0, len(CASES), 8):  # a few at a time: the machine may have 2 cores
        batch = [(args, words, run_probe([a.replace("{tmp}", str(tmp)) for a in args], tmp_path))
                 for args, words in CASES[i:i + 8]]
        procs += [(args, words, finish(p)) for args, words, p in batch]
    for args, words, (code, lines, heavy) in procs:
        shown = " ".join(args)
        assert code == 2, (shown, lines)
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], (shown, lines)
        assert heavy == [], f"scalecl {shown}: imported {', '.join(heavy)} before its error line"
    assert not any(tmp.iterdir())  # nothing written


def test_the_probe_sees_torch_when_it_was_imported(tmp_path):
    """The probe can fail: a process that imported torch before the command reports it."""
    code, lines, heavy = finish(run_probe(["plot", "--results", "missing"], tmp_path, before="import torch\n",
                                           SCALECL_CPU_DEFAULTS="0"))  # no note on torch first
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "torch" in heavy


def test_help_loads_no_torch(tmp_path):
    commands = ["train-bio", "train-cpt", "study", "eval-ppl", "upscale", "plot"]
    for command, proc in [(c, run_probe([c, "--help"], tmp_path)) for c in commands]:
        code, _, heavy = finish(proc)
        assert code == 0 and heavy == [], (command, heavy)


def test_plot_checks_the_formats_the_report_saves():
    """`plot --formats` is checked before the report loads, against its own list: the report's, the same."""
    from scalecl.cli.plot import SAVE_FORMATS
    from scalecl.report.draw import SAVE_FORMATS as saved

    assert SAVE_FORMATS == saved
