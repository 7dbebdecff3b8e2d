"""The `scalecl` CLI: a real upscale run, and one clear line with a non-zero exit on bad input."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from scalecl import load_model
from scalecl.cli import app

runner = CliRunner()


def test_help_lists_every_subcommand():
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    for cmd in ("upscale", "train-bio", "train-cpt", "eval-ppl", "eval-harness", "plot"):
        assert cmd in res.output


def test_help_method_list_is_the_registry():
    """The --method help names the methods without importing them (torch): the list is the registry's."""
    from scalecl.cli.options import METHOD_NAMES
    from scalecl.methods import METHOD_ORDER, REGISTRY

    assert METHOD_NAMES == METHOD_ORDER and set(METHOD_NAMES) == set(REGISTRY)
    for command in ("prepare", "train-bio", "train-cpt"):
        help_text = " ".join(runner.invoke(app, [command, "--help"], env={"COLUMNS": "300"}).output.split())
        assert all(name in help_text for name in METHOD_NAMES), command


def test_upscale_writes_a_loadable_checkpoint(tmp_path):
    out = tmp_path / "up"
    res = runner.invoke(app, ["upscale", "--random-config", "llama", "--out", str(out), "--variant", "adapt",
                              "--hidden-up", "32", "--ffn-up", "16", "--l-fp", "2", "--collab", "attn",
                              "--init", "svd,zero"])
    assert res.exit_code == 0, res.output
    for word in ("embedding", "attention", "mlp", "trainable", "total"):
        assert word in res.output
    meta = json.loads((out / "scalecl.json").read_text())
    assert meta["method"] == "scale-adapt"
    assert meta["options"] == {"hidden_up": 32, "ffn_up": 16, "l_fp": 2, "collab": ["attn"],
                               "init": ["svd", "zero"], "tau": 0.5, "router": "logit", "embed_init": "zero"}
    assert meta["base_config"]["hidden_size"] == 64
    m = load_model(out)
    assert m.config.hidden_size == 96 and m.scale_config.variant == "adapt"
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 96
    with torch.no_grad():
        assert torch.isfinite(m(torch.tensor([[1, 2, 3]])).logits).all()


def test_upscale_from_a_local_checkpoint_directory(tmp_path):
    from scalecl.models.build import model_from_config, tiny_config

    model_from_config(tiny_config("gpt_neox")).save_pretrained(tmp_path / "base")
    res = runner.invoke(app, ["upscale", "--model", str(tmp_path / "base"), "--out", str(tmp_path / "up"),
                              "--variant", "preserve", "--hidden-up", "32", "--ffn-up", "32"])
    assert res.exit_code == 0, res.output
    assert load_model(tmp_path / "up").config.hidden_size == 96


@pytest.mark.parametrize("args,msg", [
    (["--hidden-up", "20"], "not a multiple of head_dim"),
    (["--hidden-up", "16"], "GQA group"),
    (["--l-fp", "7", "--variant", "adapt"], "l_fp must lie in 0..3"),
    (["--tau", "2"], "tau must lie in [-1, 1]"),
    (["--variant", "widen"], "unknown variant"),
    (["--init", "svd,ones"], "init must be"),
    (["--collab", "ffn"], "collab must be"),
])
def test_bad_scale_options_fail_with_one_line(tmp_path, args, msg):
    out = tmp_path / "never"
    res = runner.invoke(app, ["upscale", "--random-config", "llama", "--out", str(out), "--hidden-up", "32", *args])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and msg in lines[0] and lines[0].startswith("error:"), res.output
    assert not out.exists()


def test_missing_model_path_and_unsupported_architecture(tmp_path):
    res = runner.invoke(app, ["upscale", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "does not exist" in res.output
    cfg = tmp_path / "gpt2.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2}))
    res = runner.invoke(app, ["upscale", "--random-config", str(cfg), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "unsupported architecture 'gpt2'" in res.output
    (tmp_path / "gpt2dir").mkdir()
    (tmp_path / "gpt2dir" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    res = runner.invoke(app, ["upscale", "--model", str(tmp_path / "gpt2dir"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "unsupported architecture" in res.output
    assert not (tmp_path / "o").exists()


_ALLOC_PROBE = """
import os, resource, sys, torch
from scalecl.compute.machine import provenance, tune_cpu_allocator
tuned = tune_cpu_allocator()
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        t = torch.empty(4_000_000); t.fill_(1.0); del t  # 16 MB, freed and asked for again
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
recorded = provenance()["machine"]["malloc_tuned"]  # imports transformers: before the warm-up, not between
faults()
print(tuned, recorded, faults())
"""


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("env", ["1", "0", "1 of several processes"])
def test_allocator_tuning_reuses_freed_memory(env):
    """Tuned, five 16 MB allocations after a warm-up touch no fresh pages (4096 pages each otherwise). One of
    several processes (torchrun's WORLD_SIZE) is left untuned: it would keep every phase's peak."""
    import os
    import subprocess
    import sys

    world = {"WORLD_SIZE": "2"} if env.endswith("processes") else {}
    out = subprocess.run([sys.executable, "-c", _ALLOC_PROBE], capture_output=True, text=True, check=True,
                         env={**{k: v for k, v in os.environ.items() if k != "WORLD_SIZE"},
                              "SCALECL_TUNE_MALLOC": env[0], **world}).stdout.split()
    if env != "1":
        assert out[:2] == ["False", "False"]
    else:
        assert out[:2] == ["True", "True"]
        assert int(out[2]) < 200, f"{out[2]} page faults for re-used 16 MB blocks"
