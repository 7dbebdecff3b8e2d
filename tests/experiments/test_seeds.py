"""The two seed axes (issue #18): the base seed decides data, initialisation and stages 1-2 (the CPT base),
the run seed decides stage 3's / CPT's data order and a method's random draws. Same seeds = same run (same
name, same numbers); a different run seed = a different data order on the same cached base."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.common.schema import run_stream_seed, seed_tag
from scalecl.experiments.args import Replicate
from scalecl.experiments.sweep import parse_seeds, replicates
from tests.conftest import local_sets, records, run

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
FAST = ["--set", "stage1.steps=30", "--set", "stage2.steps=5", "--set", "stage3.steps=8",
        "--set", "eval.dense_until=4", "--set", "eval.dense_every=2", "--set", "eval.every=4"]


def test_run_seed_zero_is_the_base_seed_and_others_mix_both():
    assert [run_stream_seed(b, 0) for b in (0, 1, 7)] == [0, 1, 7]  # the streams runs had before run seeds
    mixed = {run_stream_seed(b, r) for b in range(4) for r in range(1, 4)}
    assert len(mixed) == 12 and not mixed & set(range(4))
    assert run_stream_seed(3, 2) == run_stream_seed(3, 2)
    assert (seed_tag(0, 0), seed_tag(1, 0), seed_tag(0, 2)) == ("", "s1-r0-", "s0-r2-")


def test_seed_lists_are_parsed_and_checked():
    assert parse_seeds(None, "--seeds") is None
    assert parse_seeds("0..2", "--seeds") == [0, 1, 2]
    assert parse_seeds("3, 1,3", "--seeds") == [3, 1]
    # a range's length is checked before it is expanded: 0..10**11 is one error, not a MemoryError
    for bad in ("", "a", "1.5", "2..0", "-1", "0..5000", str(2**32), "0..100000000000", f"0..{10**30}"):
        with pytest.raises(ScaleclError, match="--seeds"):
            parse_seeds(bad, "--seeds")
    assert replicates(["x=1"], None, None) == [Replicate(["x=1"], {})]
    # the seeds stay integers beside the --set list: no flag is written back as --set text
    assert replicates([], "0,1", "5", {"tokenizer": "local"}) == [
        Replicate([], {"tokenizer": "local", "seed": 0, "run_seed": 5}),
        Replicate([], {"tokenizer": "local", "seed": 1, "run_seed": 5})]
    assert replicates([], "3", None)[0].load("bio", "tiny").seed == 3
    with pytest.raises(ScaleclError, match="given twice"):
        replicates(["seed=2"], "0,1", None)
    with pytest.raises(ScaleclError, match="given twice"):
        replicates([" run_seed = 2"], None, "0")


def test_every_replicate_is_checked_against_its_data_before_the_first_trains(tmp_path):
    """Each base seed has its own people and tokenizer: a model.vocab that holds the first seed's tokenizer but not
    the second's is refused before the first trains."""
    from scalecl.data.biography import generate_people
    from scalecl.data.tokenizer import train_bio_tokenizer
    from scalecl.experiments import load_preset
    from scalecl.experiments.bio_data import bio_config

    sizes = {s: len(train_bio_tokenizer(generate_people(bio_config(load_preset("bio", "tiny", [f"seed={s}"])))))
             for s in (0, 1, 2, 3)}
    small, big = min(sizes, key=sizes.get), max(sizes, key=sizes.get)
    assert sizes[small] < sizes[big]
    res = runner.invoke(app, ["train-bio", "--preset", "tiny", "--method", "fft", "--out", str(tmp_path / "out"),
                              "--cache", str(tmp_path / "cache"), "--checkpoints", str(tmp_path / "ck"), *FAST,
                              "--set", f"model.vocab={sizes[small]}", "--seeds", f"{small},{big}"])
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines()[-1].startswith(f"error: base seed {big}, run seed 0: model.vocab=")
    assert not list(tmp_path.rglob("result.json")) and not (tmp_path / "ck").exists()  # nothing trained


def _bio(tmp, out, *args):
    res = runner.invoke(app, ["train-bio", "--preset", "tiny", "--method", "fft", "--out", str(tmp / out),
                              "--cache", str(tmp / "cache"), "--checkpoints", str(tmp / "ck"), *FAST, *args])
    assert res.exit_code == 0, res.output
    return {p.name: p for p in (tmp / out).iterdir()}


def _metrics(path):
    return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]


def test_bio_replicates_share_a_base_per_base_seed_and_reproduce(tmp_path):
    runs = _bio(tmp_path, "out", "--seeds", "0,1", "--run-seeds", "0,1")
    names = {n.rsplit("-", 1)[0] for n in runs}
    assert names == {"tiny-fft", "tiny-fft-s0-r1", "tiny-fft-s1-r0", "tiny-fft-s1-r1"}
    by = {}
    for path in runs.values():
        res = json.loads((path / "result.json").read_text())
        by[(res["seeds"]["base"], res["seeds"]["run"])] = (res, _metrics(path))
        assert (res["config"]["seed"], res["config"]["run_seed"]) == (res["seeds"]["base"], res["seeds"]["run"])
    assert len(list((tmp_path / "cache" / "bio").glob("stage1-*"))) == 2  # one base per base seed
    for b in (0, 1):  # the same base under both run seeds, a different stage-3 batch order
        (r0, m0), (r1, m1) = by[(b, 0)], by[(b, 1)]
        assert r0["stage2"]["final_loss"] == r1["stage2"]["final_loss"]
        assert m0[0]["task0/acc"] == m1[0]["task0/acc"]  # step 0: the same model
        assert m0[1]["loss"] != m1[1]["loss"]
    assert by[(0, 0)][0]["stage1"]["final_loss"] != by[(1, 0)][0]["stage1"]["final_loss"]
    # same seeds = same run: the name is found finished, and a fresh copy gives the same numbers
    again = _bio(tmp_path, "out", "--seeds", "1", "--run-seeds", "1")
    assert set(again) == set(runs)
    fresh = _bio(tmp_path, "fresh", "--seeds", "1", "--run-seeds", "1")
    ((name, path),) = fresh.items()
    assert _metrics(path) == _metrics(runs[name])


def test_cpt_run_seed_shuffles_the_stream_on_the_same_base(tmp_path, local):
    sets = local_sets(local)
    run(tmp_path, sets, ["fft"])
    run(tmp_path, sets + ["run_seed=1"], ["fft"])
    run(tmp_path, sets + ["run_seed=1"], ["lora"])
    out = tmp_path / "out"
    names = sorted(p.name.rsplit("-", 1)[0] for p in out.iterdir())
    assert names == ["tiny-fft", "tiny-fft-s0-r1", "tiny-lora-s0-r1"]
    (r0,) = [p for p in out.iterdir() if p.name.startswith("tiny-fft-") and "-s0-r1-" not in p.name]
    (r1,) = [p for p in out.iterdir() if p.name.startswith("tiny-fft-s0-r1-")]
    m0, m1 = _metrics(r0), _metrics(r1)
    assert m0[0]["old/ppl"] == m1[0]["old/ppl"]  # the same base
    assert m0[-1]["loss"] != m1[-1]["loss"]  # another document order
    assert records(out, "lora-s0-r1")[0]["step"] == 0


def test_shuffled_stream_differs_from_stream_order_and_resumes_exactly(local):
    from scalecl.data.corpus import PackedChunks
    from scalecl.data.tokenizer import load_tokenizer

    tok = load_tokenizer(local / "llama")
    texts = [f"document number {i} " * (1 + i % 3) for i in range(23)]

    def stream(order):
        return PackedChunks(lambda: iter(texts), tok, 8, loop=True, doc_batch=5, order_seed=order)

    plain, shuffled = stream(None), stream(11)
    a = [next(plain) for _ in range(40)]
    b = [next(shuffled) for _ in range(40)]
    assert torch.cat(a).tolist() != torch.cat(b).tolist()
    whole = stream(11)
    ref = [next(whole) for _ in range(60)]
    part = stream(11)
    for _ in range(17):
        next(part)
    state = part.state_dict()
    resumed = stream(11)
    resumed.load_state_dict(state)
    assert [t.tolist() for t in (next(resumed) for _ in range(43))] == [t.tolist() for t in ref[17:]]
