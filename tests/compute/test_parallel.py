"""Several processes on CPU (torchrun, gloo): FSDP2 for train-cpt and train-bio, DDP for train-bio.

What must hold (issue #14): a 2-process FSDP run gives the numbers of a 1-process run with the same global
batch (float tolerance), across a stop and --resume (optimizer state gathered, saved as safetensors + JSON
and sharded again); its checkpoints are full models that `scalecl.load_model` reads; SCALE-Route's custom
autograd function and fork hook work sharded; the biography experiment runs under torchrun too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalecl.experiments.config import CorpusConfig
from scalecl.experiments.eval_ppl import eval_ppl
from scalecl.training.checkpoint import load_model
from scalecl.training.record import checkpoint_dir
from scalecl.training.state import load_state
from tests.conftest import local_sets, records, run

REPO = Path(__file__).resolve().parents[2]
ENV = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def torchrun(args: list[str], cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "scalecl.cli", *args, "--device", "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.xdist_group("torchrun")  # conftest.GROUPS: one 2-process run at a time
@pytest.mark.slow
def test_fsdp_two_processes_match_one_process_across_a_resume(tmp_path, local):
    sets = local_sets(local, "llama", "train.micro_batch=2", "checkpoint.every=2")
    single = {r["method"]: r for r in run(tmp_path / "one", sets, ["fft", "scale-route"])}
    two = tmp_path / "two"
    args = ["train-cpt", "--preset", "tiny", "--method", "fft,scale-route", "--out", str(two / "out"), "--cache",
            str(two / "cache"), "--checkpoints", str(two / "runs")]
    args += [x for s in [*sets, "compute.parallel=fsdp"] for x in ("--set", s)]
    torchrun([*args, "--stop-after", "3"], tmp_path)
    assert not list((two / "out").glob("*/result.json"))
    torchrun([*args, "--resume"], tmp_path)
    for method in single:
        ((run_dir, res),) = [(p.parent, json.loads(p.read_text()))
                             for p in (two / "out").glob(f"tiny-{method}-*/result.json")]
        final = checkpoint_dir(res, run_dir)  # recorded relative to the run folder
        assert res["processes"] == 2 and res["resumed_from_step"] == 3
        assert res["speed"]["parallel"]["mode"] == "fsdp"
        for a, b in zip(records(two / "out", method), records(tmp_path / "one" / "out", method), strict=True):
            assert a["step"] == b["step"]
            for key in ("loss", "old/ppl", "new/ppl", "rep_cos", "up_norm"):  # fp32 reduction order, 6 steps
                if b.get(key) is None:
                    assert a.get(key) is None, (method, a["step"], key)
                else:
                    assert a[key] == pytest.approx(b[key], rel=1e-4), (method, a["step"], key)
        # the checkpoint's optimizer state is the full, name-keyed state dict (gathered to rank 0)
        ckpt = sorted((two / "runs" / "cpt" / final.parent.name).glob("step-*"))[-1]
        opt = load_state(ckpt)["optimizer"]
        names = [n for g in opt["param_groups"] for n in g["params"]]
        assert names and all(isinstance(n, str) for n in names) and set(opt["state"]) == set(names)
        # the final model is a full checkpoint: loaded alone, it scores the last evaluation's new-domain PPL
        model = load_model(final)
        assert sum(p.numel() for p in model.parameters() if p.requires_grad) == res["trainable_params"]
        ppl = eval_ppl(str(final), CorpusConfig(path=str(local / "corpus" / "ko"), split="test"), 32, 16,
                           tmp_path / "cache")
        assert ppl["ppl"] == pytest.approx(res["final"]["new/ppl"], rel=1e-5)


def test_position_keyed_optimizer_state_loads_by_name():
    """A 1-process / DDP checkpoint's optimizer state (keyed by position) resumes where states are keyed by
    name (FSDP), and the other way round: the moments land on the same parameters."""
    from scalecl.compute.parallel import _by_name, load_optimizer_state
    from scalecl.models.build import model_from_config, tiny_config
    from scalecl.training.loop import OptimConfig, make_optimizer

    def stepped():
        m = model_from_config(tiny_config("llama"), seed=0)
        opt, _ = make_optimizer(m, OptimConfig(lr=1e-2), 3)
        ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
        m(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        return m, opt

    m, opt = stepped()
    named = _by_name(m, opt, opt.state_dict())
    m2, _ = stepped()
    opt2, _ = make_optimizer(m2, OptimConfig(lr=1e-2), 3)
    load_optimizer_state(m2, opt2, named)  # name-keyed into a plain optimizer
    for (n, p), (_, p2) in zip(m.named_parameters(), m2.named_parameters(), strict=True):
        if p.requires_grad:
            for k in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(opt2.state[p2][k], opt.state[p][k], rtol=0, atol=0, msg=n)


@pytest.mark.xdist_group("torchrun")  # conftest.GROUPS: one 2-process run at a time
@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_bio_under_torchrun_matches_one_process(tmp_path, parallel):
    """train-bio, 2 processes: stages 1-3 sharded by rows of every global batch, the same numbers as one
    process with the same micro-batches (accumulation 2), every process evaluating in lock-step. The FSDP
    run also recomputes every block in the backward (activation checkpointing inside the shards)."""
    from typer.testing import CliRunner

    from scalecl.cli import app

    common = ["train-bio", "--preset", "tiny", "--method", "scale-route", "--set", "stage1.steps=6",
              "--set", "stage2.steps=3", "--set", "stage3.steps=4", "--set", "eval.dense_until=2", "--set",
              "eval.dense_every=2", "--set", "eval.every=4", "--set", "compute.micro_batch=4",
              "--set", "stage1.batch=8", "--set", "stage2.batch=8", "--set", "stage3.batch=8"]
    one = tmp_path / "one"
    res = CliRunner().invoke(app, [*common, "--out", str(one / "out"), "--cache", str(one / "cache"),
                                   "--checkpoints", str(one / "ck"), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    two = tmp_path / "two"
    ckpt = ["--set", "compute.activation_checkpointing=true"] if parallel == "fsdp" else []  # recompute, sharded
    torchrun([*common, *ckpt, "--set", f"compute.parallel={parallel}", "--out", str(two / "out"), "--cache",
              str(two / "cache"), "--checkpoints", str(two / "ck")], tmp_path)
    (r1,) = [json.loads(p.read_text()) for p in (one / "out").glob("*/result.json")]
    ((r2_dir, r2),) = [(p.parent, json.loads(p.read_text())) for p in (two / "out").glob("*/result.json")]
    assert r1["speed"]["parallel"]["mode"] == "single" and r2["speed"]["parallel"]["mode"] == parallel
    assert r2["speed"]["parallel"]["activation_checkpointing"] is (parallel == "fsdp")
    assert r1["accumulation"] == {"stage1": 2, "stage2": 2, "stage3": 2}
    assert r2["accumulation"] == {"stage1": 1, "stage2": 1, "stage3": 1} and r2["processes"] == 2
    assert r2["stage2"]["final_loss"] == pytest.approx(r1["stage2"]["final_loss"], rel=1e-4)
    m1 = [json.loads(x) for x in next((one / "out").glob("*/metrics.jsonl")).read_text().splitlines()]
    m2 = [json.loads(x) for x in next((two / "out").glob("*/metrics.jsonl")).read_text().splitlines()]
    assert [r["step"] for r in m2] == [r["step"] for r in m1] == [0, 2, 4]
    for a, b in zip(m2, m1, strict=True):
        for key in ("loss", "task0/soft_acc", "task1/soft_acc", "task0/acc"):  # fp32 reduction order
            assert (a[key] is None and b[key] is None) or a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    model = load_model(checkpoint_dir(r2, r2_dir))  # the final model, gathered and saved by rank 0
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == r2["trainable_params"]


@pytest.mark.xdist_group("torchrun")  # conftest.GROUPS: one 2-process run at a time
@pytest.mark.slow
def test_torchrun_refuses_a_run_another_process_holds_on_every_rank(tmp_path, local):
    """Rank 0 takes the run's lock for every process (sweep.hold): when another process holds it, both ranks
    stop with the same one line and exit 1, quickly (no rank left waiting at a barrier), and the other
    process's checkpoint is untouched."""
    from tests.training.test_run_finish_and_locks import held_cpt_run

    sets, name, ckpt, holder = held_cpt_run(tmp_path, local, 300.0)
    try:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
               "scalecl.cli", "train-cpt", "--preset", "tiny", "--method", "fft", "--out", str(tmp_path / "out"),
               "--cache", str(tmp_path / "cache"), "--checkpoints", str(tmp_path / "runs"), "--device", "cpu",
               *[x for s in sets for x in ("--set", s)]]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=ENV, cwd=tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors and all(f"run {name} (" in e and "is being written by another process" in e for e in errors), proc.stderr[-2000:]
    # no frame of scalecl's: the one traceback is torchrun's own report that a child exited non-zero
    assert "/scalecl/" not in "".join(line for line in proc.stderr.splitlines() if line.lstrip().startswith("File"))
    assert proc.stderr.count("Traceback") <= 1 and "Traceback" not in proc.stdout
    if "Traceback" in proc.stderr:
        assert "ChildFailedError" in proc.stderr
    assert (ckpt / "step-0000001" / "in-progress").read_text() == "another process's checkpoint"
    assert not (tmp_path / "out" / name / "result.json").exists()
