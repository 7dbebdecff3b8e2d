"""Shared helpers: tiny models built in process, a few optimizer steps, byte snapshots."""

from __future__ import annotations

import pytest
import torch

from scalecl.models import model_from_config, tiny_config

torch.set_num_threads(2)

# tiny versions of the paper's two families, covering every structural case the invariant must survive
ARCH_CASES = {
    "neox-parallel": ("gpt_neox", dict(use_parallel_residual=True)),
    "neox-sequential": ("gpt_neox", dict(use_parallel_residual=False)),
    "llama-gqa-tied": ("llama", dict(tie_word_embeddings=True)),
    "llama-gqa-untied": ("llama", dict(tie_word_embeddings=False)),
}


def make_base(case: str, seed: int = 0):
    kind, kw = ARCH_CASES[case]
    return model_from_config(tiny_config(kind, **kw), seed=seed)


def random_batch(vocab: int, batch: int = 3, seq: int = 16, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g)


def train_steps(model, steps: int = 20, lr: float = 3e-2, seed: int = 2) -> list[float]:
    """AdamW on one fixed random batch with a deliberately high learning rate: frozen blocks must not move."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.1)
    losses = []
    ids = random_batch(model.config.vocab_size, seed=seed)
    for _ in range(steps):
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


def snapshot(model) -> dict[str, bytes]:
    return {n: p.detach().cpu().numpy().tobytes() for n, p in model.named_parameters()}


@pytest.fixture(params=list(ARCH_CASES))
def arch_case(request) -> str:
    return request.param


def split_threshold(cos: torch.Tensor) -> float:
    """A Route tau inside the widest gap of the middle half of the cosines: some tokens go each way, and
    none sits so close to tau that rounding (explicit logits vs the head's Gram form) could move it across."""
    c = cos.flatten().sort().values
    n = c.numel()
    i = n // 4 + int((c[n // 4 + 1 : 3 * n // 4] - c[n // 4 : 3 * n // 4 - 1]).argmax())
    return (c[i] + c[i + 1]).item() / 2
