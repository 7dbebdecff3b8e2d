"""Every method x every decoder family of issue #21 (Mistral, Qwen2, Qwen3, Phi-3, OLMo 2, Gemma 2, Gemma 3),
tied and untied embeddings, on tiny random configs with GQA and randomised norms and biases (fp32, CPU).

Per case: the forward is finite; exactly the declared parameters train (and move, the rest stays bit for bit);
the base function where the method claims it: SCALE's Theorem 3.1 (the first d channels of every hidden state
and the logits equal the base's, within 1e-5) for Preserve before and after training, for Adapt/Route at
initialisation and below l_fp after training (Route's preserve path at every layer); LLaMA Pro's new blocks
start as the identity (logits and cached greedy generation); a save -> load round trip reproduces the logits.
SCALE checkpoints (also those written by `scalecl upscale` / `prepare` on a tiny random base) load in plain
transformers with trust_remote_code, in a process that cannot import scalecl, with equal logits and equal
cached greedy generation.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from typer.testing import CliRunner

from scalecl import load_model, save_model
from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.methods import get_method, trainable_parameters
from scalecl.models.build import ARCHS, model_from_config, tiny_config
from tests.conftest import SCALE_OPTS, method_cases, random_batch, snapshot, train_steps
from tests.training.test_checkpoint import _LOAD_ALL, run_clean

FAMILIES = ("mistral", "qwen2", "qwen3", "phi3", "olmo2", "gemma2", "gemma3_text")
# families whose config has attention_bias: the untied case turns it on (biases on q, k, v and o)
ATTENTION_BIAS = {"qwen3", "olmo2", "gemma2", "gemma3_text"}
CASES = {f"{fam}-{'tied' if tied else 'untied'}": (fam, tied) for fam in FAMILIES for tied in (True, False)}
SCALE = SCALE_OPTS  # hidden_up 32: a whole GQA group of new heads in every tiny family
L_FP = 1
METHODS = method_cases(l_fp=L_FP)  # the shared case table, W12 trainable above layer L_FP for Adapt and Route
TOL = dict(atol=1e-5, rtol=0.0)
runner = CliRunner()

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny matrices, one thread


def family_config(case: str):
    fam, tied = CASES[case]
    extra = {"attention_bias": True} if fam in ATTENTION_BIAS and not tied else {}
    return tiny_config(fam, tie_word_embeddings=tied, **extra)


def randomise_norms_and_biases(model, seed: int = 3) -> None:
    """Norm gains (and biases) and linear biases away from their identity/zero init, so that an exact split
    of a norm or a dropped bias shows in the numbers."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(0.3 * torch.randn(p.shape, generator=g))


_BASES: dict[str, torch.nn.Module] = {}


def family_base(case: str):
    """A seeded tiny base of one case (shared read-only; every use works on a deep copy)."""
    if case not in _BASES:
        base = model_from_config(family_config(case), seed=0)
        randomise_norms_and_biases(base)
        _BASES[case] = base
    return _BASES[case]


def declared_trainable(name: str, model, base) -> set[str]:
    """The parameters each method says train, from its definition (not from requires_grad)."""
    arch = ARCHS[base.config.model_type]
    names = [n for n, _ in model.named_parameters()]

    def layer(n: str) -> int | None:
        tail = n.split(f"{arch.layers}.", 1)
        return int(tail[1].split(".")[0]) if len(tail) == 2 else None

    if name == "fft":
        return set(names)
    if name == "lora":
        return {n for n in names if ".lora_A." in n or ".lora_B." in n}
    if name == "freeze":
        return {n for n in names if not n.startswith(arch.embed + ".") and (layer(n) is None or layer(n) >= 1)}
    if name == "llama-pro":  # [0, new, 1, new, 2, new]
        return {n for n in names if layer(n) in (1, 3, 5)}
    new = {n for n in names if n.rsplit(".", 1)[-1] in ("w21", "w22", "bias_up", "weight_up") or ".up." in n}
    if name == "scale-preserve":
        return new
    return new | {n for n in names if n.endswith(".w12") and layer(n) >= L_FP}


def assert_theorem_31(model, base, ids, layers: int) -> None:
    """The first d channels of hidden states 0..layers (embedding output, then block outputs; the last one is
    after the final norm) equal the base's; on a forked Route batch, the first (preserve) half."""
    d, b = base.config.hidden_size, ids.shape[0]
    with torch.no_grad():
        hb = base(ids, output_hidden_states=True).hidden_states
        hm = model(ids, output_hidden_states=True).hidden_states
    assert len(hm) == len(hb)
    for i in range(layers + 1):
        torch.testing.assert_close(hm[i][:b, :, :d], hb[i], **TOL, msg=lambda m, i=i: f"hidden state {i}: {m}")


@pytest.mark.parametrize("name", list(METHODS))
@pytest.mark.parametrize("case", list(CASES))
def test_family_matrix(case: str, name: str, tmp_path):
    base = family_base(case)
    method = get_method(name, **METHODS[name])
    method.check(base.config)
    ids = random_batch(base.config.vocab_size, batch=2, seq=12, seed=1)
    with torch.no_grad():
        base_logits = base(ids).logits
    torch.manual_seed(0)
    model = method.apply(copy.deepcopy(base))
    n_layers = base.config.num_hidden_layers

    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all()
    if name != "fft" and name != "freeze":  # every other method starts at the base function
        torch.testing.assert_close(logits, base_logits, **TOL)
    if name.startswith("scale-"):
        assert_theorem_31(model, base, ids, n_layers)
    if name == "llama-pro":  # identity blocks, renumbered KV-cache slots: cached greedy decoding is the base's
        gen = dict(max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0, return_dict_in_generate=True,
                   output_logits=True)
        out, ref = model.generate(ids, **gen), base.generate(ids, **gen)
        assert torch.equal(out.sequences, ref.sequences)
        torch.testing.assert_close(torch.stack(out.logits), torch.stack(ref.logits), **TOL)

    trainable = trainable_parameters(model)
    assert set(trainable) == declared_trainable(name, model, base)
    # a few AdamW steps: every trainable tensor moves, every other one stays bit for bit. Five steps: a gradient
    # crosses one zero-initialised block per step (head up-columns, W22, ...)
    before = snapshot(model)
    train_steps(model, steps=5, lr=1e-2)
    after = snapshot(model)
    changed = {n for n in after if after[n] != before[n]}
    assert changed == set(trainable)

    if name == "scale-preserve" or name == "scale-route":  # the preserve path is the base at every layer
        assert_theorem_31(model, base, ids, n_layers)
    if name == "scale-adapt":
        assert_theorem_31(model, base, ids, L_FP)
    with torch.no_grad():
        trained = model(ids).logits
    assert torch.isfinite(trained).all()
    save_model(model, tmp_path / "ckpt", method)
    loaded = load_model(tmp_path / "ckpt")
    assert set(trainable_parameters(loaded)) == set(trainable)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, trained, atol=0, rtol=0)


@pytest.mark.parametrize("variant", ["preserve", "adapt", "route"])
@pytest.mark.parametrize("fam", FAMILIES)
def test_gradients_equal_plain_autograd(fam, variant, monkeypatch):
    """The widened linears' hand-written backward (frozen blocks and constant channels skipped) against plain
    autograd over the concatenated matrices, in float64 with every trainable tensor randomised
    (test_scale_backward's reference), on every family: fused outputs, head norms, post-norms, scaled embedding."""
    from tests.methods.test_scale_backward import assert_same_gradients, split_tau

    base = family_base(f"{fam}-untied")
    m = get_method(f"scale-{variant}", **METHODS[f"scale-{variant}"]).apply(copy.deepcopy(base).double())
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in m.parameters():
            if p.requires_grad:  # no block left at its zero/identity init
                p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    ids = random_batch(m.config.vocab_size, seed=3)
    if variant == "route":
        m.scale_state.tau = split_tau(m, ids)
    got = assert_same_gradients(m, monkeypatch, ids)
    n_layers = m.config.num_hidden_layers
    assert m.scale_state.const_preserve == n_layers + 1
    assert m.scale_state.const_adapt == (n_layers + 1 if variant == "preserve" else L_FP)
    assert all(grad.abs().max() > 0 for n, grad in got.items() if not n.endswith("w12")), "a block got no gradient"


def test_gemma_embedding_keeps_the_base_scale():
    """Gemma multiplies its embeddings by sqrt(hidden_size): the widened model keeps sqrt(d) of the base, not
    sqrt(d + hidden_up), on the original channels."""
    for fam in ("gemma2", "gemma3_text"):
        base = model_from_config(tiny_config(fam), seed=0)
        model = get_method("scale-preserve", **SCALE).apply(copy.deepcopy(base))
        emb = model.get_input_embeddings()
        assert emb.embed_scale == pytest.approx(base.config.hidden_size**0.5)
        assert model.config.hidden_size == base.config.hidden_size + SCALE["hidden_up"]
        ids = random_batch(128, batch=1, seq=5)
        torch.testing.assert_close(emb(ids)[..., : base.config.hidden_size], base.get_input_embeddings()(ids),
                                   atol=0, rtol=0)


def test_head_norms_split_at_the_base_heads():
    """OLMo 2's q/k norm over all heads together is split at the base heads' width; Qwen3's and Gemma 3's
    per-head norms keep the frozen gain for the base heads and give the new heads their own."""
    from scalecl.modeling.scale_layers import HeadSplitNorm, SplitNorm

    for fam in ("olmo2", "qwen3", "gemma3_text"):
        c = tiny_config(fam)
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        new_q = SCALE["hidden_up"] // hd
        q, kv = c.num_attention_heads, c.num_key_value_heads
        model = get_method("scale-adapt", **SCALE).apply(model_from_config(c, seed=0))  # widens c in place
        for layer in model.model.layers:
            for norm, heads, new in ((layer.self_attn.q_norm, q, new_q),
                                     (layer.self_attn.k_norm, kv, new_q // (q // kv))):
                assert norm.up.weight.requires_grad and not norm.base.weight.requires_grad
                if fam == "olmo2":  # one norm over heads x head_dim channels: split there
                    assert type(norm) is SplitNorm and norm.d == heads * hd and norm.up.weight.shape == (new * hd,)
                else:  # per head: split along the heads axis, a new gain over head_dim
                    assert isinstance(norm, HeadSplitNorm) and norm.d == heads and norm.up.weight.shape == (hd,)


def test_refused_families_say_why():
    with pytest.raises(ScaleclError, match="multimodal Gemma 3"):
        get_method("scale-route").check(type("C", (), {"model_type": "gemma3"})())
    with pytest.raises(ScaleclError, match="unsupported architecture 'gpt2'"):
        get_method("llama-pro").check(type("C", (), {"model_type": "gpt2", "num_hidden_layers": 2})())


def test_modules_of_unknown_forward_are_refused():
    """SCALE widens only the modules whose forward it reproduces: a base whose linears are already peft LoRA
    layers is one line, not a silently different model."""
    lora = get_method("lora", rank=2).apply(model_from_config(tiny_config("qwen3"), seed=0))
    with pytest.raises(ScaleclError, match="not nn.Linear"):
        get_method("scale-preserve", **SCALE).apply(lora.get_base_model())


@pytest.mark.parametrize("fam,hidden_up,msg", [
    ("gemma2", 12, "not a multiple of head_dim=8"),
    ("qwen3", 16, "GQA group size 4"),
    ("gemma3_text", 24, "GQA group size 4"),
])
def test_widening_constraints_per_family(fam, hidden_up, msg):
    with pytest.raises(ScaleclError, match=msg):
        get_method("scale-preserve", hidden_up=hidden_up, ffn_up=8).check(tiny_config(fam))


def test_a_widening_transformers_would_refuse_is_one_line(tmp_path):
    """Gemma's config requires hidden_size % num_attention_heads == 0 even with an explicit head_dim: 64 + 16
    channels over 4 + 2 heads would build here and then never load; refused before any work, with values that work."""
    out = tmp_path / "never"
    res = runner.invoke(app, ["upscale", "--random-config", "gemma2", "--out", str(out), "--hidden-up", "16",
                              "--ffn-up", "8"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "transformers refuses" in lines[0], res.output
    assert "values that work for this model: 32, 96" in lines[0]
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------------
# Remote code: every family's SCALE checkpoints in plain transformers, and the CLI on tiny random bases


@pytest.fixture(scope="module")
def remote_jobs(tmp_path_factory) -> dict:
    """Checkpoints to load outside scalecl, each with the logits and cached greedy generation it must reproduce:
    SCALE of every case and variant (trained a step, every trained tensor moved off its start) for remote code;
    LLaMA Pro (plain transformers) and LoRA (peft) of every family; SCALE written by the CLI for every family."""
    root = tmp_path_factory.mktemp("families")
    ids = random_batch(128, batch=2, seq=10, seed=4)
    jobs: dict[str, dict] = {}

    def add(name: str, how: str, ref_logits, model) -> None:
        ref = {"ids": ids, "prompt": ids[:, :4], "logits": ref_logits}
        with torch.no_grad():
            gen = model.generate(ref["prompt"], max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0,
                                 return_dict_in_generate=True, output_logits=True)
        ref |= {"sequences": gen.sequences, "gen_logits": torch.stack(gen.logits)}
        torch.save(ref, root / f"{name}.pt")
        jobs[name] = {"name": name, "dir": str(root / name), "ref": str(root / f"{name}.pt"), "how": how,
                      "trainable": sorted(n for n, p in model.named_parameters() if p.requires_grad)}

    def trained(case: str, name: str):
        method = get_method(name, **METHODS[name])
        torch.manual_seed(0)
        model = method.apply(copy.deepcopy(family_base(case)))
        train_steps(model, steps=1)
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn_like(p))
        save_model(model, root / f"{case}-{name}", method, base_model="random:tiny")
        with torch.no_grad():
            return model(ids).logits, model

    for case in CASES:
        for variant in ("preserve", "adapt", "route"):
            add(f"{case}-scale-{variant}", "remote", *trained(case, f"scale-{variant}"))
        if case.endswith("-untied"):
            add(f"{case}-llama-pro", "plain", *trained(case, "llama-pro"))
            add(f"{case}-lora", "peft", *trained(case, "lora"))
    for name, args in cli_cases(root).items():
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        with torch.no_grad():  # a fresh SCALE model starts at its base: the seeded tiny random base's logits
            base_logits = model_from_config(tiny_config(name.split("-")[1]), seed=0)(ids).logits
        add(name, "remote", base_logits, load_model(root / name))
    return {"root": root, "jobs": jobs}


def cli_cases(root) -> dict[str, list[str]]:
    """Every family through the command line: `scalecl upscale --model` a tiny random base saved as a folder, or
    `scalecl prepare --random-config` (the same seeded base), each SCALE variant in turn."""
    cases = {}
    for i, fam in enumerate(FAMILIES):
        variant = ("preserve", "adapt", "route")[i % 3]
        out = root / f"cli-{fam}"
        if i % 2 == 0:
            model_from_config(tiny_config(fam), seed=0).save_pretrained(root / f"base-{fam}")
            l_fp = [] if variant == "preserve" else ["--l-fp", "1"]
            cases[out.name] = ["upscale", "--model", str(root / f"base-{fam}"), "--out", str(out), "--variant", variant,
                               "--hidden-up", "32", "--ffn-up", "16", *l_fp]
        else:
            cases[out.name] = ["prepare", "--method", f"scale-{variant}", "--random-config", fam, "--set",
                               "hidden_up=32", "--set", "ffn_up=16", "--out", str(out)]
    return cases


@pytest.mark.slow
def test_checkpoints_load_outside_scalecl(remote_jobs):
    """SCALE with trust_remote_code, LLaMA Pro with plain transformers, LoRA with peft: in a process that cannot
    import scalecl, equal logits and equal cached greedy generation (1e-5), the same trainable set for SCALE."""
    jobs = list(remote_jobs["jobs"].values())
    work = remote_jobs["root"] / "work"
    work.mkdir()
    (work / "jobs.json").write_text(json.dumps([{k: v for k, v in j.items() if k != "trainable"} for j in jobs]))
    res = run_clean(_LOAD_ALL, str(work / "jobs.json"), cwd=work)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out.pop("scalecl_imported") is False
    assert len(jobs) == 3 * len(CASES) + 2 * len(FAMILIES) + len(FAMILIES)
    for job in jobs:
        r = out[f"{job['name']}/{job['how']}"]
        assert "error" not in r, (job["name"], r["error"][-800:])
        assert r["diff"] <= 1e-5 and r["gen_diff"] <= 1e-5 and r["same_tokens"], (job["name"], r)
        assert r["layer_idx"] == list(range(len(r["layer_idx"]))), job["name"]  # KV-cache slots in order
        if job["how"] == "remote":
            assert r["module"].startswith("transformers_modules.") and r["module"].endswith(".modeling_scale")
            assert r["trainable"] == job["trainable"], job["name"]
            config = json.loads((remote_jobs["root"] / job["dir"] / "config.json").read_text())
            assert r["tied_up"] == bool(config.get("tie_word_embeddings")), job["name"]
        if job["how"] == "plain":  # LLaMA Pro: 3 + 3 blocks in a plain model of the family's own class
            assert len(r["layer_idx"]) == 6 and not r["module"].startswith("transformers_modules."), job["name"]


# ---------------------------------------------------------------------------------------------------------
# `scalecl budgets`: the families' constraints and paper-like budgets, on meta-device models of published sizes

# parameter counts of the published checkpoints (their model cards / safetensors totals)
PUBLISHED_TOTALS = {
    "meta-llama/Llama-3.2-1B": 1_235_814_400, "mistralai/Mistral-7B-v0.1": 7_241_732_096,
    "Qwen/Qwen2.5-0.5B": 494_032_768, "Qwen/Qwen3-0.6B": 596_049_920,
    "microsoft/Phi-3-mini-4k-instruct": 3_821_079_552, "allenai/OLMo-2-0425-1B": 1_484_916_736,
    "google/gemma-2-2b": 2_614_341_888, "google/gemma-3-1b-pt": 999_885_952,
}


@pytest.fixture(scope="module")
def family_rows():
    from scalecl.experiments.budget import family_budgets

    return family_budgets()


@pytest.mark.xdist_group("test_families.family_rows")  # family_rows built once (one worker)
def test_family_budgets(family_rows):
    from scalecl.experiments.budget import paper_budgets

    rows = {r.model: r for r in family_rows}
    assert {r.family for r in family_rows} == set(ARCHS) - {"gpt_neox"}
    for model, total in PUBLISHED_TOTALS.items():
        budgets = {b.method: b for b in rows[model].budgets}
        assert budgets["fft"].total == budgets["fft"].trainable == total, model
        assert all(0 < b.trainable <= b.total for b in budgets.values())
        assert budgets["scale-adapt"].trainable > budgets["scale-preserve"].trainable
    # the Llama row is the paper's Korean CPT setting itself
    paper = {r.method: r for r in paper_budgets() if r.setting.endswith("Llama-3.2-1B")}
    assert [(b.method, b.trainable, b.options) for b in rows["meta-llama/Llama-3.2-1B"].budgets] == \
        [(m, paper[m].trainable, paper[m].options) for m in paper]
    # constraints: head_dim x GQA group; Gemma 2's config needs hidden_size % heads == 0 as well
    assert (rows["Qwen/Qwen2.5-0.5B"].unit, rows["Qwen/Qwen2.5-0.5B"].hidden_up) == (448, 448)
    assert (rows["google/gemma-2-2b"].unit, rows["google/gemma-2-2b"].hidden_up) == (512, 2048)
    assert (rows["google/gemma-3-1b-pt"].unit, rows["google/gemma-3-1b-pt"].hidden_up) == (1024, 1024)
    assert {b.method: b.options for b in rows["Qwen/Qwen2.5-0.5B"].budgets}["lora"] == {"rank": 128}  # kv side 128
    assert {b.method: b.options for b in rows["google/gemma-2-2b"].budgets}["llama-pro"] == {"n": 2}  # 26 layers


@pytest.mark.xdist_group("test_families.family_rows")  # family_rows built once (one worker)
def test_cli_budgets_lists_the_families(family_rows, monkeypatch):
    monkeypatch.setattr("scalecl.experiments.budget.family_budgets", lambda: family_rows)
    monkeypatch.setattr("scalecl.experiments.budget.paper_budgets", lambda: [])
    res = CliRunner().invoke(app, ["budgets"], env={"COLUMNS": "240"})
    assert res.exit_code == 0, res.output
    for text in ("gemma3_text", "Qwen/Qwen3-0.6B", "2,614,341,888", "fused qkv", "sqrt(d)", "448"):
        assert text in res.output, text
