"""Issue #22's small frictions: fast --help without torch, flags without a type, whole lines off a terminal,
--offline and an unreachable hub in one quick line, whole URLs in errors, one study table labelled by value,
the chance floor and FFT reference in the end-of-run table, no `l_fp=None`, flag names in CLI errors only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from scalecl.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _python(code: str, env: dict | None = None, args: tuple = ()) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return subprocess.run([sys.executable, *args, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env=full | (env or {}), timeout=300)


def test_cli_and_help_do_not_import_torch():
    """Importing the command line (what --help needs) loads neither torch nor transformers; the library's public
    names still work, loaded on first use."""
    code = ("import sys, scalecl.cli, scalecl_launch\n"
            "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'pandas') if m in sys.modules))\n"
            "import scalecl\n"
            "print(scalecl.ScaleConfig(variant='adapt').variant, callable(scalecl.upscale), 'torch' in sys.modules)")
    res = _python(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:2] == ["[]", "adapt True True"]
    # the whole `scalecl --help` path, entry module included: -X importtime lists every module it imported
    res = _python("import sys; sys.argv = ['scalecl', 'train-bio', '--help']; import scalecl_launch; "
                  "scalecl_launch.main()", args=("-X", "importtime"))
    assert "--seeds" in res.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time")}
    assert "scalecl.cli" in imported and not imported & {"torch", "transformers"}


def test_flags_show_no_value_type():
    """A flag takes no value: the help shows none (`--force <bool>` read as if it took one)."""
    for command in ([], ["train-bio"], ["upscale"], ["eval-ppl"]):
        res = runner.invoke(app, [*command, "--help"])
        assert res.exit_code == 0 and "--help" in res.output
        assert "<bool>" not in res.output, command
    assert "--force" in runner.invoke(app, ["train-bio", "--help"]).output


def test_redirected_output_keeps_lines_whole():
    """Off a terminal (a pipe here) a long path is printed on one line, not wrapped at 80 columns."""
    path = "/runs/" + "a-long-folder-name/" * 12 + "result.json"
    res = _python(f"from scalecl.common.consoles import make_console; make_console().print('wrote {path}', "
                  f"highlight=False); make_console(stderr=True).print('error: {path}')")
    assert res.stdout == f"wrote {path}\n" and res.stderr == f"error: {path}\n"


@pytest.mark.slow
def test_offline_and_unreachable_hub_fail_in_one_quick_line(tmp_path):
    """A hub id with --offline, or with a hub that cannot be reached, is one error line at once (without the
    check, huggingface_hub retries every file for 35-53 s first)."""
    for flags, env, why in ((["--offline"], {}, "hub access is off (--offline"),
                            ([], {"HF_ENDPOINT": "http://127.0.0.1:9"}, "the hub (http://127.0.0.1:9) cannot be reached")):
        t0 = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "scalecl_launch", *flags, "upscale", "--model", "nobody/no-model",
                              "--out", str(tmp_path / "up")], capture_output=True, text=True, cwd=ROOT, timeout=300,
                             env={k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"} | env)
        took = time.monotonic() - t0
        assert res.returncode == 2, res.stderr
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: cannot load a config from nobody/no-model")
        assert why in res.stderr and "Retrying" not in res.stderr
        assert took < 30, took  # torch's import included; the retries alone took 35-53 s


@pytest.mark.slow
def test_hub_misses_of_datasets_and_tokenizers_are_one_quick_line(tmp_path, local):
    """The same check before an eval-ppl dataset and an eval-harness tokenizer named by hub id (on a local task:
    a task's data on the hub is checked first, tests/evaluation/test_eval_offline.py)."""
    model = local / "llama"  # a saved tiny model with its tokenizer
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env |= {"HF_ENDPOINT": "http://127.0.0.1:9"}
    (tmp_path / "t.jsonl").write_text('{"q": "a", "choices": ["b", "c"], "label": 0}\n')
    (tmp_path / "local_mc.yaml").write_text(
        f"task: local_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path / 't.jsonl'}\n"
        'output_type: multiple_choice\ntest_split: test\ndoc_to_text: "{{q}}"\ndoc_to_target: "{{label}}"\n'
        'doc_to_choice: "{{choices}}"\n')
    for args, start in ((["eval-ppl", "--model", str(model), "--dataset", "nobody/no-data"],
                         "error: cannot open dataset nobody/no-data"),
                        (["eval-harness", "--model", str(model), "--tasks", str(tmp_path / "local_mc.yaml"),
                          "--tokenizer", "nobody/no-tok", "--out", str(tmp_path / "h")],
                         "error: cannot load tokenizer nobody/no-tok")):
        t0 = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "scalecl_launch", *args], capture_output=True, text=True,
                             cwd=ROOT, timeout=300, env=env)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith(start), res.stderr
        assert "the hub (http://127.0.0.1:9) cannot be reached" in lines[0], lines[0]
        assert "Retrying" not in res.stderr and time.monotonic() - t0 < 60


def test_error_causes_keep_urls_whole():
    from scalecl.common.errors import cause

    url = "'https://huggingface.co/docs/transformers/installation#offline-mode'"
    e = OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the "
                f"cached files.\nCheck your internet connection or see how to run the library in offline mode at {url}.")
    assert url in cause(e) and "\n" not in cause(e)  # the old [:200] cut it at "...installation#offl"
    assert cause(ValueError("word " * 100), 40).endswith(" ...") and len(cause(ValueError("word " * 100), 40)) <= 44


def _bio_result(method: str, name: str, t0: float, base_loss: float = 0.5) -> dict:
    acc = {"acc": t0}
    return {"experiment": "bio", "preset": "tiny", "method": method, "run": {"name": name},
            "seeds": {"base": 0, "run": 0}, "stage1": {"final_loss": 1.0}, "stage2": {"final_loss": base_loss},
            "priors": {"task0_heldout": {"pooled": 0.056}, "task1": {"pooled": 0.061}},
            "summary": {k: t0 for k in ("task0_start", "task0_min", "task0_end", "task1_start", "task1_end")},
            "final": {"task0_heldout": acc, "task1": acc}, "provenance": {"finished": "2026-01-01"}}


def test_bio_summary_shows_chance_floor_and_fft_of_the_same_base(tmp_path, capsys):
    from scalecl.experiments.base import Paths
    from scalecl.experiments.bio import BioExperiment

    for name, loss in (("tiny-fft-aaaa", 0.5), ("tiny-fft-bbbb", 0.9)):  # the second is of another base
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(json.dumps(_bio_result("fft", name, 0.25 if loss == 0.5 else 0.75,
                                                                            loss)))
    exp = SimpleNamespace(paths=Paths(tmp_path), end_table=BioExperiment.end_table)
    BioExperiment.summary(exp, [_bio_result("scale-route", "tiny-scale-route-cccc", 0.5)])
    out = capsys.readouterr().out
    assert "fft (same base: tiny-fft-aaaa)" in out and "tiny-fft-bbbb" not in out and "0.250" in out
    assert "0.750" not in out
    chance = next(line for line in out.splitlines() if "chance" in line)
    assert "0.056" in chance and "0.061" in chance


def test_a_study_table_shows_the_main_runs_fft_of_the_same_base(tmp_path, capsys):
    """A study writes into <out>/<study>/; its table finds the FFT run among the main runs, <out>/../bio."""
    from scalecl.experiments.args import Replicate
    from scalecl.experiments.base import Paths
    from scalecl.experiments.bio import BioExperiment
    from scalecl.experiments.study import experiments

    main = tmp_path / "bio"
    for name, loss in (("tiny-fft-aaaa", 0.5), ("tiny-fft-bbbb", 0.9)):  # the second is of another base
        (main / name).mkdir(parents=True)
        (main / name / "result.json").write_text(json.dumps(_bio_result("fft", name, 0.25 if loss == 0.5 else 0.75,
                                                                        loss)))
    _, exps = experiments("tau", "tiny", "0.9;-1", Replicate([], {}), Paths(tmp_path / "studies"))
    assert all(exp.paths.out == tmp_path / "studies" / "tau" and exp.paths.shared == (main,) for _, exp in exps)
    route = _bio_result("scale-route", "tiny-scale-route-cccc", 0.5)
    BioExperiment.summary(exps[0][1], [route], ["scale-route tau=0.9"])
    out = capsys.readouterr().out
    assert "fft (same base: tiny-fft-aaaa)" in out and "tiny-fft-bbbb" not in out and "0.250" in out
    BioExperiment.summary(SimpleNamespace(paths=Paths(tmp_path / "studies" / "tau"), end_table=BioExperiment.end_table),
                          [route])  # no main runs
    assert "fft" not in capsys.readouterr().out


def test_study_prints_one_table_labelled_by_value(monkeypatch, capsys, tmp_path):
    """One table for the whole study, a row per value (not one table per value, each labelled `scale-route`)."""
    from scalecl.experiments import study, sweep

    class Exp:
        from scalecl.experiments.base import Paths
        paths = Paths(tmp_path)
        from scalecl.experiments.bio import BioExperiment
        summary = BioExperiment.summary
        end_table = BioExperiment.end_table

    values = ["-1", "0.9"]
    monkeypatch.setattr(study, "experiments", lambda *a: (study.STUDIES["tau"], [(v, Exp()) for v in values]))
    monkeypatch.setattr(sweep, "check", lambda *a: (None, {"scale-route": None}))  # run_study imports them when it runs
    monkeypatch.setattr(study, "find_shared", lambda *a: None)
    monkeypatch.setattr(sweep, "check_ahead", lambda *a: None)
    monkeypatch.setattr(sweep, "sweep", lambda exp, methods, opts, summary=True: (
        [_bio_result("scale-route", "r", 0.5)] if not summary else exp.fail()))
    study.run_study("tau", "tiny", None, [], SimpleNamespace(out=tmp_path))
    out = capsys.readouterr().out
    assert out.count("biography: hard first-token accuracy") == 1
    assert "scale-route tau=-1" in out and "scale-route tau=0.9" in out


def test_captions_say_what_l_fp_none_means():
    from scalecl.report import l_fp_text

    route = {"method": "scale-route", "config": {"model": {"layers": 4}}}
    assert l_fp_text(None, route) == "l_fp=auto (L-1, only the top layer's W12 trains: 3)"
    assert l_fp_text(None, {"method": "scale-preserve"}) == "l_fp=auto (L, every layer preserved)"
    assert l_fp_text(2, route) == "l_fp=2" and l_fp_text(float("nan")).startswith("l_fp=auto")


def test_overwrite_error_names_the_flag_on_the_cli_and_the_argument_in_the_library(tmp_path):
    import pytest

    from scalecl.common.errors import ScaleclError
    from scalecl.training.checkpoint import check_checkpoint_dest

    out = tmp_path / "ck"
    args = ["upscale", "--random-config", "gpt_neox", "--hidden-up", "16", "--ffn-up", "16", "--out", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "pass --overwrite to replace it" in res.output and "overwrite=True" not in res.output
    with pytest.raises(ScaleclError) as e:
        check_checkpoint_dest(out)
    assert "pass overwrite=True to replace it" in str(e.value) and "--overwrite" not in str(e.value)


def _commands() -> list[str]:
    import typer

    return sorted(typer.main.get_command(app).commands)


@pytest.mark.parametrize("command", _commands())
def test_help_never_cuts_a_word(command):
    """`--help` at 80 and at 40 columns cuts nothing: rich marks a cut with "…", and a word wider than its column
    (a list of file types, a long default) wraps onto the next line instead."""
    for width in (80, 40):
        res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": str(width)})
        assert res.exit_code == 0 and "…" not in res.output, (width, res.output)


def test_a_long_word_of_a_help_text_wraps_whole():
    import re

    res = CliRunner().invoke(app, ["eval-ppl", "--help"], env={"COLUMNS": "80"})
    flat = re.sub(r"[\s│]", "", res.output)
    assert "(.txt/.jsonl/.json/.parquet/.csv/.arrow)" in flat and "(HuggingFaceFW/fineweb-edu)" in flat
