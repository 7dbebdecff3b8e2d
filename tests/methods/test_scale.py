"""SCALE correctness, asserted numerically on tiny random GPT-NeoX and Llama models (fp32, CPU).

Tolerance: 1e-5 max abs difference for every equality (spec/method.md).
"""

from __future__ import annotations

import copy

import pytest
import torch

from scalecl import ScaleConfig, load_model, routing_fractions, save_model, scale_path, upscale
from scalecl.common.errors import ScaleclError
from scalecl.modeling.scale_layers import UpLinear
from tests.conftest import make_base, random_batch, snapshot, split_threshold, train_steps

TOL = dict(atol=1e-5, rtol=0.0)
HU, FU = 32, 24  # hidden_up = 4 heads of 8 (Llama: one GQA group of 4) or 2 heads of 16 (NeoX)


def make_scaled(case: str, variant: str, l_fp: int | None = 1, **kw):
    base = make_base(case)
    cfg = ScaleConfig(variant=variant, hidden_up=HU, ffn_up=FU, l_fp=None if variant == "preserve" else l_fp, **kw)
    return base, upscale(base, cfg)


def preserved_layers(model) -> int:
    return model.scale_l_fp


@pytest.mark.parametrize("variant", ["preserve", "adapt", "route"])
def test_logits_equal_base_at_init(arch_case, variant):
    base, m = make_scaled(arch_case, variant)
    ids = random_batch(base.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, base(ids).logits, **TOL)


@pytest.mark.parametrize("variant", ["preserve", "adapt", "route"])
def test_persistent_preservation_after_training(arch_case, variant):
    """Theorem 3.1: the first d channels of every layer with frozen W12 equal the base model's."""
    base, m = make_scaled(arch_case, variant)
    d, n_layers = base.config.hidden_size, base.config.num_hidden_layers
    keep = n_layers if variant == "preserve" else 1
    ids = random_batch(base.config.vocab_size, seed=7)

    def check(model):
        with torch.no_grad():
            hb = base(ids, output_hidden_states=True).hidden_states
            hm = model(ids, output_hidden_states=True).hidden_states
        # hidden_states[0] is the embedding output, [i] the output of block i-1 (the last one after the norm)
        for i in range(keep + 1):
            torch.testing.assert_close(hm[i][: ids.shape[0], :, :d], hb[i], **TOL)
        return hb, hm

    check(m)
    before = snapshot(m)
    losses = train_steps(m, steps=20)
    assert losses[-1] < losses[0]  # it did learn something
    hb, hm = check(m)
    if variant == "adapt":  # above l_fp the original channels are free to move, and they do
        assert (hm[n_layers - 1][:, :, :d] - hb[n_layers - 1]).abs().max() > 1e-3
    after = snapshot(m)
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    for name, blob in before.items():
        if name not in trainable:
            assert blob == after[name], f"frozen parameter {name} changed"
    assert any(before[n] != after[n] for n in trainable)


def test_every_pretrained_tensor_frozen_and_new_blocks_trainable(arch_case):
    base, m = make_scaled(arch_case, "adapt", l_fp=2)
    base_ptrs = {p.data_ptr() for p in base.parameters()}
    for name, p in m.named_parameters():
        # the upscaled model shares no storage with the base (upscale copies by default) ...
        assert p.data_ptr() not in base_ptrs
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("w21", "w22", "bias_up", "weight_up") or ".up." in name:
            assert p.requires_grad, name
        elif leaf == "w12":
            layer = int(name.split("layers.")[1].split(".")[0])
            assert p.requires_grad == (layer >= 2), name
        else:
            assert not p.requires_grad, name


def test_route_equals_two_passes_combined_by_eq5(arch_case):
    _, m = make_scaled(arch_case, "route", l_fp=1)
    train_steps(m, steps=10)
    ids = random_batch(m.config.vocab_size, seed=11)
    d = m.scale_base_d if hasattr(m, "scale_base_d") else m.config.hidden_size - HU
    head = m.get_output_embeddings()
    with torch.no_grad(), scale_path(m, "preserve"):
        hp = m(ids, output_hidden_states=True).hidden_states[-1]
    with torch.no_grad(), scale_path(m, "adapt"):
        ha = m(ids, output_hidden_states=True).hidden_states[-1]
    zp, zp_up = hp[..., :d] @ head.weight.T, hp[..., d:] @ head.weight_up.T
    za, za_up = ha[..., :d] @ head.weight.T, ha[..., d:] @ head.weight_up.T
    cos = torch.nn.functional.cosine_similarity(zp, za, dim=-1)
    assert (zp - za).abs().max() > 1e-4, "training should have separated the two paths"
    # thresholds that route everything one way, and the median, which splits the tokens
    for tau in (-1.0, 1.0, split_threshold(cos)):
        m.scale_state.tau = tau
        expected = torch.where((cos > tau).unsqueeze(-1), (zp + za) / 2 + zp_up, za + za_up)
        with torch.no_grad():
            got = m(ids).logits
        torch.testing.assert_close(got, expected, **TOL)
        fr = routing_fractions(m)
        assert 0.0 <= fr["route_preserve"] <= 1.0 and 0.0 <= fr["route_adapt"] <= 1.0
        assert fr["route_preserve"] + fr["route_adapt"] == pytest.approx(1.0)
        assert fr["route_preserve"] == pytest.approx((cos > tau).float().mean().item())
    assert routing_fractions(m)["route_preserve"] not in (0.0, 1.0)


def test_route_computes_lower_layers_once():
    """Layers below l_fp see the batch once; layers from l_fp up see it doubled."""
    _, m = make_scaled("llama-gqa-tied", "route", l_fp=2)
    seen = []
    for i, layer in enumerate(m.model.layers):
        layer.register_forward_hook(lambda mod, a, out, i=i: seen.append((i, out.shape[0])))
    ids = random_batch(m.config.vocab_size, batch=3)
    with torch.no_grad():
        m(ids)
    assert seen == [(0, 3), (1, 3), (2, 6)]


@pytest.mark.parametrize("variant", ["preserve", "adapt", "route"])
def test_greedy_generation_with_and_without_cache(arch_case, variant):
    _, m = make_scaled(arch_case, variant)
    train_steps(m, steps=5)
    prompt = random_batch(m.config.vocab_size, batch=2, seq=5, seed=3)
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        cached = m.generate(prompt, use_cache=True, **kw)
        uncached = m.generate(prompt, use_cache=False, **kw)
    assert torch.equal(cached, uncached)


def _expected_trainable(case: str, variant: str, l_fp: int, collab: tuple[str, ...]) -> int:
    """Closed-form count of trainable parameters (all W21/W22/new biases/norms/embedding/head + open W12)."""
    base = make_base(case)
    c = base.config
    d, n_layers, inter, vocab, hu, fu = c.hidden_size, c.num_hidden_layers, c.intermediate_size, c.vocab_size, HU, FU
    n_collab = 0 if variant == "preserve" else n_layers - l_fp
    if case.startswith("neox"):
        # qkv: (3d+3hu) x (d+hu) minus the frozen 3d x d, split as W21/W22 + bias_up; dense, h_to_4h, 4h_to_h alike
        new_blocks = (3 * hu * (d + hu) + 3 * hu) + (hu * (d + hu) + hu) + (fu * (d + hu) + fu) + (hu * (inter + fu) + hu)
        w12_attn = 3 * d * hu + d * hu
        w12_mlp = inter * hu + d * fu
        norms = 2 * (2 * hu)  # two LayerNorms per block, gain + bias on the new channels
        final = 2 * hu
        emb_head = vocab * hu * 2  # untied: embedding columns and head columns
    else:
        kvd = c.num_key_value_heads * (d // c.num_attention_heads)
        kv_up = (hu // (d // c.num_attention_heads)) // (c.num_attention_heads // c.num_key_value_heads) * (d // c.num_attention_heads)
        new_blocks = hu * (d + hu) + 2 * kv_up * (d + hu) + hu * (d + hu) + 2 * fu * (d + hu) + hu * (inter + fu)
        w12_attn = d * hu + 2 * kvd * hu + d * hu
        w12_mlp = 2 * inter * hu + d * fu
        norms = 2 * hu  # two RMSNorms per block, gain only
        final = hu
        emb_head = vocab * hu * (1 if c.tie_word_embeddings else 2)
    w12 = (w12_attn if "attn" in collab else 0) + (w12_mlp if "mlp" in collab else 0)
    return n_layers * (new_blocks + norms) + n_collab * w12 + final + emb_head


@pytest.mark.parametrize("variant,l_fp,collab", [
    ("preserve", None, ("attn", "mlp")), ("adapt", 0, ("attn",)), ("adapt", 1, ("mlp",)), ("route", 2, ("attn", "mlp")),
])
def test_trainable_count_closed_form(arch_case, variant, l_fp, collab):
    base = make_base(arch_case)
    m = upscale(base, ScaleConfig(variant=variant, hidden_up=HU, ffn_up=FU, l_fp=l_fp, collab=collab))
    got = sum(p.numel() for p in m.parameters() if p.requires_grad)
    resolved = m.scale_l_fp
    assert got == _expected_trainable(arch_case, variant, resolved, collab)
    # and the config reports the widened sizes
    assert m.config.hidden_size == base.config.hidden_size + HU
    assert m.config.intermediate_size == base.config.intermediate_size + FU


def test_gqa_head_layout_keeps_old_groups():
    """New query heads are appended after the old ones and map to the appended KV head only."""
    base = make_base("llama-gqa-tied")
    m = upscale(base, ScaleConfig(variant="adapt", hidden_up=HU, ffn_up=FU))
    c0, c1 = base.config, m.config
    assert c1.num_attention_heads == c0.num_attention_heads + 4
    assert c1.num_key_value_heads == c0.num_key_value_heads + 1
    assert c1.num_attention_heads // c1.num_key_value_heads == c0.num_attention_heads // c0.num_key_value_heads


def test_init_options():
    base = make_base("llama-gqa-untied")
    w = base.model.layers[0].self_attn.q_proj.weight.detach()
    m = upscale(base, ScaleConfig(variant="adapt", hidden_up=HU, ffn_up=FU, init=("svd", "svd")))
    q: UpLinear = m.model.layers[0].self_attn.q_proj
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    k = q.w21.shape[0]
    torch.testing.assert_close(q.w21, s[:k, None] * vh[:k], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(q.w21, u[:, :k].T @ w, atol=1e-5, rtol=1e-4)  # S_k V_k^T = U_k^T W
    torch.testing.assert_close(q.w22, torch.diag(s[:k]), atol=1e-6, rtol=0)
    # out_up larger than rank: directions cycle (4h_to_h input has rank <= d)
    m0 = upscale(base, ScaleConfig(variant="adapt", hidden_up=HU, ffn_up=FU, init=("zero", "rnd")))
    q0 = m0.model.layers[0].self_attn.q_proj
    assert q0.w21.abs().sum() == 0
    assert 0.5 < q0.w22.std().item() / (2.0 / q0.w22.shape[1]) ** 0.5 < 1.5  # He normal scale
    assert q0.w12.abs().sum() == 0


def test_rnd_init_is_deterministic_under_a_seed():
    base = make_base("neox-parallel")
    cfg = ScaleConfig(variant="route", hidden_up=HU, ffn_up=FU, init=("rnd", "rnd"))
    torch.manual_seed(5)
    a = snapshot(upscale(base, cfg))
    torch.manual_seed(5)
    b = snapshot(upscale(base, cfg))
    assert a == b


def test_tie_weights_and_checkpoint_keep_the_shared_up_tensor(tmp_path):
    base, m = make_scaled("llama-gqa-tied", "route")
    train_steps(m, steps=3)
    ids = random_batch(m.config.vocab_size)
    with torch.no_grad():
        ref = m(ids).logits
    m.tie_weights()  # lm-eval's HFLM calls this: it must not break the widened head
    assert m.lm_head.weight_up is m.model.embed_tokens.weight_up
    save_model(m, tmp_path / "ck", None)  # the method is inferred from the model
    assert load_model(tmp_path / "ck").scalecl_meta["method"] == "scale-route"
    from scalecl.methods import get_method

    meth = get_method("scale-route", hidden_up=HU, ffn_up=FU, l_fp=1)
    save_model(m, tmp_path / "ck", meth, overwrite=True)
    m2 = load_model(tmp_path / "ck")
    assert m2.lm_head.weight_up is m2.model.embed_tokens.weight_up
    assert {n for n, p in m2.named_parameters() if p.requires_grad} == {
        n for n, p in m.named_parameters() if p.requires_grad
    }
    with torch.no_grad():
        torch.testing.assert_close(m2(ids).logits, ref, atol=0, rtol=0)
        torch.testing.assert_close(m(ids).logits, ref, atol=0, rtol=0)


def test_deepcopy_of_route_model_is_independent():
    _, m = make_scaled("neox-parallel", "route")
    m2 = copy.deepcopy(m)
    m2.scale_state.tau = -1.0
    assert m.scale_state.tau == 0.5  # the default
    ids = random_batch(m.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(m2(ids).logits, m(ids).logits, **TOL)


def test_optimizer_state_only_for_trainable_parameters():
    _, m = make_scaled("llama-gqa-tied", "adapt")
    train_steps(m, steps=1)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3)
    ids = random_batch(m.config.vocab_size)
    m(ids, labels=ids).loss.backward()
    opt.step()
    state_ids = {id(p) for p in opt.state}
    for p in m.parameters():
        assert (id(p) in state_ids) == p.requires_grad


@pytest.mark.parametrize("kw,msg", [
    (dict(hidden_up=20), "not a multiple of head_dim"),
    (dict(hidden_up=16), "GQA group"),  # 2 new heads, group of 4
    (dict(l_fp=9), "l_fp must lie in 0..3"),
])
def test_size_errors_before_work(kw, msg):
    base = make_base("llama-gqa-tied")
    with pytest.raises(ScaleclError, match=msg):
        upscale(base, ScaleConfig(variant="adapt", **{"hidden_up": HU, "ffn_up": FU, **kw}))


@pytest.mark.parametrize("kw,msg", [
    (dict(tau=1.5), "tau must lie"), (dict(variant="both"), "unknown variant"),
    (dict(init=("svd", "ones")), "init must be"), (dict(collab=("ffn",)), "collab must be"),
    (dict(hidden_up=0), "hidden_up must be"),
])
def test_config_errors(kw, msg):
    with pytest.raises(ScaleclError, match=msg):
        ScaleConfig(**kw)


def test_string_options_from_the_command_line():
    """`--set methods.scale.collab=attn` arrives as a bare string: it means ("attn",), not its letters."""
    from scalecl.experiments import load_preset
    from scalecl.methods import get_method

    assert ScaleConfig(collab="attn").collab == ("attn",)
    assert ScaleConfig(init="svd,zero").init == ("svd", "zero")
    rc = load_preset("cpt", "tiny", ["methods.scale-adapt.collab=attn"])
    assert get_method("scale-adapt", **rc.method_options("scale-adapt")).config.collab == ("attn",)
    rc = load_preset("cpt", "tiny", ["methods.scale-adapt.collab=attn,mlp"])
    assert get_method("scale-adapt", **rc.method_options("scale-adapt")).config.collab == ("attn", "mlp")


def test_route_head_cosine_from_the_gram_matrix(arch_case):
    """cos(W a, W b) computed in hidden space equals the cosine of explicit logits; the cache follows W."""
    _, m = make_scaled(arch_case, "route")
    head = m.get_output_embeddings()
    g = torch.Generator().manual_seed(3)
    a, b = (torch.randn(4, 9, head.d, generator=g) for _ in range(2))
    b[0] = -a[0] + 0.01 * b[0]  # near-opposite, and a near-parallel row
    b[1] = 2 * a[1] + 1e-3 * b[1]
    want = torch.nn.functional.cosine_similarity(a @ head.weight.T, b @ head.weight.T, dim=-1)
    torch.testing.assert_close(head.logit_cosine(a, b), want, **TOL)
    first = head.gram()
    assert head.gram() is first  # cached while W is unchanged
    with torch.no_grad():
        head.weight.mul_(2.0)  # in place: the cache must notice
    torch.testing.assert_close(head.gram(), 4 * first, rtol=1e-6, atol=1e-5)


def test_route_shares_the_products_of_its_first_forked_block(arch_case):
    """Only linears that read a norm of the block input at layer l_fp get both halves from one product."""
    _, m = make_scaled(arch_case, "route", l_fp=1)
    parallel = getattr(m.config, "use_parallel_residual", False)
    want = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "attention.query_key_value"}
    if parallel:
        want.add("mlp.dense_h_to_4h")
    got = {tuple(name.split(".layers.")[1].split(".", 1)) for name, mod in m.named_modules()
           if isinstance(mod, UpLinear) and mod.shared_input}
    assert {layer for layer, _ in got} == {"1"}
    assert {name for _, name in got} == want & {n for n, _ in m.get_submodule(
        "gpt_neox.layers.1" if hasattr(m, "gpt_neox") else "model.layers.1").named_modules()}
