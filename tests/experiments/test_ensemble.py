"""The ensemble controls of SCALE-Route (ensemble.mode): a method's model averaged with its frozen stage-2 model,
trained through the average ("train") or averaged only when scored ("eval")."""

from __future__ import annotations

import json

import pytest
import safetensors.torch as st
import torch
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.experiments import load_preset
from scalecl.experiments.base import Paths
from scalecl.experiments.bio import BioExperiment
from scalecl.methods import get_method
from scalecl.methods.average import BaseAverage, saved_module
from tests.conftest import make_base, random_batch, snapshot

runner = CliRunner()
FAST = ["--set", "stage1.steps=30", "--set", "stage2.steps=5", "--set", "stage3.steps=12",
        "--set", "eval.dense_until=6", "--set", "eval.dense_every=3", "--set", "eval.every=6"]


# ---------------------------------------------------------------------------------------------------------
# the averaged model


@pytest.mark.parametrize("method", ["fft", "lora", "llama-pro"])
def test_logits_are_the_weighted_average_and_the_base_gets_no_gradient(method):
    opts = {"lora": {"rank": 4}, "llama-pro": {"n": 3}}.get(method, {})
    model = get_method(method, **opts).apply(make_base("llama-gqa-untied"))
    with torch.no_grad():  # move the trained model away from its base, so the average differs from both
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    base = make_base("llama-gqa-untied")
    before = snapshot(base)
    avg = BaseAverage(model, base, "train", base_weight=0.3)
    ids = random_batch(model.config.vocab_size)
    out = avg(input_ids=ids, labels=ids)
    with torch.no_grad():
        want = 0.7 * model(input_ids=ids).logits + 0.3 * base(input_ids=ids).logits
    torch.testing.assert_close(out.logits, want, rtol=0, atol=1e-6)
    assert not torch.allclose(out.logits, model(input_ids=ids).logits, atol=1e-3)
    plain = torch.nn.functional.cross_entropy(want[:, :-1].reshape(-1, want.shape[-1]), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, plain, rtol=1e-6, atol=1e-6)
    out.loss.backward()
    assert all(p.grad is None for p in base.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)
    assert snapshot(base) == before
    assert saved_module(avg) is model and saved_module(model) is model


def test_eval_mode_averages_only_outside_training():
    model, base = make_base("neox-parallel", seed=0), make_base("neox-parallel", seed=1)
    avg = BaseAverage(model, base, "eval")
    ids = random_batch(model.config.vocab_size)
    avg.train()
    assert model.training and not base.training  # the base always runs as in evaluation
    torch.testing.assert_close(avg(input_ids=ids, labels=ids).loss, model(input_ids=ids, labels=ids).loss,
                               rtol=0, atol=0)
    avg.eval()
    with torch.no_grad():
        want = (model(input_ids=ids).logits + base(input_ids=ids).logits) / 2
        torch.testing.assert_close(avg(input_ids=ids).logits, want, rtol=0, atol=1e-6)
        keep = avg(input_ids=ids, logits_to_keep=1).logits  # the evaluation's head at the scored position
        torch.testing.assert_close(keep[:, -1], want[:, -1], rtol=0, atol=1e-6)


def test_a_wrong_mode_is_refused():
    with pytest.raises(ValueError, match="mode"):
        BaseAverage(make_base("neox-parallel"), make_base("neox-parallel"), "none")


# ---------------------------------------------------------------------------------------------------------
# through train-bio


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ensemble")
    return root / "out", root / "cache", root / "ckpt"


def invoke(dirs, *args):
    out, cache, ckpt = dirs
    res = runner.invoke(app, ["train-bio", "--preset", "tiny", "--out", str(out), "--cache", str(cache),
                              "--checkpoints", str(ckpt), *FAST, *args])
    assert res.exit_code == 0, res.output
    return res


def _runs(out, method):
    found = {}
    for d in out.iterdir():
        if d.name.startswith(f"tiny-{method}-"):
            r = json.loads((d / "result.json").read_text())
            found[r["config"]["ensemble"]["mode"]] = (d, r)
    return found


def _lines(d, name):
    return [json.loads(x) for x in (d / name).read_text().splitlines()]


def _weights(r, dirs):
    ckpt = dirs[2] / "bio" / r["run"]["name"] / "final" / "model.safetensors"
    return st.load_file(ckpt)


def test_train_bio_ensemble_modes(dirs):
    """mode "eval" trains exactly the plain run (losses and final weights bit-equal) and scores the average;
    mode "train" trains another model; both are their own runs, recorded as such, and the plain run keeps the
    name it had before the option existed."""
    for mode in ("none", "eval", "train"):
        invoke(dirs, "--method", "fft", "--set", f"ensemble.mode={mode}")
    runs = _runs(dirs[0], "fft")
    assert set(runs) == {"none", "eval", "train"}
    (plain_dir, plain), (ev_dir, ev), (_, tr) = runs["none"], runs["eval"], runs["train"]
    assert len({plain["run"]["name"], ev["run"]["name"], tr["run"]["name"]}) == 3
    assert "ensemble" not in plain and ev["ensemble"]["mode"] == "eval" and tr["ensemble"]["base_weight"] == 0.5
    # the plain run's name does not depend on the option at its default
    rc = load_preset("bio", "tiny", FAST[1::2])
    assert "ensemble" not in BioExperiment(rc, "tiny", Paths(dirs[0])).named_config()

    assert [r["loss"] for r in _lines(ev_dir, "train_log.jsonl")] == [r["loss"] for r in _lines(plain_dir,
                                                                                              "train_log.jsonl")]
    w_plain, w_ev, w_tr = (_weights(r, dirs) for r in (plain, ev, tr))
    assert w_plain.keys() == w_ev.keys() == w_tr.keys()  # a checkpoint holds the trained model alone
    assert all(torch.equal(w_plain[k], w_ev[k]) for k in w_plain)
    assert any(not torch.equal(w_plain[k], w_tr[k]) for k in w_plain)

    m_plain, m_ev = _lines(plain_dir, "metrics.jsonl"), _lines(ev_dir, "metrics.jsonl")
    assert m_plain[0]["task0/acc"] == m_ev[0]["task0/acc"]  # step 0: the model is its base, the average the same
    assert [m["task0/soft_acc"] for m in m_plain[1:]] != [m["task0/soft_acc"] for m in m_ev[1:]]
    assert ev["trainable_params"] == plain["trainable_params"]


def test_ensemble_run_resumes_exactly(dirs, tmp_path):
    """A run trained through the average, stopped and resumed, ends where the uninterrupted one ended."""
    invoke(dirs, "--method", "fft", "--set", "ensemble.mode=train")  # the uninterrupted run (done once per module)
    out, cache, ckpt = tmp_path / "out", dirs[1], tmp_path / "ckpt"
    base = ["train-bio", "--preset", "tiny", "--out", str(out), "--cache", str(cache), "--checkpoints", str(ckpt),
            *FAST, "--method", "fft", "--set", "ensemble.mode=train"]
    res = runner.invoke(app, [*base, "--stop-after", "5"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, [*base, "--resume"])
    assert res.exit_code == 0, res.output
    (d, r) = _runs(out, "fft")["train"]
    (d0, r0) = _runs(dirs[0], "fft")["train"]
    assert r["resumed_from_step"] == 5
    assert r["final"] == r0["final"]
    assert _lines(d, "metrics.jsonl") == _lines(d0, "metrics.jsonl")


def test_ensemble_is_refused_with_compile(dirs):
    out, cache, ckpt = dirs
    res = runner.invoke(app, ["train-bio", "--preset", "tiny", "--out", str(out), "--cache", str(cache),
                              "--checkpoints", str(ckpt), *FAST, "--method", "fft", "--set", "ensemble.mode=train",
                              "--set", "compute.compile=true"])
    assert res.exit_code == 2
    assert "ensemble.mode=train runs in one process" in res.output
