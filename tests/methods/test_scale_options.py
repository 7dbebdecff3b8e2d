"""SCALE's `router` (what Route's cosine compares) and `embed_init` (the new embedding columns) options.

Each router is checked against an explicit computation from full (B, T, V) logits, and the router score the
model keeps (`state.route_score`) against the same. Tolerance 1e-5 (fp32), as in tests/methods/test_scale.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from scalecl import ScaleConfig, scale_path, upscale
from scalecl.cli import app
from scalecl.common.errors import ScaleclError
from scalecl.methods import get_method
from tests.conftest import make_base, random_batch, split_threshold, train_steps

TOL = dict(atol=1e-5, rtol=0.0)
HU, FU = 32, 24


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny matrices, one thread


def _explicit_scores(zp: torch.Tensor, za: torch.Tensor) -> dict[str, torch.Tensor]:
    """(B, T, V) logits of the two paths -> each router's (B, T) score, computed the obvious way."""
    centred = lambda z: z - z.mean(-1, keepdim=True)  # noqa: E731
    return {
        "logit": F.cosine_similarity(zp, za, dim=-1),
        "centered": F.cosine_similarity(centred(zp), centred(za), dim=-1),
        "prob": F.cosine_similarity(zp.softmax(-1), za.softmax(-1), dim=-1),
    }


@pytest.fixture(scope="module", params=["neox-sequential", "llama-gqa-tied"])
def trained_route(request):
    """A Route model trained until its two paths differ, with each path's final hidden state on a batch."""
    base = make_base(request.param)
    m = upscale(base, ScaleConfig(variant="route", hidden_up=HU, ffn_up=FU, l_fp=1, router="centered"))
    assert m.scale_state.router == "centered"  # the config reaches the shared state
    train_steps(m, steps=10)
    ids = random_batch(m.config.vocab_size, seed=11)
    with torch.no_grad(), scale_path(m, "preserve"):
        hp = m(ids, output_hidden_states=True).hidden_states[-1]
    with torch.no_grad(), scale_path(m, "adapt"):
        ha = m(ids, output_hidden_states=True).hidden_states[-1]
    return m, ids, hp, ha


@pytest.mark.parametrize("router", ["logit", "centered", "prob"])
def test_router_against_full_logits(trained_route, router):
    """Decision, kept score and Eq. 5 output equal the explicit computation, for a tau that splits the tokens."""
    m, ids, hp, ha = trained_route
    d, head = m.config.hidden_size - HU, m.get_output_embeddings()
    zp, za = hp[..., :d] @ head.weight.T, ha[..., :d] @ head.weight.T  # (B, T, V)
    zp_up, za_up = hp[..., d:] @ head.weight_up.T, ha[..., d:] @ head.weight_up.T
    scores = _explicit_scores(zp, za)
    score = scores[router]
    assert not torch.allclose(scores["logit"], scores["centered"], atol=1e-3)  # the routers do differ here
    state = m.scale_state
    state.router, state.tau = router, split_threshold(score)
    try:
        with torch.no_grad():
            got = m(ids).logits
    finally:
        state.router = "centered"
    keep = score > state.tau
    assert 0 < keep.sum() < keep.numel()
    expected = torch.where(keep.unsqueeze(-1), (zp + za) / 2 + zp_up, za + za_up)
    torch.testing.assert_close(got, expected, **TOL)
    assert torch.equal(state.preserve_mask, keep)
    assert state.route_score.shape == keep.shape and state.route_score.dtype == torch.float32
    assert not state.route_score.requires_grad
    torch.testing.assert_close(state.route_score, score, **TOL)


def test_prob_router_in_blocks_equals_one_block(trained_route):
    """The prob score computed over blocks of positions (uneven blocks, non-contiguous states cut from
    [h; h_up]) equals the one-block computation bit for bit, at every block size the rule allows."""
    m, ids, hp, ha = trained_route
    d, head = m.config.hidden_size - HU, m.get_output_embeddings()
    a, b = torch.cat([hp] * 7)[..., :d], torch.cat([ha] * 7)[..., :d]  # (7B, T, d), a view of (7B, T, D)
    assert not a.is_contiguous() and a.shape[0] * a.shape[1] > 100
    w = head.weight.detach().float()
    one_block = lambda x, y: _explicit_scores(x @ w.t(), y @ w.t())["prob"]  # noqa: E731
    whole = one_block(a, b)
    v = w.shape[0]
    for rows in (1, 16, 17, 40, 10**6):  # 1 asks for less than the 16-row floor
        got = head.prob_cosine(a, b, chunk_elements=rows * v)
        assert got.shape == whole.shape and torch.equal(got, whole), rows
    assert torch.equal(head.prob_cosine(a[:0], b[:0]), whole[:0])
    x, y = a[:1, :2], b[:1, :2]  # fewer rows than one block: the one-block computation itself
    assert torch.equal(head.prob_cosine(x, y), one_block(x, y))


@pytest.mark.parametrize("router", ["centered", "prob"])
def test_router_trains_without_gradient_through_the_decision(router):
    """A training step runs with each router; the score is detached and the loss still falls."""
    base = make_base("llama-gqa-untied")
    m = upscale(base, ScaleConfig(variant="route", hidden_up=HU, ffn_up=FU, l_fp=1, router=router, tau=0.0))
    losses = train_steps(m, steps=6)
    assert losses[-1] < losses[0]
    assert not m.scale_state.route_score.requires_grad
    assert get_method("scale-route", router=router).options()["router"] == router


@pytest.mark.parametrize("case", ["neox-parallel", "llama-gqa-untied"])
@pytest.mark.parametrize("variant", ["preserve", "adapt", "route"])
def test_rnd_embedding_columns_keep_the_base_function_when_untied(case, variant):
    """embed_init=rnd: new columns ~ N(0, initializer_range^2); the head's new columns start at zero, so the
    logits and the original channels of every hidden state are the base's."""
    base = make_base(case)
    torch.manual_seed(0)
    m = upscale(base, ScaleConfig(variant=variant, hidden_up=HU, ffn_up=FU, l_fp=None if variant == "preserve" else 1,
                                  embed_init="rnd"))
    emb = m.get_input_embeddings()
    std = base.config.initializer_range
    assert 0.8 * std < emb.weight_up.std().item() < 1.2 * std
    assert m.get_output_embeddings().weight_up.abs().max() == 0
    ids = random_batch(base.config.vocab_size)
    d = base.config.hidden_size
    with torch.no_grad():
        hb = base(ids, output_hidden_states=True)
        hm = m(ids, output_hidden_states=True)
    torch.testing.assert_close(hm.logits, hb.logits, **TOL)
    torch.testing.assert_close(hm.hidden_states[0][..., :d], hb.hidden_states[0], **TOL)
    assert hm.hidden_states[0][..., d:].abs().max() > 0  # the new channels do carry the random columns
    zero = upscale(base, ScaleConfig(variant=variant, hidden_up=HU, ffn_up=FU,
                                     l_fp=None if variant == "preserve" else 1))
    assert zero.get_input_embeddings().weight_up.abs().max() == 0  # the default stays zero


def test_rnd_embedding_refused_with_tied_embeddings():
    base = make_base("llama-gqa-tied")
    with pytest.raises(ScaleclError, match="untied"):
        upscale(base, ScaleConfig(variant="adapt", hidden_up=HU, ffn_up=FU, embed_init="rnd"))
    with pytest.raises(ScaleclError, match="untied"):
        get_method("scale-route", hidden_up=HU, ffn_up=FU, embed_init="rnd").check(base.config)


@pytest.mark.parametrize("kw,msg", [(dict(router="cosine"), "unknown router"), (dict(embed_init="svd"), "unknown embed_init")])
def test_option_names_are_checked(kw, msg):
    with pytest.raises(ScaleclError, match=msg):
        ScaleConfig(**kw)


@pytest.mark.parametrize("args,msg", [
    (["--router", "cosine"], "unknown router"),
    (["--embed-init", "svd"], "unknown embed_init"),
    (["--embed-init", "rnd"], "needs untied embeddings"),  # the tiny Llama ties its embeddings
])
def test_cli_option_errors_are_one_line(tmp_path, args, msg):
    res = CliRunner().invoke(app, ["upscale", "--random-config", "llama", "--hidden-up", "32", "--out",
                                   str(tmp_path / "o"), *args])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], res.output
    assert not (tmp_path / "o").exists()
