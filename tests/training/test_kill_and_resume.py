"""The run layer's guarantees, tried as a user would break them: kill -9 at any moment then --resume, a
checkpoint of another run, a planted pickle, a diverging run, a folder of someone else's files.

Runs that are killed run in subprocesses (SIGKILL, no clean-up). `SCALECL_CRASH_AT=<point>[:n]` kills the
process the n-th time it reaches a named moment (inside checkpoint and result writing, where a timer would
rarely land); other kills come after a random delay. The runs that continue them (--resume) and the uninterrupted
reference runs run in this process (typer's CliRunner): a resume reads only what the killed process left on disk.
The reference runs are made once per session (across pytest-xdist workers); their cache (stages 1-2 of the
biography experiment, the CPT base) is copied to the tests whose runs start after those stages, so that only the
kill points inside stage 1 or the base train them again.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.training.state import load_state
from tests.conftest import build_once, copy_shared

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
BIO = ["train-bio", "--preset", "tiny", "--set", "stage1.steps=24", "--set", "stage2.steps=6", "--set",
       "stage3.steps=12", "--set", "eval.dense_until=6", "--set", "eval.dense_every=3", "--set", "eval.every=6",
       "--set", "checkpoint.every=4", "--set", "checkpoint.keep=2"]
CPT = ["train-cpt", "--preset", "tiny", "--set", "pretrain.steps=8", "--set", "train.steps=8", "--set",
       "eval.every=4", "--set", "checkpoint.every=2", "--set", "checkpoint.keep=2"]
ENV = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def folders(root: Path) -> list[str]:
    return ["--out", str(root / "out"), "--cache", str(root / "cache"), "--checkpoints", str(root / "ckpt")]


def cli(args: list[str], crash: str | None = None, kill_after: float | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess | None:
    """`scalecl ARGS` in a fresh process (None when it was killed after `kill_after` seconds)."""
    env = ENV | ({"SCALECL_CRASH_AT": crash} if crash else {})
    cmd = [sys.executable, "-m", "scalecl.cli", *args]
    if kill_after is None:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    time.sleep(kill_after)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return None


WALL_TIME = ("seconds", "tokens_per_s", "model_tflops", "mfu")  # step-log keys measured with a clock


def outcome(root: Path) -> dict:
    """Everything a finished run reports: evaluation records, step log (less wall times), final numbers."""
    out = {}
    for run in sorted((root / "out").iterdir()):
        result = json.loads((run / "result.json").read_text())
        log = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
        out[run.name] = {
            "metrics": (run / "metrics.jsonl").read_text(),
            "log": [{k: v for k, v in r.items() if k not in WALL_TIME} for r in log],
            "final": result["final"], "summary": result["summary"],
        }
    return out


def run_method(run: Path) -> str:
    """The method of a run folder named `tiny-<method>-<hash>`."""
    return run.name.removeprefix("tiny-").rsplit("-", 1)[0]


def leftovers(root: Path) -> list[str]:
    """Temporary (hidden) files and folders and partial files anywhere under root. The hidden `.<name>.lock`
    files of runs and cache entries are no temporaries: they stay, empty, beside what they lock; nor is a run
    folder's record of the files it wrote (`.scalecl-run-files.json`, scalecl.common.files.OwnedFiles)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if (p.name.startswith(".") and not
                  (p.name.endswith(".lock") and p.is_file() and p.stat().st_size == 0)
                  and p.name != ".scalecl-run-files.json") or p.name.endswith(".partial"))


def _reference_runs(root: Path) -> None:
    for name, args in (("bio", BIO), ("cpt", CPT)):
        res = runner.invoke(app, [*args, "--method", "fft,scale-route", *folders(root / name)])
        assert res.exit_code == 0, res.output


@pytest.fixture(scope="session")
def reference_root(tmp_path_factory) -> Path:
    """Uninterrupted runs of both experiments (`bio/`, `cpt/`: out, cache, ckpt), made once per session."""
    return build_once(tmp_path_factory, "kill-reference", _reference_runs)


@pytest.fixture(scope="session")
def reference(reference_root):
    """The numbers every interrupted run must end with."""
    return {name: outcome(reference_root / name) for name in ("bio", "cpt")}


def warm(root: Path, reference_root: Path, experiment: str) -> Path:
    """root/cache: a copy of the reference runs' cache (biography stages 1-2 and tokenizer, or the CPT base)."""
    return copy_shared(reference_root / experiment / "cache", root / "cache")


# (experiment, crash point, warm) — inside a stage-1 / base checkpoint, a method checkpoint, the final files.
# Warm: the run starts with the reference's cache, so its first checkpoint is a method's (fft's step 4)
KILLS = [  # bio: stage 1 checkpoints at steps 4..24 (6), stage 2 at 4 (1), then each method at 4 and 8 (12 is its end)
    ("bio", "checkpoint-model-written:2", False),  # stage 1's second checkpoint, between its model and its state
    ("bio", "checkpoint-state-written:2", True),  # fft's step-8 checkpoint, complete but not yet renamed into place
    ("bio", "final-model-written:1", True),  # fft finished (stages 1, 2 cached): final model written, results not yet
    ("bio", "metrics-written:2", True),  # scale-route: metrics.jsonl written, result.json not yet
    ("bio", "checkpoint-renamed:4", True),  # scale-route's step-8 checkpoint: resumed, Route measures its never rows again
    # cpt: the base's checkpoints at steps 2, 4, 6, 8 (4), then each method at 2, 4, 6 (8 is its end)
    ("cpt", "checkpoint-renamed:2", False),  # the base's step-4 checkpoint, just renamed into place
    ("cpt", "checkpoint-model-written:2", True),  # fft's step-4 checkpoint, between its model and its state
    ("cpt", "metrics-written:1", True),  # fft: after metrics.jsonl, before result.json
]
# the run each kill lands in: the method whose checkpoint or files were being written (None: a cached stage)
KILLED_IN = {"checkpoint-model-written:2": {"bio": None, "cpt": "fft"}, "checkpoint-state-written:2": {"bio": "fft"},
             "final-model-written:1": {"bio": "fft"}, "metrics-written:2": {"bio": "scale-route"},
             "checkpoint-renamed:4": {"bio": "scale-route"}, "checkpoint-renamed:2": {"cpt": None},
             "metrics-written:1": {"cpt": "fft"}}


@pytest.mark.slow  # the session's `reference` runs are made by the first test that asks for them
@pytest.mark.parametrize("experiment,crash,cached", KILLS)
def test_kill_at_a_named_moment_then_resume(tmp_path, reference_root, reference, experiment, crash, cached):
    if cached:
        warm(tmp_path, reference_root, experiment)
    args = [*(BIO if experiment == "bio" else CPT), "--method", "fft,scale-route", *folders(tmp_path)]
    killed = cli(args, crash=crash)
    assert killed.returncode == -signal.SIGKILL, (crash, killed.stdout[-1500:], killed.stderr[-1500:])
    # where it landed: no method after the one killed has a run folder; none but those before it finished
    method = KILLED_IN[crash][experiment]
    done = {run_method(p.parent) for p in (tmp_path / "out").glob("*/result.json")}
    started = {run_method(p) for p in (tmp_path / "ckpt" / experiment).glob("tiny-*")}
    assert done == ({"fft"} if method == "scale-route" else set()), (crash, done)
    assert method in started if method else started == set(), (crash, started)
    res = runner.invoke(app, [*args, "--resume"])
    assert res.exit_code == 0, res.output
    assert outcome(tmp_path) == reference[experiment]
    assert leftovers(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["bio", "cpt"])
def test_kill_at_random_moments_then_resume(tmp_path, reference, experiment):
    args = [*(BIO if experiment == "bio" else CPT), "--method", "fft,scale-route", *folders(tmp_path)]
    rng = random.Random(experiment)
    for _ in range(3):  # each kill lands somewhere in data preparation, training, checkpointing or writing
        cli([*args, "--resume"], kill_after=rng.uniform(4.0, 12.0))
    res = runner.invoke(app, [*args, "--resume"])
    assert res.exit_code == 0, res.output
    assert outcome(tmp_path) == reference[experiment]
    assert leftovers(tmp_path) == []


@pytest.fixture
def cpt_cache(tmp_path, reference_root) -> Path:
    """tmp_path/cache holding the CPT base of the reference runs (these tests start after it)."""
    return warm(tmp_path, reference_root, "cpt")


def _stopped_run(root: Path, method: str) -> Path:
    """A tiny cpt run of `method` stopped at step 4 with checkpoints; returns its checkpoint folder."""
    res = runner.invoke(app, [*CPT, "--method", method, *folders(root), "--stop-after", "4"])
    assert res.exit_code == 0, res.output
    (ckpt,) = (root / "ckpt" / "cpt").glob(f"tiny-{method}-*")
    return ckpt


def test_resume_refuses_a_checkpoint_of_another_run(tmp_path, cpt_cache):
    fft = _stopped_run(tmp_path, "fft")
    route = _stopped_run(tmp_path, "scale-route")
    shutil.rmtree(route)
    shutil.copytree(fft, route)  # an FFT checkpoint where the Route run looks for its own
    res = runner.invoke(app, [*CPT, "--method", "scale-route", *folders(tmp_path), "--resume"])
    assert res.exit_code == 2 and "belongs to another run" in res.output, res.output
    assert not list((tmp_path / "out").glob("*/result.json"))


def test_resume_refuses_a_model_of_another_method(tmp_path, cpt_cache):
    fft = _stopped_run(tmp_path, "fft")
    route = _stopped_run(tmp_path, "scale-route")
    (step,) = [p for p in route.iterdir() if p.name == "step-0000004"]
    shutil.rmtree(step / "model")
    shutil.copytree(fft / "step-0000004" / "model", step / "model")  # right identity, wrong model inside
    res = runner.invoke(app, [*CPT, "--method", "scale-route", *folders(tmp_path), "--resume"])
    assert res.exit_code == 2 and "is damaged" in res.output, res.output  # its manifest records other files
    from scalecl.common.files import fingerprints, large_digests, write_json
    from scalecl.training.run import CKPT_MANIFEST, RUN_WRITER

    skip = (CKPT_MANIFEST,)  # a manifest made to match: the method check behind verification refuses it
    write_json(step / CKPT_MANIFEST, {"written_by": RUN_WRITER, "written": fingerprints(step, skip=skip),
                                      "digests": large_digests(step, skip=skip)})
    res = runner.invoke(app, [*CPT, "--method", "scale-route", *folders(tmp_path), "--resume"])
    assert res.exit_code == 2 and "refusing to resume" in res.output, res.output


def test_existing_checkpoints_need_resume_or_force(tmp_path, cpt_cache):
    _stopped_run(tmp_path, "fft")
    res = runner.invoke(app, [*CPT, "--method", "fft", *folders(tmp_path)])
    assert res.exit_code == 2 and "--resume continues it, --force starts it over" in res.output, res.output
    res = runner.invoke(app, [*CPT, "--method", "fft", *folders(tmp_path), "--force"])
    assert res.exit_code == 0, res.output
    assert len(list((tmp_path / "out").glob("*/result.json"))) == 1


class _Exploit:
    """A pickle that runs code when loaded (what a torch.load(weights_only=False) would execute)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_is_never_loaded(tmp_path, cpt_cache):
    ckpt = _stopped_run(tmp_path, "fft")
    marker = tmp_path / "pwned"
    for step in ckpt.glob("step-*"):
        (step / "trainer_state.pt").write_bytes(pickle.dumps({"x": _Exploit(marker)}))
    planted = ckpt / "step-0000009"  # a newer "checkpoint" made of the pickle alone
    planted.mkdir()
    (planted / "trainer_state.pt").write_bytes(pickle.dumps(_Exploit(marker)))
    state = load_state(ckpt / "step-0000004")  # the state a resume uses: JSON + safetensors
    assert state["run"]["method"] == "fft" and state["step"] == 4
    res = runner.invoke(app, [*CPT, "--method", "fft", *folders(tmp_path), "--resume"])
    assert res.exit_code == 0, res.output
    assert "resuming from" in res.output and "step-0000004" in res.output
    assert not marker.exists()
    assert not [ln for p in (REPO / "scalecl").rglob("*.py") for ln in p.read_text().splitlines()
                if "weights_only=False" in ln.replace(" ", "") or "pickle.load" in ln]


@pytest.mark.parametrize("experiment", ["bio", "cpt"])
def test_a_diverging_run_stops_and_records_nothing(tmp_path, reference_root, experiment):
    warm(tmp_path, reference_root, experiment)  # stages 1-2 or the base: the reference runs'
    args = [*(BIO if experiment == "bio" else CPT), "--method", "fft", *folders(tmp_path)]
    lr = ["--set", "stage3.lr=1e30"] if experiment == "bio" else ["--set", "lr.fft=1e30"]
    res = runner.invoke(app, [*args, *lr])
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "training diverged at step" in lines[0] and "nan" in lines[0], res.output
    assert not list((tmp_path / "out").rglob("result.json")) and not list((tmp_path / "out").rglob("metrics.jsonl"))
    assert "no checkpoint had been written" in lines[0] or "last good checkpoint" in lines[0]
    again = runner.invoke(app, [*args, *lr])  # not skipped as finished: it diverges again
    assert again.exit_code in (1, 2) and "finished run found" not in again.output


@pytest.mark.slow
def test_foreign_files_survive_every_output_folder(tmp_path):
    """--out, --cache and --checkpoints pointed at a folder of someone else's files: they stay as they were."""
    mine = tmp_path / "mine"
    (mine / "notes").mkdir(parents=True)
    (mine / "notes" / "paper.tex").write_text("\\section{Results}\n")
    (mine / "data.csv").write_text("a,b\n1,2\n")
    (mine / "metrics.jsonl").write_text("mine\n")  # a file named like ours, at the top: not in a run folder
    before = {p: p.read_bytes() for p in mine.rglob("*") if p.is_file()}
    for args in ([*BIO, "--method", "fft", "--out", str(mine), "--cache", str(mine), "--checkpoints", str(mine)],
                 [*CPT, "--method", "lora", "--out", str(mine), "--cache", str(mine), "--checkpoints", str(mine)]):
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["plot", "--results", str(mine), "--out", str(mine)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["study", "tau", "--preset", "tiny", "--values", "-1", *BIO[3:], "--out", str(mine),
                              "--cache", str(mine), "--checkpoints", str(mine)])
    assert res.exit_code == 0, res.output
    (final,) = (mine / "cpt").glob("tiny-lora-*/final")
    ppl = mine / "notes" / "ppl.json"
    res = runner.invoke(app, ["eval-ppl", "--model", str(final), "--dataset", "builtin:en", "--take", "4",
                              "--seq-len", "32", "--cache", str(mine), "--out", str(mine / "notes" / "paper.tex")])
    assert res.exit_code == 2 and "not a record written by eval-ppl" in res.output, res.output
    res = runner.invoke(app, ["eval-ppl", "--model", str(final), "--dataset", "builtin:en", "--take", "4",
                              "--seq-len", "32", "--cache", str(mine), "--out", str(ppl)])
    assert res.exit_code == 0, res.output
    assert {p: p.read_bytes() for p in before} == before
