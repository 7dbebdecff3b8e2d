"""The widened building blocks of SCALE: block linear (Eq. 1), split norm, embedding and head (Sec. 3.1).

Every module keeps the pre-trained tensor as its own frozen Parameter (`weight`, `bias`) and holds the new
blocks as separate Parameters, so freezing is exact (no masks, no weight decay on frozen blocks) and the
optimizer only ever sees what trains.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PathState:
    """Which computation path the widened modules of one model run (shared by all of them).

    mode "adapt": W12 as trained (Eq. 4; also plain Preserve, whose W12 are all zero).
    mode "preserve": every W12 treated as zero (Z_preserve of Eq. 3/5).
    mode "route": the batch is doubled at the fork point, first half preserve, second half adapt (Eq. 5).
    """

    def __init__(self, mode: str = "adapt", tau: float = 0.9) -> None:
        self.mode = mode
        self.tau = tau
        self.preserve_mask: torch.Tensor | None = None  # (B, T) bool, from the last routed forward


def _init_block(w: torch.Tensor, how: str, base: torch.Tensor, part: str) -> None:
    """Initialise W21 (part="21") or W22 (part="22") from the frozen W (paper Fig. 5, spec/method.md).

    svd, W21: the top out_up right-singular directions scaled by their singular values, S_k V_k^T (= U_k^T W);
              when out_up exceeds rank(W) the directions are cycled.
    svd, W22: the leading out_up x in_up block of diag(S): top singular values on the diagonal, zeros elsewhere.
    rnd:      He (Kaiming) normal, fan-in mode.
    """
    with torch.no_grad():
        if how == "zero" or w.numel() == 0:
            w.zero_()
        elif how == "rnd":
            nn.init.kaiming_normal_(w, a=0.0, mode="fan_in", nonlinearity="relu")
        elif how == "svd":
            _, s, vh = torch.linalg.svd(base.detach().float(), full_matrices=False)  # s: (r,), vh: (r, in)
            r = s.shape[0]
            if part == "21":
                idx = torch.arange(w.shape[0]) % r
                w.copy_((s[idx, None] * vh[idx]).to(w.dtype))
            else:
                w.zero_()
                k = min(w.shape[0], w.shape[1], r)
                w[torch.arange(k), torch.arange(k)] = s[:k].to(w.dtype)
        else:  # validated earlier; keep a guard for direct library use
            raise ValueError(f"unknown init {how!r}")


class UpLinear(nn.Module):
    """y_full = [[W, W12], [W21, W22]] @ [x; x_up] + [b; b_up]   (paper Eq. 1).

    weight (out, in) and bias: the pre-trained tensors, frozen.
    w12 (out, in_up): zero-initialised; trains only in collaborative layers of Adapt/Route.
    w21 (out_up, in), w22 (out_up, in_up), bias_up (out_up): new, trainable.
    `fork` is set on modules above Route's fork point: their input batch is [preserve half; adapt half].
    """

    def __init__(
        self,
        base: nn.Linear,
        in_up: int,
        out_up: int,
        state: PathState,
        init: tuple[str, str] = ("svd", "zero"),
        init_weights: bool = True,
    ) -> None:
        super().__init__()
        out_f, in_f = base.weight.shape
        dev, dt = base.weight.device, base.weight.dtype
        self.in_features, self.out_features = in_f + in_up, out_f + out_up
        self.d_in, self.d_out = in_f, out_f
        self.weight = base.weight
        self.bias = base.bias
        self.w12 = nn.Parameter(torch.zeros(out_f, in_up, device=dev, dtype=dt), requires_grad=False)
        self.w21 = nn.Parameter(torch.empty(out_up, in_f, device=dev, dtype=dt))
        self.w22 = nn.Parameter(torch.empty(out_up, in_up, device=dev, dtype=dt))
        self.bias_up = (
            nn.Parameter(torch.zeros(out_up, device=dev, dtype=dt)) if base.bias is not None else None
        )
        if init_weights:
            _init_block(self.w21, init[0], self.weight, "21")
            _init_block(self.w22, init[1], self.weight, "22")
        self.state = state
        self.fork = False

    def full_weight(self, with_w12: bool = True) -> torch.Tensor:
        """The (out + out_up, in + in_up) matrix of Eq. 1; with_w12=False gives the preserve path's."""
        w12 = self.w12 if with_w12 else torch.zeros_like(self.w12)
        top = torch.cat([self.weight, w12], dim=1)
        return torch.cat([top, torch.cat([self.w21, self.w22], dim=1)], dim=0)

    def full_bias(self) -> torch.Tensor | None:
        return None if self.bias is None else torch.cat([self.bias, self.bias_up])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, T, in + in_up) -> (N, T, out + out_up)
        mode, b = self.state.mode, self.full_bias()
        if mode == "route" and self.fork:
            xp, xa = x.chunk(2, dim=0)
            return torch.cat([F.linear(xp, self.full_weight(False), b), F.linear(xa, self.full_weight(), b)])
        return F.linear(x, self.full_weight(mode != "preserve"), b)

    def extra_repr(self) -> str:
        return f"in={self.d_in}+{self.in_features - self.d_in}, out={self.d_out}+{self.out_features - self.d_out}"


class SplitNorm(nn.Module):
    """Normalise the original d channels with the frozen norm and the d_up channels with their own.

    A LayerNorm/RMSNorm over the widened vector would change the statistics of the original channels, and
    Theorem 3.1 would fail on a real transformer; the split keeps them exactly as before (spec/method.md).
    """

    def __init__(self, base: nn.Module, d: int, d_up: int) -> None:
        super().__init__()
        self.d = d
        self.base = base
        self.up = _same_norm(base, d_up)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, T, d + d_up)
        return torch.cat([self.base(x[..., : self.d]), self.up(x[..., self.d :])], dim=-1)


def _same_norm(base: nn.Module, size: int) -> nn.Module:
    """A fresh norm of the same kind as `base` over `size` channels, identity gain (and zero bias)."""
    w = base.weight
    if isinstance(base, nn.LayerNorm):
        return nn.LayerNorm(size, eps=base.eps, bias=base.bias is not None, device=w.device, dtype=w.dtype)
    eps = getattr(base, "variance_epsilon", getattr(base, "eps", 1e-6))
    norm = type(base)(size, eps=eps).to(device=w.device, dtype=w.dtype)  # e.g. LlamaRMSNorm
    with torch.no_grad():
        norm.weight.fill_(1.0)
    return norm


class UpEmbedding(nn.Module):
    """W_in -> [W_in  W_in_up]: extra columns, zero-initialised and trainable (Sec. 3.1)."""

    def __init__(self, base: nn.Embedding, d_up: int) -> None:
        super().__init__()
        self.weight = base.weight
        self.weight_up = nn.Parameter(torch.zeros(base.num_embeddings, d_up, device=base.weight.device,
                                                  dtype=base.weight.dtype))
        self.num_embeddings = base.num_embeddings
        self.embedding_dim = base.embedding_dim + d_up
        self.padding_idx = base.padding_idx

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, d + d_up)
        return torch.cat([F.embedding(ids, self.weight), F.embedding(ids, self.weight_up)], dim=-1)


class UpHead(nn.Module):
    """W_out -> [W_out  W_out_up], W_out_up zero-initialised so every variant starts at the base logits.

    In route mode its input is [preserve half; adapt half] and it applies the router of Eq. 5:
    a token goes to the preserve path when cos(Z_preserve, Z_adapt) > tau, with output
    (Z_preserve + Z_adapt)/2 + Z_preserve_up; otherwise Z_adapt + Z_adapt_up. The decision is hard (no
    gradient through the comparison) and the mask of the last forward is kept for the routing fractions.
    """

    def __init__(self, base: nn.Linear, d_up: int, state: PathState, tied_up: nn.Parameter | None = None) -> None:
        super().__init__()
        self.weight = base.weight
        if tied_up is not None:
            self.weight_up = tied_up  # tied embeddings stay tied: one shared up tensor
        else:
            self.weight_up = nn.Parameter(torch.zeros(base.out_features, d_up, device=base.weight.device,
                                                      dtype=base.weight.dtype))
        self.d = base.in_features
        self.in_features, self.out_features = base.in_features + d_up, base.out_features
        self.state = state

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (N, T, d + d_up) -> (B, T, V)
        if self.state.mode != "route":
            return F.linear(h, torch.cat([self.weight, self.weight_up], dim=1))
        z = F.linear(h[..., : self.d], self.weight)  # (2B, T, V): original-channel logits
        z_up = F.linear(h[..., self.d :], self.weight_up)
        zp, za = z.chunk(2, dim=0)
        zp_up, za_up = z_up.chunk(2, dim=0)
        with torch.no_grad():
            keep = F.cosine_similarity(zp.float(), za.float(), dim=-1) > self.state.tau  # (B, T)
        self.state.preserve_mask = keep
        return torch.where(keep.unsqueeze(-1), (zp + za) / 2 + zp_up, za + za_up)


