"""Every read of a checkpoint the suite wrote is verified, its scalecl.json included, by every command.

scalecl.json holds what rebuilds the model (method options such as Route's tau, the base's config), so a value
changed in it is damage like a changed weight: the record keeps a digest of its own content (`record_digest`),
checked with the files' fingerprints. A record edited (tau of a Route checkpoint, full or delta; a size or an
epsilon of a plain one) and a weight changed in place (same size) are one `error:` line in `eval-ppl`,
`eval-harness`, `merge`, `train-cpt --model`, `upscale`, `prepare` and `load_model`; nothing is written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scalecl import load_model, save_model
from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.methods import get_method
from scalecl.models.build import model_from_config, tiny_config
from tests.common.test_verify_on_read import zero_bytes

runner = CliRunner()
ROUTE = {"hidden_up": 32, "ffn_up": 16, "l_fp": 1}
DAMAGED = "is damaged"


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> dict[str, Path]:
    from scalecl.data.bilingual import (
        BilingualConfig,
        english_biographies,
        split_documents,
        train_bpe_tokenizer,
    )

    root = tmp_path_factory.mktemp("records")
    cfg = BilingualConfig(people=30, heldout=6, texts=2)
    texts = english_biographies(cfg)
    (root / "corpus").mkdir()
    for split, docs in split_documents(texts, cfg, "en").items():
        (root / "corpus" / f"{split}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tok = train_bpe_tokenizer(texts, vocab_size=300)
    config = tiny_config("llama", vocab_size=len(tok), max_position_embeddings=64, eos_token_id=tok.eos_token_id)
    base = save_model(model_from_config(config), root / "base", base_model="random tiny llama", tokenizer=tok)
    route = get_method("scale-route", **ROUTE)
    out = {"root": root, "corpus": root / "corpus", "base": base}
    out["route"] = save_model(route.apply(load_model(base)), root / "route", route, base_model=str(base), tokenizer=tok)
    out["route_delta"] = save_model(route.apply(load_model(base)), root / "route_delta", route, base_model=str(base),
                                    tokenizer=tok, delta=True)
    fft = get_method("fft")
    out["fft"] = save_model(fft.apply(load_model(base)), root / "fft", fft, base_model=str(base), tokenizer=tok)
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "mc.jsonl").write_text("".join(json.dumps({"q": d[:60], "choices": [" a", " b"], "label": i % 2})
                                            + "\n" for i, d in enumerate(texts[:4])))
    (tasks / "local_mc.yaml").write_text(
        f"task: local_mc\ndataset_path: json\ndataset_name: null\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tasks / 'mc.jsonl'}\n  cache_dir: {root / 'hf_cache'}\noutput_type: multiple_choice\n"
        'test_split: test\ndoc_to_text: "{{q}}"\ndoc_to_target: "{{label}}"\ndoc_to_choice: "{{choices}}"\n'
        "metric_list:\n  - metric: acc\n")
    out["tasks"] = tasks / "local_mc.yaml"
    return out


def _edited(src: Path, dst: Path, change) -> Path:
    d = Path(shutil.copytree(src, dst))
    meta = json.loads((d / "scalecl.json").read_text())
    change(meta)
    (d / "scalecl.json").write_text(json.dumps(meta, indent=2))
    return d


def _tau(meta):
    meta["options"]["tau"] = 0.9


def _eps(meta):
    meta["base_config"]["rms_norm_eps"] = 1e-2


def _weights(src: Path, dst: Path) -> Path:
    d = Path(shutil.copytree(src, dst))
    zero_bytes(d / "model.safetensors", 2000, 8)
    return d


def _commands(fx, model: Path, tmp: Path) -> dict[str, list[str]]:
    c = str(fx["corpus"])
    return {
        "eval-ppl": ["eval-ppl", "--model", str(model), "--dataset", c, "--split", "test", "--seq-len", "32",
                     "--cache", str(tmp / "cache"), "--out", str(tmp / "ppl.json")],
        "eval-harness": ["eval-harness", "--model", str(model), "--tasks", str(fx["tasks"]), "--limit", "2",
                         "--device", "cpu", "--bootstrap-iters", "0", "--out", str(tmp / "harness")],
        "merge": ["merge", "--model", str(model), "--out", str(tmp / "merged")],
        "train-cpt": ["train-cpt", "--preset", "tiny", "--method", "fft" if "fft" in model.name else "scale-route",
                      "--model", str(model), "--data", c, "--old-eval", c, "--new-eval", c, "--set",
                      "train.seq_len=32", "--out", str(tmp / "runs"), "--cache", str(tmp / "cache"),
                      "--checkpoints", str(tmp / "ck")],
        "upscale": ["upscale", "--model", str(model), "--hidden-up", "32", "--out", str(tmp / "up")],
        "prepare": ["prepare", "--method", "fft", "--model", str(model), "--out", str(tmp / "prep")],
    }


CASES = [  # (checkpoint, how it is damaged, the commands that take such a checkpoint)
    ("route", "tau", ("eval-ppl", "eval-harness", "train-cpt")),
    ("route_delta", "tau", ("eval-ppl", "eval-harness", "merge", "train-cpt")),
    ("fft", "eps", ("eval-ppl", "eval-harness", "merge", "train-cpt", "upscale", "prepare")),
    ("fft", "weights", ("eval-ppl", "eval-harness", "merge", "train-cpt", "upscale", "prepare")),
]


@pytest.mark.parametrize("which, how, commands", CASES, ids=[f"{w}-{h}" for w, h, _ in CASES])
def test_an_edited_record_or_weight_is_one_line_in_every_command(fx, tmp_path, monkeypatch, which, how, commands):
    monkeypatch.chdir(tmp_path)
    src = fx[which]
    d = _weights(src, tmp_path / which) if how == "weights" else \
        _edited(src, tmp_path / which, {"tau": _tau, "eps": _eps}[how])
    with pytest.raises(ScaleclError, match=DAMAGED):
        load_model(d)
    for name, args in _commands(fx, d, tmp_path).items():
        if name not in commands:
            continue
        res = runner.invoke(app, args)
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert res.exit_code == 2 and lines and lines[-1].startswith("error:"), (name, res.output)
        assert sum(ln.startswith("error:") for ln in lines) == 1 and "Traceback" not in res.output, res.output
        want = "scalecl.json differs from what was written" if how != "weights" else "model.safetensors differs"
        assert DAMAGED in lines[-1] and want in lines[-1], (name, lines[-1])
    made = {p.name for p in tmp_path.iterdir()} - {which, "cache"}
    assert not made, made  # nothing written: no record, run, merged or prepared model


@pytest.mark.parametrize("which", ["route", "route_delta", "fft"])
def test_the_unedited_checkpoints_are_taken(fx, tmp_path, which):
    """The control: the same commands on the checkpoints as written get past verification (eval-ppl runs)."""
    res = runner.invoke(app, _commands(fx, fx[which], tmp_path)["eval-ppl"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "ppl.json").read_text())["method"] == which.split("_")[0].replace("route",
                                                                                                 "scale-route")


def test_the_record_digest_covers_every_value_and_only_the_content(fx):
    """Reformatting the record (indentation, key order) is no damage; any value changed is."""
    from scalecl.training.checkpoint import record_digest

    meta = json.loads((fx["route"] / "scalecl.json").read_text())
    assert meta["record_digest"] == record_digest(json.loads(json.dumps(meta, indent=None, sort_keys=True)))
    for path in (("options", "tau"), ("base_config", "hidden_size"), ("method",), ("dtype",)):
        edited = json.loads(json.dumps(meta))
        leaf = edited
        for k in path[:-1]:
            leaf = leaf[k]
        leaf[path[-1]] = "x" if isinstance(leaf[path[-1]], str) else leaf[path[-1]] + 1
        assert record_digest(edited) != meta["record_digest"], path
