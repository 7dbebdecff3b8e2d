"""`scalecl eval-ppl`: the loss by blocks of positions, the memory estimate, the default length, the tokenizer of a
checkpoint that carries none."""

from __future__ import annotations

import pytest
import torch

from scalecl.evaluation.perplexity import chunked_logits, perplexity
from scalecl.methods import get_method
from scalecl.models.build import model_from_config, tiny_config
from tests.conftest import method_cases

pytestmark = pytest.mark.usefixtures("one_thread")


def _chunks(vocab: int, n: int = 5, length: int = 23, seed: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=g) for _ in range(n - 1)] + [torch.randint(0, vocab, (9,),
                                                                                                   generator=g)]


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "gemma2"])
@pytest.mark.parametrize("method", ["fft", "lora", "llama-pro", "scale-adapt", "scale-route"])
def test_loss_by_blocks_of_positions_equals_the_whole_logits(family, method):
    """The blocked loss (a few positions per head product, the last block short, Gemma's soft-cap, SCALE-Route's
    two paths and its routing fractions) gives the numbers of the whole (B, T, V) logits within float rounding."""
    config = tiny_config(family, vocab_size=97, **({"final_logit_softcapping": 2.0} if family == "gemma2" else {}))
    opts = method_cases(l_fp=2, llama_pro={"n": 1})[method]
    if family == "gpt_neox" and method.startswith("scale-"):
        opts = {**opts, "hidden_up": 32}
    torch.manual_seed(0)
    m = get_method(method, **opts)
    model = m.apply(model_from_config(config, seed=0))
    for p in model.parameters():  # SCALE and LoRA start at the base's function: move them off it
        p.data += 0.05 * torch.randn_like(p)
    assert chunked_logits(model)
    stats = lambda mask: m.metrics(model, mask)  # noqa: E731
    chunks = _chunks(97)
    whole = perplexity(model, chunks, batch_size=2, stats=stats)
    for block in (97 * 2 * 4, 97 * 2 * 7, 1):  # 4 and 7 positions per product, and one at a time
        blocked = perplexity(model, chunks, batch_size=2, stats=stats, logit_block=block)
        assert blocked.keys() == whole.keys()
        for k in whole:
            torch.testing.assert_close(blocked[k], whole[k], rtol=1e-5, atol=1e-6, msg=k)
    if method == "scale-route":
        assert "route_preserve" in whole


def test_no_head_product_holds_more_positions_than_its_block():
    """With a block of 4 positions' logits, every product of the head (the forward's own one included) holds at
    most 4 positions: no (B, T, V) tensor is made."""
    model = model_from_config(tiny_config("llama", vocab_size=97), seed=0)
    head, seen = model.get_output_embeddings(), []
    real = head.forward

    def recorded(h):
        out = real(h)
        seen.append(out.shape[1])
        return out

    head.forward = recorded  # every product: the forward's own and the blocks'
    perplexity(model, _chunks(97)[:4], batch_size=2, logit_block=97 * 2 * 4)  # two batches of 2 x 23 positions
    assert max(seen) == 4 and sum(seen) == 2 * 23 and seen.count(0) == 2  # the forwards' own: empty slices
    seen.clear()
    perplexity(model, _chunks(97)[:4], batch_size=2)
    assert seen == [23, 23]
