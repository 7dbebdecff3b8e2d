"""One matrix over every method x both paper families (GPT-NeoX: parallel residual, partial rotary, biases;
Llama: GQA, RMSNorm, SwiGLU, tied embeddings), plus the budget helper and the `prepare` CLI.

Tolerances: "base function preserved" is max abs logit difference <= 1e-5 in fp32 (spec/method.md sec. 4);
frozen parameters are compared bit for bit; a save -> load round trip must reproduce logits exactly.
"""

from __future__ import annotations

import copy

import pytest
import torch
from typer.testing import CliRunner

from scalecl import load_model, save_model
from scalecl.cli import app
from scalecl.experiments.budget import llama_32_1b_config, paper_budgets, pythia_160m_config, trainable_counts
from scalecl.methods import count_parameters, get_method, trainable_parameters
from scalecl.methods.lora import merge_lora
from scalecl.models.build import ARCHS, head_dim, kv_heads, model_from_config, tiny_config
from tests.conftest import method_cases

ARCH_KINDS = ("gpt_neox", "llama")
METHODS = method_cases()  # the shared case table (tests/conftest.py)
PRESERVES_BASE = {"lora", "llama-pro", "scale-preserve", "scale-adapt", "scale-route"}
ATOL = 1e-5  # fp32 on CPU


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny matrices, one thread


@pytest.fixture(scope="module", params=ARCH_KINDS)
def base(request):
    """A tiny seeded base model of one family (shared read-only; methods work on deep copies)."""
    return model_from_config(tiny_config(request.param), seed=0)


def _ids(seed: int = 1, batch: int = 2, length: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 128, (batch, length), generator=g)


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _expected_trainable(name: str, opts: dict, base) -> int | None:
    """Closed-form trainable counts (None for SCALE, whose count the budget test checks on meta models)."""
    c, arch = base.config, ARCHS[base.config.model_type]
    d, f, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    block = sum(p.numel() for p in base.get_submodule(arch.layers)[0].parameters())
    embedding = base.get_submodule(arch.embed).weight.numel()
    if name == "fft":
        return count_parameters(base)
    if name == "lora":  # r * (in + out) per targeted linear, every linear of every block
        if c.model_type == "gpt_neox":
            shapes = [(d, 3 * d), (d, d), (d, f), (f, d)]
        else:
            kv = kv_heads(c) * head_dim(c)
            shapes = [(d, d), (d, kv), (d, kv), (d, d), (d, f), (d, f), (f, d)]
        return L * sum(opts["rank"] * (i + o) for i, o in shapes)
    if name == "llama-pro":
        return opts["n"] * block
    if name == "freeze":  # a tied head is the embedding tensor, counted once
        return count_parameters(base) - embedding - opts["k"] * block
    return None


@pytest.mark.parametrize("name", list(METHODS))
def test_method_matrix(name: str, base, tmp_path):
    opts = METHODS[name]
    method = get_method(name, **opts)
    method.check(base.config)
    ids = _ids()
    with torch.no_grad():
        base_logits = base(ids).logits
    torch.manual_seed(0)
    model = method.apply(copy.deepcopy(base))
    assert method.describe() and "\n" not in method.describe()

    # forward finite, and the base function where the method claims it
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all()
    if name in PRESERVES_BASE:
        torch.testing.assert_close(logits, base_logits, atol=ATOL, rtol=0)
    if name == "llama-pro":  # KV-cache slots renumbered: cached greedy decoding matches the base's
        gen = dict(max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0,
                   return_dict_in_generate=True, output_logits=True)
        out, ref = model.generate(ids, **gen), base.generate(ids, **gen)
        assert torch.equal(out.sequences, ref.sequences)
        torch.testing.assert_close(torch.stack(out.logits), torch.stack(ref.logits), atol=ATOL, rtol=0)

    # trainable counts: closed form, and the meta-device budget helper agrees with the real model
    trainable = trainable_parameters(model)
    n_train, n_total = count_parameters(model, trainable_only=True), count_parameters(model)
    expected = _expected_trainable(name, opts, base)
    if expected is not None:
        assert n_train == expected
    if name in ("lora", "llama-pro"):
        assert n_total == count_parameters(base) + n_train
    assert trainable_counts(base.config, name, **opts) == (n_train, n_total)
    if name == "lora":  # exactly the four (GPT-NeoX) / seven (Llama) linear kinds of every block
        targeted = {n.split(".", 2)[-1] for n, _ in model.named_modules() if n.endswith(".lora_A")}
        arch = ARCHS[base.config.model_type]
        assert targeted == {f"{arch.layers}.{i}.{p}.lora_A" for i in range(3) for p in arch.linears}

    # a few AdamW steps at a high lr: exactly the trainable parameters move, the rest is bit-identical.
    # Five steps: a gradient crosses one zero-initialised block per step (head up-columns, W22, ...), so
    # SCALE's split-norm biases on all-zero up channels first receive one at step 4.
    before = _snapshot(model)
    opt = torch.optim.AdamW(trainable.values(), lr=1e-2)
    model.train()
    for _ in range(5):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed == set(trainable)
    for n, p in model.named_parameters():
        if n not in trainable:
            assert p.detach().numpy().tobytes() == before[n].numpy().tobytes(), n
    assert {id(p) for p in opt.state} == {id(p) for p in trainable.values()}

    # save -> load reproduces the trained model (structure, trainability and logits)
    with torch.no_grad():
        trained_logits = model(ids).logits
    save_model(model, tmp_path / "ckpt", method)
    loaded = load_model(tmp_path / "ckpt")
    assert set(trainable_parameters(loaded)) == set(trainable)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, trained_logits, atol=0, rtol=0)
    if name == "lora":  # merging folds the trained updates into a plain transformers model
        merged = merge_lora(loaded)
        assert type(merged) is type(base)
        with torch.no_grad():
            torch.testing.assert_close(merged(ids).logits, trained_logits, atol=ATOL, rtol=0)


@pytest.fixture(scope="module")
def budget_rows():
    return paper_budgets()


def test_paper_budgets(budget_rows):
    rows = {(r.setting.split(" / ")[1], r.method): r for r in budget_rows}
    assert all(0 < r.trainable <= r.total for r in rows.values())
    assert rows["Pythia-160M", "fft"].total == 162_322_944  # published sizes
    assert rows["Llama-3.2-1B", "fft"].total == 1_235_814_400
    assert rows["Llama-3.2-1B", "lora"].trainable == 16 * 256 * (4096 * 2 + 2560 * 2 + 10240 * 3)
    assert rows["Llama-3.2-1B", "freeze"].trainable == 1_235_814_400 - 128256 * 2048 - 3 * 60_821_504
    assert rows["Llama-3.2-1B", "llama-pro"].trainable == 4 * 60_821_504
    assert rows["Pythia-160M", "llama-pro"].trainable == 4 * 7_087_872
    assert rows["Llama-3.2-1B", "scale-adapt"].trainable > rows["Llama-3.2-1B", "scale-preserve"].trainable
    assert pythia_160m_config().num_hidden_layers == 12 and llama_32_1b_config().num_hidden_layers == 16
    # the biography budget is the bio paper preset's model: Pythia's shape with its 50,304 padded rows in force
    assert {r.vocab for r in budget_rows if r.setting.startswith("biography")} == {50_304}
    scale = rows["Pythia-160M", "scale-preserve"]
    assert scale.options == {"hidden_up": 128, "ffn_up": 128}  # the preset's options
    assert rows["Pythia-160M", "scale-route"].options == {"hidden_up": 128, "ffn_up": 128, "l_fp": 11}
    # SCALE's new embedding and head columns count 128 x vocabulary rows each (untied)
    smaller = trainable_counts(pythia_160m_config().__class__(**{**pythia_160m_config().to_dict(), "vocab_size": 1000}),
                               "scale-preserve", hidden_up=128, ffn_up=128)[0]
    assert scale.trainable - smaller == 2 * 128 * (50_304 - 1000)


runner = CliRunner()


def test_cli_prepare_writes_loadable_checkpoint(tmp_path):
    out = tmp_path / "lora"
    res = runner.invoke(app, ["prepare", "--method", "lora", "--random-config", "gpt_neox", "--set", "rank=4",
                              "--set", "dropout=0.0", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "LoRA" in res.output and "trainable" in res.output
    loaded = load_model(out)
    assert loaded.scalecl_meta["options"]["rank"] == 4
    ids = _ids()
    with torch.no_grad():  # LoRA starts at the base function of the same seeded random base
        torch.testing.assert_close(loaded(ids).logits, model_from_config(tiny_config("gpt_neox"))(ids).logits,
                                   atol=ATOL, rtol=0)
    res = runner.invoke(app, ["prepare", "--method", "scale-adapt", "--random-config", "llama", "--set",
                              "hidden_up=32", "--set", "ffn_up=16", "--set", "collab=attn", "--out",
                              str(tmp_path / "adapt")])
    assert res.exit_code == 0, res.output
    assert load_model(tmp_path / "adapt").scalecl_meta["options"]["collab"] == ["attn"]


@pytest.mark.parametrize("args", [
    ["--method", "llama-pro", "--set", "n=2"],  # 2 does not divide 3 layers
    ["--method", "nope"],
    ["--method", "freeze", "--set", "k=4"],
    ["--method", "lora", "--set", "rnk=4"],
])
def test_cli_prepare_bad_input(args, tmp_path):
    res = runner.invoke(app, ["prepare", "--random-config", "llama", "--out", str(tmp_path / "x"), *args])
    assert res.exit_code != 0
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert not (tmp_path / "x").exists()


def test_cli_budgets(budget_rows, monkeypatch):
    monkeypatch.setattr("scalecl.experiments.budget.paper_budgets", lambda: budget_rows)  # computed once
    monkeypatch.setattr("scalecl.experiments.budget.family_budgets", lambda: [])  # test_families checks that table
    res = runner.invoke(app, ["budgets"])
    assert res.exit_code == 0, res.output
    assert "llama-pro" in res.output and "1,235,814,400" in res.output
