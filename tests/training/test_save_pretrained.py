"""A widened or deepened model saved the transformers way (save_pretrained, Trainer.save_model, push_to_hub's
files) loads back with plain transformers (trust_remote_code, in a process without scalecl) and with
scalecl.load_model, with the logits it had; scalecl.save_model refuses a method that contradicts the model."""

from __future__ import annotations

import pytest
import torch

from scalecl import ScaleConfig, get_method, load_model, save_model, upscale
from scalecl.common.errors import ScaleclError
from tests.conftest import SCALE_OPTS, make_base, random_batch, train_steps
from tests.training.test_checkpoint import run_clean

LOAD = r"""
import sys

import torch
from transformers import AutoModelForCausalLM

torch.set_num_threads(1)
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
ids, ref = torch.load(sys.argv[2])
with torch.no_grad():
    print(type(m).__name__, (m(ids).logits - ref).abs().max().item())
"""
TOL = dict(atol=1e-6, rtol=0.0)  # fp32, the same kernels in both processes


def _reloads_exactly(model, folder, tmp_path, cls: str = "Scale") -> None:
    """The checkpoint in `folder` gives `model`'s logits through plain transformers (a class whose name starts
    with `cls`) and through scalecl."""
    ids = random_batch(model.config.vocab_size)
    with torch.no_grad():
        ref = model.eval()(ids).logits
    torch.save((ids, ref), tmp_path / "ref.pt")
    res = run_clean(LOAD, str(folder), str(tmp_path / "ref.pt"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    name, diff = res.stdout.split()[-2:]
    assert name.startswith(cls) and float(diff) <= TOL["atol"], res.stdout
    again = load_model(folder)  # scalecl's own classes: no code is run from the folder
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, ref, **TOL)


@pytest.mark.parametrize(("case", "variant"), [("llama-gqa-tied", "route"), ("neox-sequential", "adapt"),
                                               ("llama-gqa-untied", "preserve")])
def test_save_pretrained_of_a_trained_widened_model_reloads(tmp_path, case, variant):
    l_fp = {} if variant == "preserve" else {"l_fp": 1}
    model = upscale(make_base(case), ScaleConfig(variant=variant, **SCALE_OPTS, **l_fp))
    train_steps(model, steps=3)  # the new weights move: the reload is not the base function by accident
    model.save_pretrained(tmp_path / "ck")
    assert {"modeling_scale.py", "scale_layers.py", "config.json"} <= {p.name for p in (tmp_path / "ck").iterdir()}
    _reloads_exactly(model, tmp_path / "ck", tmp_path)


@pytest.mark.parametrize("case", ["llama-gqa-tied", "neox-parallel"])
def test_save_pretrained_of_a_trained_llama_pro_model_reloads(tmp_path, case):
    """LLaMA Pro is its family's own class with more layers: a plain transformers folder, no remote code."""
    model = get_method("llama-pro", n=3).apply(make_base(case))
    train_steps(model, steps=3)
    model.save_pretrained(tmp_path / "ck")
    assert not list((tmp_path / "ck").glob("*.py"))
    _reloads_exactly(model, tmp_path / "ck", tmp_path, cls=type(model).__name__)


def test_push_to_hub_writes_a_folder_that_reloads(tmp_path, monkeypatch):
    """push_to_hub uploads what save_pretrained writes into its temporary folder: with the upload replaced by a
    copy, that file set holds the model code and reloads with trust_remote_code."""
    import shutil
    from types import SimpleNamespace

    import transformers.utils.hub as hub

    sent = tmp_path / "uploaded"
    monkeypatch.setattr(hub, "hf_api", lambda: SimpleNamespace(create_repo=lambda repo_id, **kw: SimpleNamespace(
        repo_id=repo_id)))
    monkeypatch.setattr(hub, "create_and_tag_model_card", lambda *a, **kw: SimpleNamespace(
        save=lambda path: open(path, "w").close()))
    monkeypatch.setattr(hub.PushToHubMixin, "_upload_modified_files",
                        lambda self, folder, *a, **kw: shutil.copytree(folder, sent))
    model = upscale(make_base("llama-gqa-tied"), ScaleConfig(variant="route", **SCALE_OPTS, l_fp=1))
    train_steps(model, steps=3)
    model.push_to_hub("someone/wide")
    assert {"modeling_scale.py", "scale_surgery.py", "scale_spec.py", "scale_layers.py", "scale_arch.py",
            "config.json", "model.safetensors"} <= {p.name for p in sent.iterdir()}
    _reloads_exactly(model, sent, tmp_path)


def test_trainer_save_model_output_reloads(tmp_path):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    model = upscale(make_base("llama-gqa-untied"), ScaleConfig(variant="route", **SCALE_OPTS, l_fp=1))
    ids = random_batch(model.config.vocab_size, batch=4).tolist()
    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=2, per_device_train_batch_size=2,
                             learning_rate=1e-2, report_to=[], save_strategy="no", logging_strategy="no",
                             disable_tqdm=True, use_cpu=True)
    trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_dict({"input_ids": ids, "labels": ids}))
    trainer.train()
    trainer.save_model(str(tmp_path / "ck"))
    _reloads_exactly(model, tmp_path / "ck", tmp_path)


def test_save_model_refuses_a_method_the_model_was_not_built_with(tmp_path):
    model = upscale(make_base("llama-gqa-tied"), ScaleConfig(variant="route", **SCALE_OPTS))
    for wrong, phrase in ((get_method("scale-adapt", **SCALE_OPTS), "variant 'adapt'"),
                          (get_method("scale-route", hidden_up=64, ffn_up=16), "hidden_up 64"),
                          (get_method("scale-route", **SCALE_OPTS, tau=0.25), "tau 0.25")):
        with pytest.raises(ScaleclError, match=f"does not match the model.*{phrase}"):
            save_model(model, tmp_path / "ck", wrong)
        assert not (tmp_path / "ck").exists()
    assert save_model(model, tmp_path / "ck", get_method("scale-route", **SCALE_OPTS)).is_dir()


def test_save_model_refuses_a_plain_method_the_model_was_not_built_with(tmp_path):
    """The same check for the methods that keep the family's class: one line at save, not a failed load later."""
    deep = get_method("llama-pro", n=3).apply(make_base("llama-gqa-tied"))
    plain = make_base("llama-gqa-tied")
    for model, wrong, phrase in (
            (deep, get_method("llama-pro", n=1), r"llama-pro \(n=1\) .*: the model has model.layers.4.\S+, "),
            (deep, get_method("freeze", k=1), r"freeze \(k=1\) .*: the model has model.layers.3.\S+, "),
            (plain, get_method("llama-pro", n=3), r"llama-pro \(n=3\) .*: it makes model.layers.3.\S+, ")):
        with pytest.raises(ScaleclError, match=f"^method {phrase}.*which"):
            save_model(model, tmp_path / "ck", wrong)
        assert not (tmp_path / "ck").exists()
    assert save_model(deep, tmp_path / "ck", get_method("llama-pro", n=3)).is_dir()
    assert save_model(plain, tmp_path / "ck2", get_method("freeze", k=1)).is_dir()
