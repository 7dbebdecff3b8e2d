"""Delta checkpoints (save_model(..., delta=True)): only what a method trains, plus its base's identity.

For every method that has one (Freeze, LLaMA Pro, the three SCALE variants) on tiny Llama (GQA, tied and
untied) and GPT-NeoX bases: the delta reloads from its base to the very tensors and logits of the full
checkpoint (bit for bit), is smaller, and `scalecl merge` writes it out as the full checkpoint. A base of other
weights is refused in one line; so is a delta for a method that has none.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import safetensors.torch as st
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from scalecl import load_model, save_model
from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.methods import REGISTRY, get_method, method_names
from scalecl.training.delta import DELTA_FILE, tensor_digest, unique_state
from tests.conftest import make_base, method_cases, random_batch, train_steps

CASES = method_cases(l_fp=1)
DELTA_METHODS = tuple(n for n in method_names() if REGISTRY[n].delta)  # a new method with one joins the matrix
ARCHS = ("llama-gqa-tied", "llama-gqa-untied", "neox-parallel")
runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")


def trained(name: str, case: str, seed: int = 0):
    """The method applied to the case's base, one step trained and every trainable tensor moved off its start."""
    torch.manual_seed(0)
    model = get_method(name, **CASES[name]).apply(make_base(case, seed=seed))
    train_steps(model, steps=1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    """Per arch case: the base as a suite checkpoint; per method: the full and the delta checkpoint, the model."""
    root = tmp_path_factory.mktemp("delta")
    out = {}
    for case in ARCHS:
        base = save_model(make_base(case), root / f"{case}-base", base_model="random:tiny")
        for name in DELTA_METHODS:
            model = trained(name, case)
            method = get_method(name, **CASES[name])
            full = save_model(model, root / f"{case}-{name}-full", method, base_model=str(base))
            delta = save_model(model, root / f"{case}-{name}-delta", method, base_model=str(base), delta=True)
            out[case, name] = {"base": base, "full": full, "delta": delta, "model": model}
    return out


def test_the_methods_that_keep_part_of_the_base_have_deltas():
    assert DELTA_METHODS == ("freeze", "llama-pro", "scale-preserve", "scale-adapt", "scale-route")


def _same_tensors(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("case", ARCHS)
@pytest.mark.parametrize("name", DELTA_METHODS)
def test_delta_reloads_bit_identical_from_its_base(saved, case, name):
    s = saved[case, name]
    delta, full, model = load_model(s["delta"]), load_model(s["full"]), s["model"]
    _same_tensors(delta, full)
    _same_tensors(delta, model)
    ids = random_batch(model.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(delta(ids).logits, model.eval()(ids).logits)
    assert [n for n, p in delta.named_parameters() if p.requires_grad] == \
        [n for n, p in full.named_parameters() if p.requires_grad]


@pytest.mark.parametrize("name", DELTA_METHODS)
def test_delta_holds_only_what_trains(saved, name):
    """The stored tensors are exactly the trainable ones; SCALE and LLaMA Pro take every base tensor unchanged."""
    for case in ARCHS:
        s = saved[case, name]
        stored = st.load_file(str(s["delta"] / DELTA_FILE))
        want = {n: p for n, p in s["model"].named_parameters() if p.requires_grad}
        assert stored.keys() == want.keys()
        delta_bytes, full_bytes = (s["delta"] / DELTA_FILE).stat().st_size, (s["full"] / "model.safetensors").stat().st_size
        assert delta_bytes < full_bytes
        assert sum(t.numel() for t in stored.values()) * 4 <= delta_bytes < sum(t.numel() for t in stored.values()) * 4 + 20_000
        rec = json.loads((s["delta"] / "scalecl.json").read_text())
        assert rec["layout"] == "delta" and rec["format_version"] == 3 and rec["delta"]["base"]["source"] == str(s["base"])
        assert "model.safetensors" not in rec["files"] and "config.json" not in rec["files"]
        with pytest.raises((OSError, ValueError)):  # plain transformers finds no model: never a random one
            AutoModelForCausalLM.from_pretrained(s["delta"])
        n_base = len(unique_state(make_base(case)))
        layers = {"freeze": [0, None, None], "llama-pro": [0, None, 1, None, 2, None]}.get(name, [0, 1, 2])
        assert rec["delta"]["layer_order"] == layers  # Freeze k=1 stores its upper blocks; LLaMA Pro n=3 inserts 3
        if name != "freeze":
            assert rec["delta"]["base"]["tensors"] == n_base
            assert rec["delta"]["base"]["digest"] == tensor_digest(unique_state(make_base(case)))  # the whole base
        else:
            assert 0 < rec["delta"]["base"]["tensors"] < n_base


@pytest.mark.parametrize("name", DELTA_METHODS)
def test_merge_writes_the_full_checkpoint(saved, tmp_path, name):
    s = saved["llama-gqa-tied", name]
    res = runner.invoke(app, ["merge", "--model", str(s["delta"]), "--out", str(tmp_path / "merged")])
    assert res.exit_code == 0, res.output
    merged = tmp_path / "merged"
    assert sorted(p.name for p in merged.iterdir()) == sorted(p.name for p in s["full"].iterdir())
    a, b = st.load_file(str(merged / "model.safetensors")), st.load_file(str(s["full"] / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    meta, full_meta = (json.loads((d / "scalecl.json").read_text()) for d in (merged, s["full"]))
    assert meta["merged_from"] == str(s["delta"].resolve())
    for key in ("method", "options", "layout", "base_config", "base_model"):
        assert meta[key] == full_meta[key], key
    _same_tensors(load_model(merged), load_model(s["full"]))


def test_a_base_of_other_weights_is_refused_in_one_line(saved, tmp_path):
    s = saved["llama-gqa-tied", "scale-route"]
    other = save_model(make_base("llama-gqa-tied", seed=1), tmp_path / "other", base_model="random:tiny")
    with pytest.raises(ScaleclError, match=r"is not the model delta checkpoint .* was trained on: the digest") as e:
        load_model(s["delta"], base=other)
    assert "\n" not in str(e.value)
    res = runner.invoke(app, ["merge", "--model", str(s["delta"]), "--base", str(other), "--out", str(tmp_path / "m")])
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "--base" in res.output, res.output
    assert not (tmp_path / "m").exists()
    with pytest.raises(ScaleclError, match="its config differs in num_hidden_layers"):  # another shape: before any work
        load_model(s["delta"], base=get_method("llama-pro", n=3).apply(make_base("llama-gqa-tied")))


def test_freeze_digest_covers_what_it_takes_from_the_base(saved):
    """Freeze stores its trainable blocks: a base that differs only there gives the same model; one that differs in
    a frozen block is refused."""
    s = saved["llama-gqa-tied", "freeze"]
    upper, lower = make_base("llama-gqa-tied"), make_base("llama-gqa-tied")
    with torch.no_grad():
        upper.model.layers[2].mlp.up_proj.weight.add_(1.0)
        lower.model.layers[0].mlp.up_proj.weight.add_(1.0)
    _same_tensors(load_model(s["delta"], base=upper), load_model(s["full"]))
    with pytest.raises(ScaleclError, match="the digest of the 10 tensors it takes from the base"):
        load_model(s["delta"], base=lower)


def test_a_moved_base_is_named_and_can_be_given(saved, tmp_path):
    s = saved["neox-parallel", "llama-pro"]
    base, delta = tmp_path / "base", tmp_path / "delta"
    shutil.copytree(s["base"], base)
    save_model(s["model"], delta, get_method("llama-pro", **CASES["llama-pro"]), base_model=str(base), delta=True)
    moved = shutil.move(base, tmp_path / "moved")
    with pytest.raises(ScaleclError, match=r"needs its base, '.*/base', which is neither a folder here nor a hub id"):
        load_model(delta)
    _same_tensors(load_model(delta, base=moved), load_model(s["full"]))
    _same_tensors(load_model(delta, base=make_base("neox-parallel")), load_model(s["full"]))  # a model, in memory
    with pytest.raises(ScaleclError, match="is not a delta checkpoint: it takes no base"):
        load_model(s["full"], base=moved)


def test_a_record_that_places_the_base_otherwise_is_refused(saved, tmp_path):
    s = saved["llama-gqa-tied", "llama-pro"]
    copy = Path(shutil.copytree(s["delta"], tmp_path / "delta"))
    meta = json.loads((copy / "scalecl.json").read_text())
    meta["delta"]["layer_order"] = [0, 1, None, None, 2, None]
    del meta["record_digest"]  # a record that keeps no digest of itself (an earlier scalecl's): the check behind it
    (copy / "scalecl.json").write_text(json.dumps(meta))
    with pytest.raises(ScaleclError, match=r"places the base's tensors otherwise .*recorded \[0, 1, None, None, 2"):
        load_model(copy)


def test_a_damaged_delta_is_refused(saved, tmp_path):
    s = saved["llama-gqa-untied", "scale-adapt"]
    copy = Path(shutil.copytree(s["delta"], tmp_path / "delta"))
    data = bytearray((copy / DELTA_FILE).read_bytes())
    data[-3] ^= 0xFF
    (copy / DELTA_FILE).write_bytes(bytes(data))
    with pytest.raises(ScaleclError, match=f"is damaged: .*{DELTA_FILE} differs from what was written"):
        load_model(copy)


def test_what_has_no_delta_is_refused_and_nothing_written(tmp_path):
    base = str(tmp_path / "somewhere")
    for name in ("fft", "lora"):
        model = get_method(name, **CASES[name]).apply(make_base("llama-gqa-tied"))
        with pytest.raises(ScaleclError, match=f"method {name} has no delta checkpoint .*save a full checkpoint"):
            save_model(model, tmp_path / "ck", get_method(name, **CASES[name]), base_model=base, delta=True)
    with pytest.raises(ScaleclError, match="a plain model .no method. has no delta checkpoint"):
        save_model(make_base("llama-gqa-tied"), tmp_path / "ck", base_model=base, delta=True)
    model = trained("freeze", "llama-gqa-tied")
    with pytest.raises(ScaleclError, match="a delta checkpoint records its base: pass base_model"):
        save_model(model, tmp_path / "ck", get_method("freeze", **CASES["freeze"]), delta=True)
    model.model.layers[0].mlp.up_proj.weight.requires_grad_(True)  # trains what Freeze keeps: a delta would lose it
    with pytest.raises(ScaleclError, match="the model trains model.layers.0.mlp.up_proj.weight .*which freeze keeps"):
        save_model(model, tmp_path / "ck", get_method("freeze", **CASES["freeze"]), base_model=base, delta=True)
    assert not (tmp_path / "ck").exists()


def test_merge_takes_base_only_for_a_delta(saved, tmp_path):
    s = saved["llama-gqa-tied", "freeze"]
    res = runner.invoke(app, ["merge", "--model", str(s["full"]), "--base", str(s["base"]), "--out", str(tmp_path / "m")])
    assert res.exit_code == 2 and "is not a delta checkpoint: it takes no --base" in res.output, res.output
    assert not (tmp_path / "m").exists()


def test_a_training_run_writes_deltas_and_resumes_from_one(tmp_path, local):
    """checkpoint.delta=true: the method's step and final checkpoints are deltas on the run's base (FFT's stay
    full); resuming from a delta step checkpoint ends exactly where the run with full checkpoints ends."""
    from tests.conftest import local_sets, run

    sets = local_sets(local, "llama", "checkpoint.every=3", "checkpoint.keep=1")
    (full,) = run(tmp_path / "a", sets, ["scale-route"])
    deltas = [*sets, "checkpoint.delta=true"]
    assert run(tmp_path / "b", deltas, ["fft", "scale-route"], stop_after=3) == []
    layouts = {}
    for d in (tmp_path / "b" / "runs" / "cpt").iterdir():
        if not d.name.startswith("."):
            (step,) = d.glob("step-*")
            layouts[d.name.split("-")[1]] = json.loads((step / "model" / "scalecl.json").read_text())["layout"]
    assert layouts == {"fft": "plain", "scale": "delta"}
    (resumed,) = run(tmp_path / "b", deltas, ["scale-route"], resume=True)
    assert resumed["summary"]["final_loss"] == full["summary"]["final_loss"]
    (a,), (b,) = ((tmp_path / x / "runs" / "cpt").glob("tiny-scale-route-*/final") for x in ("a", "b"))
    meta = json.loads((b / "scalecl.json").read_text())
    assert meta["layout"] == "delta" and meta["delta"]["base"]["source"] == str(local / "llama")
    _same_tensors(load_model(b), load_model(a))


def test_a_plain_delta_is_a_base_and_a_scale_delta_is_not(saved, tmp_path):
    """A delta of Freeze loads as the plain model it is (as its full checkpoint would); a delta of SCALE is a
    widened model, refused as a base in one line naming its base (tests/cli/test_every_model_folder.py has more)."""
    s = saved["llama-gqa-tied", "freeze"]
    res = runner.invoke(app, ["prepare", "--method", "fft", "--model", str(s["delta"]), "--out", str(tmp_path / "x")])
    assert res.exit_code == 0, res.output
    _same_tensors(load_model(tmp_path / "x"), load_model(s["full"]))
    res = runner.invoke(app, ["prepare", "--method", "fft", "--model",
                              str(saved["llama-gqa-tied", "scale-route"]["delta"]), "--out", str(tmp_path / "y")])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "is a delta scale-route model, not a plain model" in lines[0] \
        and f"recorded base: {s['base']}" in lines[0], res.output
