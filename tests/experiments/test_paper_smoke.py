"""The CPT paper-smoke preset is Llama-3.2-1B's shapes with the paper's widths: checked on the meta device (no
weights), against the published config and the paper's trainable-parameter budgets; and one real training
step at the 1B width (one layer, so that it is cheap) through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.experiments import load_preset
from scalecl.experiments.budget import PAPER_SETTINGS, llama_32_1b_config, trainable_counts
from scalecl.experiments.cpt_pretrain import builtin_model_config

SHAPE = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
         "intermediate_size", "tie_word_embeddings", "model_type")


def test_paper_smoke_has_llama_3_2_1b_shapes_and_the_papers_widths():
    rc = load_preset("cpt", "paper-smoke")
    config, published = builtin_model_config(rc, rc.builtin.vocab), llama_32_1b_config()
    assert {k: getattr(config, k) for k in SHAPE} == {k: getattr(published, k) for k in SHAPE}
    _, methods = PAPER_SETTINGS["Korean CPT / Llama-3.2-1B"]
    for name, opts in methods():
        assert trainable_counts(config, name, **rc.method_options(name)) == trainable_counts(published, name, **opts)
    assert trainable_counts(config, "scale-route", **rc.method_options("scale-route"))[0] == 268_509_440  # the budget `scalecl budgets` reports (docs/methods.md)


def test_padded_rows_must_hold_the_tokenizer():
    rc = load_preset("cpt", "paper-smoke", ["model.vocab=100"])
    with pytest.raises(Exception, match="model.vocab=100 is smaller than the tokenizer's 512 tokens"):
        builtin_model_config(rc, 512)


@pytest.mark.xdist_group("heavy")  # conftest.GROUPS: gigabytes, apart from the other heavy tests
@pytest.mark.slow
def test_one_step_at_the_1b_width(tmp_path, monkeypatch):
    """Llama-3.2-1B's width, heads and 128,256 rows, one layer: the random base, Route widened by the paper's
    sizes (l_fp 0: one layer), one step, both evaluations and the final save. The new rows start random (init
    rnd, zero): the default SVD init's seven decompositions of the random base's 2,048-wide matrices would take
    most of a minute on one core and show nothing about this width (it is checked on tiny models and on the real
    SmolLM2, tests/models); the evaluations score 8 sequences per forward (Route's router forms the head's Gram
    matrix, 128,256 x 2,048, once per forward)."""
    monkeypatch.chdir(tmp_path)
    sets = ["model.layers=1", "methods.scale-route.l_fp=0", "methods.scale-route.init=rnd,zero", "train.steps=1",
            "train.seq_len=32", "old_eval.take=1", "new_eval.take=1", "eval.batch=8"]
    res = CliRunner().invoke(app, ["train-cpt", "--preset", "paper-smoke", "--method", "scale-route", "--out", "out",
                                   "--cache", "cache", "--checkpoints", "ck", *[x for s in sets for x in ("--set", s)]])
    assert res.exit_code == 0, res.output
    (result,) = Path("out").glob("*/result.json")
    r = json.loads(result.read_text())
    assert r["total_params"] > 128256 * 2304 and r["trainable_params"] > 128256 * 256  # the new head columns train
    assert "random initialisation, not pre-trained" in res.output


def test_method_all_trains_what_fits_and_names_what_does_not(tmp_path, monkeypatch):
    """`--method all` where one method's estimate does not fit (FFT at the 1B shapes on 24 GB, made to happen here
    on the tiny preset): that method is one `not trained:` line, the others train; naming the methods one by one
    keeps the refusal of the whole sweep."""
    from scalecl.common.errors import ScaleclError
    from scalecl.experiments import budget
    from scalecl.methods import method_names

    monkeypatch.chdir(tmp_path)
    asked: list[list[str]] = []
    estimate = budget.sweep_estimate

    def sweep_estimate(exp, methods, device, world):
        asked.append(list(methods))
        return estimate(exp, methods, device, world)

    def check_fits(e):
        if "fft" in asked[-1]:
            raise ScaleclError("this run needs about 9 TiB of memory at its peak")

    monkeypatch.setattr(budget, "sweep_estimate", sweep_estimate)
    monkeypatch.setattr(budget, "check_fits", check_fits)
    args = ["train-cpt", "--preset", "tiny", "--out", "out", "--cache", "cache", "--checkpoints", "ck"]
    res = CliRunner().invoke(app, [*args, "--method", "all"])
    assert res.exit_code == 0, res.output
    assert "fft: not trained: this run needs about 9 TiB" in res.output
    trained = {json.loads(p.read_text())["method"] for p in Path("out").glob("*/result.json")}
    assert trained == set(method_names()) - {"fft"}
    res = CliRunner().invoke(app, [*args, "--method", "fft,lora", "--force"])
    assert res.exit_code != 0 and "9 TiB" in res.output
