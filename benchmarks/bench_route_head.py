"""Route's head at Llama-3.2-1B's sizes: the hidden-space form (Gram cosine, one head product) against
the explicit form (logits of both paths, cosine over the vocabulary, mix of logits).

Both compute Eq. 5 for the same [preserve; adapt] hidden states; the script checks they agree, then times
forward + backward of each (round-robin, medians). The head is the frozen W_out (V x d) plus the trainable
W_out_up (V x d_up); the preserve half's original channels carry no gradient, as in training.

    python benchmarks/bench_route_head.py --tokens 256 --reps 5
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from datetime import UTC, datetime

import torch
import torch.nn.functional as F
from torch import nn

from scalecl.compute.machine import tune_cpu_allocator
from scalecl.modeling.scale_layers import PathState, UpHead


def explicit(head: UpHead, h: torch.Tensor) -> torch.Tensor:
    """Eq. 5 as written: two vocabulary-sized logit products per token and a cosine over the vocabulary."""
    d = head.d
    hp, ha = h.chunk(2, dim=0)
    zp, za = F.linear(hp[..., :d].detach(), head.weight), F.linear(ha[..., :d], head.weight)
    zp_up, za_up = F.linear(hp[..., d:], head.weight_up), F.linear(ha[..., d:], head.weight_up)
    with torch.no_grad():
        keep = F.cosine_similarity(zp.float(), za.float(), dim=-1) > head.state.tau
    return torch.where(keep.unsqueeze(-1), (zp + za) / 2 + zp_up, za + za_up)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=2048, help="d (Llama-3.2-1B: 2048)")
    ap.add_argument("--hidden-up", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=128256, help="V (Llama-3.2-1B: 128256)")
    ap.add_argument("--tokens", type=int, default=256, help="tokens per path (batch x sequence)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the figures to this JSON file")
    a = ap.parse_args()
    tune_cpu_allocator()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    base = nn.Linear(a.hidden, a.vocab, bias=False).requires_grad_(False)
    state = PathState("route", tau=0.9, router="logit")
    state.n_groups, state.const_preserve, state.const_adapt = 1, 1, 0  # preserve half constant, adapt not
    head = UpHead(base, a.hidden_up, state)
    nn.init.normal_(head.weight_up, std=0.02)
    x = torch.randn(1, a.tokens, a.hidden + a.hidden_up)
    # the adapt half: the preserve half nudged, so some tokens route each way at tau = 0.9
    noise = torch.randn_like(x) * torch.linspace(0.05, 1.5, a.tokens).view(1, -1, 1)
    h = torch.cat([x, x + noise]).requires_grad_(True)
    with torch.no_grad():
        got, want = head(h), explicit(head, h)
    routed = state.preserve_mask.float().mean().item()
    diff = (got - want).abs().max().item()

    def step(fn) -> float:
        t = time.perf_counter()
        fn(head, h).square().mean().backward()
        h.grad = None
        head.weight_up.grad = None
        return time.perf_counter() - t

    forms = {"hidden_space": lambda m, z: m(z), "explicit": explicit}
    for f in forms.values():
        step(f)  # warm-up; the first hidden-space call also builds the Gram matrix
    times = {k: [] for k in forms}
    for _ in range(a.reps):
        for k, f in forms.items():
            times[k].append(step(f))
    med = {k: statistics.median(v) for k, v in times.items()}
    t = time.perf_counter()
    head._gram.clear()  # drop the cached Gram matrix
    head.gram()
    gram_s = time.perf_counter() - t
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "commit": commit,
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}",
        "setting": vars(a),
        "max_abs_diff_of_outputs": diff, "tokens_routed_to_preserve": round(routed, 3),
        "median_fwd_bwd_s": {k: round(v, 4) for k, v in med.items()},
        "explicit_over_hidden_space": round(med["explicit"] / med["hidden_space"], 2),
        "gram_build_once_s": round(gram_s, 3),
    }
    print(json.dumps(out, indent=2))
    assert diff < 1e-3 * want.abs().max().item(), "the two forms disagree"
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
