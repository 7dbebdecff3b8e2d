"""A widened model saved the transformers way (save_pretrained, Trainer.save_model) loads back with plain
transformers (trust_remote_code, in a process without scalecl) and with scalecl.load_model, with the logits it
had; scalecl.save_model refuses a method that contradicts the model."""

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


def _reloads_exactly(model, folder, tmp_path) -> None:
    """The checkpoint in `folder` gives `model`'s logits through plain transformers and through scalecl."""
    ids = random_batch(model.config.vocab_size)
    with torch.no_grad():
        ref = model.eval()(ids).logits
    torch.save((ids, ref), tmp_path / "ref.pt")
    res = run_clean(LOAD, str(folder), str(tmp_path / "ref.pt"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    name, diff = res.stdout.split()[-2:]
    assert name.startswith("Scale") and float(diff) <= TOL["atol"], res.stdout
    again = load_model(folder)  # scalecl's own classes: no code is run from the folder
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, ref, **TOL)


@pytest.mark.parametrize(("case", "variant"), [("llama-gqa-tied", "route"), ("neox-sequential", "adapt")])
def test_save_pretrained_of_a_trained_widened_model_reloads(tmp_path, case, variant):
    model = upscale(make_base(case), ScaleConfig(variant=variant, **SCALE_OPTS, l_fp=1))
    train_steps(model, steps=3)  # the new weights move: the reload is not the base function by accident
    model.save_pretrained(tmp_path / "ck")
    assert {"modeling_scale.py", "scale_layers.py", "config.json"} <= {p.name for p in (tmp_path / "ck").iterdir()}
    _reloads_exactly(model, tmp_path / "ck", tmp_path)


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
                          (get_method("scale-route", **SCALE_OPTS, tau=0.5), "tau 0.5")):
        with pytest.raises(ScaleclError, match=f"does not match the model.*{phrase}"):
            save_model(model, tmp_path / "ck", wrong)
        assert not (tmp_path / "ck").exists()
    assert save_model(model, tmp_path / "ck", get_method("scale-route", **SCALE_OPTS)).is_dir()
