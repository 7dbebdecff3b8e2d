"""The widened building blocks of SCALE: block linear (Eq. 1), split norm, embedding and head (Sec. 3.1).

Every module keeps the pre-trained tensor as its own frozen Parameter (`weight`, `bias`) and holds the new
blocks as separate Parameters, so freezing is exact (no masks, no weight decay on frozen blocks) and the
optimizer only ever sees what trains.

Standalone (torch only): copied verbatim into every SCALE checkpoint (see `modeling_scale.py`).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


class PathState:
    """Which computation path the widened modules of one model run (shared by all of them).

    mode "adapt": W12 as trained (Eq. 4; also plain Preserve, whose W12 are all zero).
    mode "preserve": every W12 treated as zero (Z_preserve of Eq. 3/5).
    mode "route": the batch is doubled at the fork point, first half preserve, second half adapt (Eq. 5).
    router: the score Route compares with tau ("logit", "centered" or "prob"; see `UpHead.router_score`).
    products: how the widened linears form their forward products, "blocks" or "concat" (`products_setting`,
    read once when the model is built; set this attribute to change it on a built model).
    The defaults of tau and router are declared once, on `scale_spec.ScaleSpec`; scale_surgery builds this state.
    """

    def __init__(self, mode: str, tau: float, router: str, products: str = "blocks") -> None:
        self.mode = mode
        self.tau = tau
        self.router = router
        self.products = products
        self.preserve_mask: torch.Tensor | None = None  # (B, T) bool, from the last routed forward
        self.route_score: torch.Tensor | None = None  # (B, T) float32 router score of that forward, detached
        # Route's mechanism, measured: when an experiment sets never_rows (a (V,) bool mask of the
        # vocabulary rows no training stage ever has as a target), every routed forward without autograd
        # (evaluation) keeps both paths' original-channel hidden states, (B, T, d) each, detached
        self.never_rows: torch.Tensor | None = None
        self.path_hidden: tuple[torch.Tensor, torch.Tensor] | None = None
        # leading groups (decoder layers, then the final norm) whose original channels depend on no
        # trainable parameter on each path; refreshed before every forward (scale_surgery._ConstantHook)
        self.const_preserve = 0
        self.const_adapt = 0
        self.n_groups = 1  # decoder layers + 1 (the final norm)


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


PRODUCTS = ("blocks", "concat")


def products_setting() -> str:
    """How the forward forms its products: "blocks" (default) or "concat" (SCALECL_SCALE_PRODUCTS).

    Read when a model is widened (scale_surgery.widen) and kept on its shared PathState, not per forward.

    blocks: x W^T (+ x_up W12^T) for the original rows, x [W21 W22]^T for the new ones: the original channels
    are the base's own product, bit for bit. concat: one product of x with the whole [[W, W12], [W21, W22]]
    (W12 as zeros on the preserve path): fewer, larger kernels; the original channels are equal in exact
    arithmetic but summed over a longer inner dimension, so not necessarily bit-identical. Which is faster is
    a per-device measurement (benchmarks/bench_gpu.py); the backward is block-wise either way.
    """
    mode = os.environ.get("SCALECL_SCALE_PRODUCTS", "blocks")
    if mode not in PRODUCTS:
        raise ValueError(f"SCALECL_SCALE_PRODUCTS={mode!r}: use blocks or concat")
    return mode


def _operand_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype F.linear would compute in: the autocast dtype when autocast is on, else the input's."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


class _Rows(NamedTuple):
    """How `_BlockLinear` treats the rows of its input (see there); one flag per row half for the tuples."""

    use_w12: tuple[bool, ...]
    const: tuple[bool, ...]
    shared: bool = False
    concat: bool = False


class _BlockLinear(torch.autograd.Function):
    """y = x @ [[W, W12], [W21, W22]]^T + [b; b_up], block by block, with a backward that does only needed work.

    Built as F.linear of the concatenated matrix, autograd would form the gradient of the whole
    (out + out_up) x (in + in_up) matrix and then discard the frozen W block, and would propagate the
    gradient into input channels that no trainable parameter influences: most of a widened model's backward.
    Here:
      - each block's weight gradient is formed only when that block trains;
      - rows flagged `const` have original input channels (the first `in`) that depend on no trainable
        parameter (below the first collaborative layer, and everywhere on the preserve path, see
        `scale_surgery._ConstantHook`). Their input gradient there is zero by definition and is not computed.
    The original output channels are computed as x W^T + b (+ x_up W12^T), the same product the base model
    computes, so they match the base's even before W12 is added.

    The rows are described by `plan` (a _Rows):
    use_w12 (one flag per row half): False treats W12 as zero (the preserve path). Two flags: the rows of x
    are [preserve half; adapt half] (Route above its fork point), with flags for each.
    const (one flag per row half): see above.
    shared: the two halves are known to be equal (a norm of the block input at Route's first forked block);
    the products they have in common are computed once, and only x_up W12^T is added for the adapt half.
    concat: one product with the whole matrix instead of one per block (PathState.products).
    Under autocast the operands are cast to the autocast dtype, as F.linear would be.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, w12, w21, w22, bias_up, plan: _Rows):
        use_w12 = plan.use_w12
        d_out, d_in = weight.shape
        dt = _operand_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            x2 = x.reshape(-1, x.shape[-1]).to(dt)
            w, w12c, b, bu = weight.to(dt), w12.to(dt), None if bias is None else bias.to(dt), None
            w_new = torch.cat([w21, w22], dim=1).to(dt)  # (out_up, in + in_up): the new rows
            if bias_up is not None:
                bu = bias_up.to(dt)
            halves = _halves(x2.shape[0], len(use_w12))
            if torch.compiler.is_compiling():  # dynamo cannot trace a product written into a column slice
                y = _traced_products(x2, halves, plan, (w, w12c, w_new, b, bu))
            else:
                y = x2.new_empty(x2.shape[0], d_out + w_new.shape[0])
                _products_into(y, x2, halves, plan, (w, w12c, w_new, b, bu))
        ctx.save_for_backward(x2, w, w12c, w_new)
        ctx.use_w12, ctx.const, ctx.x_shape, ctx.x_dtype = use_w12, plan.const, x.shape, x.dtype
        ctx.has_bias = bias is not None
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, gy):
        x2, w, w12, w_new = ctx.saved_tensors
        d_out, d_in = w.shape
        need = ctx.needs_input_grad
        g = gy.reshape(-1, gy.shape[-1]).to(x2.dtype)
        g_top, g_up = g[:, :d_out], g[:, d_out:]
        halves = _halves(x2.shape[0], len(ctx.use_w12))
        gx = gw = gb = g12 = g21 = g22 = gbu = None
        if need[0]:
            gx = _input_grad(g_top, g_up, halves, ctx, w, w12, w_new).view(ctx.x_shape).to(ctx.x_dtype)
        if need[1]:
            gw = g_top.t() @ x2[:, :d_in]
        if need[2] and ctx.has_bias:
            gb = g_top.sum(0)
        if need[3]:
            rows = [r for r, u in zip(halves, ctx.use_w12, strict=True) if u]
            if rows:  # W12's gradient comes only from the rows that use it
                g12 = sum(g_top[r].t() @ x2[r, d_in:] for r in rows)
        if need[4]:
            g21 = g_up.t() @ x2[:, :d_in]
        if need[5]:
            g22 = g_up.t() @ x2[:, d_in:]
        if need[6] and ctx.has_bias:
            gbu = g_up.sum(0)
        return gx, gw, gb, g12, g21, g22, gbu, None


def _input_grad(g_top: torch.Tensor, g_up: torch.Tensor, halves: list[slice], ctx: Any, w: torch.Tensor,
                w12: torch.Tensor, w_new: torch.Tensor) -> torch.Tensor:
    """_BlockLinear's input gradient (rows x (in + in_up)), half by half: each block written into its place, or
    under torch.compile (which cannot trace a product written into a column slice) made as new tensors joined by
    cat, the same products in the same order."""
    d_in = w.shape[1]
    traced = torch.compiler.is_compiling()
    gx = None if traced else g_top.new_empty(g_top.shape[0], w_new.shape[1])
    parts = []
    for rows, with_w12, const in zip(halves, ctx.use_w12, ctx.const, strict=True):
        gt, gu = g_top[rows], g_up[rows]
        if traced:
            # nothing trainable reaches const rows' original channels: their gradient is not needed (zero)
            gd = gt.new_zeros(gt.shape[0], d_in) if const else torch.mm(gt, w).addmm(gu, w_new[:, :d_in])
            gn = torch.mm(gu, w_new[:, d_in:])
            parts.append(torch.cat([gd, gn.addmm(gt, w12) if with_w12 else gn], dim=1))
            continue
        gd, gn = gx[rows, :d_in], gx[rows, d_in:]
        if const:  # nothing trainable reaches these channels: their gradient is not needed
            gd.zero_()
        else:
            torch.mm(gt, w, out=gd)
            gd.addmm_(gu, w_new[:, :d_in])
        torch.mm(gu, w_new[:, d_in:], out=gn)
        if with_w12:
            gn.addmm_(gt, w12)
    if traced:
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
    return gx


def _products_into(y: torch.Tensor, x2: torch.Tensor, halves: list[slice], plan: _Rows, mats: tuple) -> None:
    """_BlockLinear's forward products, each written into its block of `y` (no copies); `mats`: W, W12, the new
    rows [W21 W22], b, b_up in the operands' dtype."""
    w, w12, w_new, b, bu = mats
    d_out, d_in = w.shape
    for k, (rows, with_w12) in enumerate(zip(halves, plan.use_w12, strict=True)):
        xr, top, bot = x2[rows], y[rows, :d_out], y[rows, d_out:]
        if plan.shared and k:  # same input as the first half: start from its products
            y[rows] = y[halves[0]]
        elif plan.concat:  # one product with the whole matrix (W12 as zeros where it is not used)
            w12_used = w12 if with_w12 else torch.zeros_like(w12)
            full = torch.cat([torch.cat([w, w12_used], dim=1), w_new], dim=0)
            _mm_into(y[rows], xr, full.t(), None if b is None else torch.cat([b, bu]))
            continue
        else:
            _mm_into(top, xr[:, :d_in], w.t(), b)
            _mm_into(bot, xr, w_new.t(), bu)
        if with_w12 and w12.shape[1]:
            top.addmm_(xr[:, d_in:], w12.t())


def _traced_products(x2: torch.Tensor, halves: list[slice], plan: _Rows, mats: tuple) -> torch.Tensor:
    """_products_into's products as new tensors joined by cat, for torch.compile (which cannot trace a product
    written into a column slice): the same products in the same order (an in-place addmm_ as an addmm of a
    copy), so the same values."""
    w, w12, w_new, b, bu = mats
    d_out, d_in = w.shape
    outs: list[torch.Tensor] = []
    for k, (rows, with_w12) in enumerate(zip(halves, plan.use_w12, strict=True)):
        xr = x2[rows]
        if plan.shared and k:  # same input as the first half: start from its products
            top, bot = outs[0][:, :d_out], outs[0][:, d_out:]
        elif plan.concat:
            w12_used = w12 if with_w12 else torch.zeros_like(w12)
            full = torch.cat([torch.cat([w, w12_used], dim=1), w_new], dim=0)
            outs.append(_mm(xr, full.t(), None if b is None else torch.cat([b, bu])))
            continue
        else:
            top, bot = _mm(xr[:, :d_in], w.t(), b), _mm(xr, w_new.t(), bu)
        if with_w12 and w12.shape[1]:
            top = top.addmm(xr[:, d_in:], w12.t())
        outs.append(torch.cat([top, bot], dim=1))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


def _mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """a @ b (+ bias) as a new tensor."""
    return torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)


def _halves(n: int, parts: int) -> list[slice]:
    """Row slices: all rows, or [first half, second half] for a forked batch."""
    return [slice(None)] if parts == 1 else [slice(None, n // 2), slice(n // 2, None)]


def _mm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> None:
    """out = a @ b (+ bias), written into a (possibly column-sliced) view of a larger output."""
    if bias is None:
        torch.mm(a, b, out=out)
    else:
        torch.addmm(bias, a, b, out=out)


class UpLinear(nn.Module):
    """y_full = [[W, W12], [W21, W22]] @ [x; x_up] + [b; b_up]   (paper Eq. 1).

    weight (out, in) and bias: the pre-trained tensors, frozen.
    w12 (out, in_up): zero-initialised; trains only in collaborative layers of Adapt/Route.
    w21 (out_up, in), w22 (out_up, in_up), bias_up (out_up): new, trainable.
    `fork` is set on modules above Route's fork point: their input batch is [preserve half; adapt half].
    `segments` ((base rows, new rows) per block, or None): an output fused block by block (Phi-3's [q|k|v],
    [gate|up]). The new rows of each block are then placed right after that block's base rows, so the model's
    own slicing of the widened output finds each part; the base rows keep their values and their order.
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
        self.layer = 0  # index of the decoder layer holding this module (set by upscale)
        self.shared_input = False  # at Route's first forked block, reads a norm of the (doubled) block input
        self.segments: tuple[tuple[int, int], ...] | None = None

    def full_weight(self, with_w12: bool = True) -> torch.Tensor:
        """The (out + out_up, in + in_up) matrix of Eq. 1, rows in the model's layout; with_w12=False gives the
        preserve path's."""
        w12 = self.w12 if with_w12 else torch.zeros_like(self.w12)
        top = torch.cat([self.weight, w12], dim=1)
        return self._layout(torch.cat([top, torch.cat([self.w21, self.w22], dim=1)], dim=0), 0)

    def full_bias(self) -> torch.Tensor | None:
        return None if self.bias is None else self._layout(torch.cat([self.bias, self.bias_up]), 0)

    def _layout(self, y: torch.Tensor, dim: int) -> torch.Tensor:
        """Rows [base; new] along dim -> the model's layout (unchanged unless the output is fused by blocks)."""
        if self.segments is None:
            return y
        base, new = y.narrow(dim, 0, self.d_out), y.narrow(dim, self.d_out, y.shape[dim] - self.d_out)
        parts, b0, n0 = [], 0, 0
        for nb, nn_ in self.segments:
            parts += [base.narrow(dim, b0, nb), new.narrow(dim, n0, nn_)]
            b0, n0 = b0 + nb, n0 + nn_
        return torch.cat(parts, dim=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, T, in + in_up) -> (N, T, out + out_up)
        st = self.state
        if st.mode == "route" and self.fork:  # rows: [preserve half; adapt half]
            use_w12, const = (False, True), (self.layer < st.const_preserve, self.layer < st.const_adapt)
        elif st.mode == "preserve":
            use_w12, const = (False,), (self.layer < st.const_preserve,)
        else:
            use_w12, const = (True,), (self.layer < st.const_adapt,)
        plan = _Rows(use_w12, const, len(use_w12) == 2 and self.shared_input, st.products == "concat")
        y = _BlockLinear.apply(x, self.weight, self.bias, self.w12, self.w21, self.w22, self.bias_up, plan)
        return self._layout(y, -1)

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


class HeadSplitNorm(SplitNorm):
    """A per-head norm (weight over head_dim, shared by all heads: Qwen3's and Gemma 3's q/k norms) over widened
    heads: the first `heads` heads along `axis` use the frozen norm, the new heads their own (identity gain).

    The norm acts on each head's head_dim channels alone, so the base heads compute exactly what they computed.
    """

    def __init__(self, base: nn.Module, heads: int, axis: int) -> None:
        nn.Module.__init__(self)
        self.d, self.axis = heads, axis
        self.base = base
        self.up = _same_norm(base, base.weight.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # heads along self.axis: base heads, then new heads
        n = x.shape[self.axis]
        return torch.cat([self.base(x.narrow(self.axis, 0, self.d)), self.up(x.narrow(self.axis, self.d, n - self.d))],
                         dim=self.axis)


def _same_norm(base: nn.Module, size: int) -> nn.Module:
    """A fresh norm of the same kind as `base` over `size` channels, identity gain (and zero bias).

    The identity gain is found from the norm's own class (`_identity_gain`): 1 for LayerNorm and Llama-style
    RMSNorm (w * x), 0 for Gemma's (1 + w) * x.
    """
    w = base.weight
    if isinstance(base, nn.LayerNorm):
        return nn.LayerNorm(size, eps=base.eps, bias=base.bias is not None, device=w.device, dtype=w.dtype)
    eps = getattr(base, "variance_epsilon", getattr(base, "eps", 1e-6))
    norm = type(base)(size, eps=eps).to(device=w.device, dtype=w.dtype)  # e.g. LlamaRMSNorm
    with torch.no_grad():
        norm.weight.fill_(_identity_gain(base))
    return norm


def _identity_gain(norm: nn.Module) -> float:
    """The gain at which an RMSNorm of this kind multiplies by one: 0 for Gemma's (1 + w), else 1."""
    with torch.device("cpu"), torch.no_grad():  # real tensors, also while a model is built on the meta device
        probe = type(norm)(1, eps=0.0)
        probe.weight.fill_(0.0)
        return 0.0 if probe(torch.ones(1, 1)).item() == 1.0 else 1.0


class UpEmbedding(nn.Module):
    """W_in -> [W_in  W_in_up]: extra columns, trainable (Sec. 3.1).

    init "zero" (the default) starts them at zero; "rnd" draws them from N(0, std^2), std being the base
    config's initializer_range (0.02 for GPT-NeoX and Llama), so the new channels carry a signal from the
    first step. Either way the function is preserved as long as the head's new columns start at zero, which
    holds only with untied embeddings (with tied ones the head's new columns are these).

    A scaled embedding (Gemma's: the output times sqrt(hidden_size)) keeps the base's scale, sqrt(d) of the base
    width, for the whole widened output: the original channels are exactly the base's. It is read from the
    module (`scalar_embed_scale`), never from the widened config.
    """

    def __init__(self, base: nn.Embedding, d_up: int, init: str = "zero", std: float = 0.02,
                 init_weights: bool = True) -> None:
        super().__init__()
        if init not in ("zero", "rnd"):  # validated earlier; keep a guard for direct library use
            raise ValueError(f"unknown embedding init {init!r}")
        self.weight = base.weight
        self.weight_up = nn.Parameter(torch.zeros(base.num_embeddings, d_up, device=base.weight.device,
                                                  dtype=base.weight.dtype))
        if init_weights and init == "rnd":
            with torch.no_grad():
                self.weight_up.normal_(0.0, std)
        self.num_embeddings = base.num_embeddings
        self.embedding_dim = base.embedding_dim + d_up
        self.padding_idx = base.padding_idx
        scale = getattr(base, "scalar_embed_scale", None)
        self.embed_scale = None if scale is None else float(scale)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, d + d_up)
        out = torch.cat([F.embedding(ids, self.weight), F.embedding(ids, self.weight_up)], dim=-1)
        if self.embed_scale is not None:  # as the base module does: a float32 scalar cast to the weights' dtype
            out = out * torch.tensor(self.embed_scale, dtype=torch.float32, device=out.device).to(self.weight.dtype)
        return out


class UpHead(nn.Module):
    """W_out -> [W_out  W_out_up], W_out_up zero-initialised so every variant starts at the base logits.

    In route mode its input is [preserve half; adapt half] and it applies the router of Eq. 5:
    a token goes to the preserve path when cos(Z_preserve, Z_adapt) > tau, with output
    (Z_preserve + Z_adapt)/2 + Z_preserve_up; otherwise Z_adapt + Z_adapt_up. The decision is hard (no
    gradient through the comparison); the mask and the score of the last forward are kept on the state
    (routing fractions, score distributions). Z are the logits of the original channels, W h[:d].

    The head is linear, so both are computed in hidden space, where they are exact rewrites:
    cos(W h_p, W h_a) from the Gram matrix W^T W (d x d, cached while W is unchanged), and the mixed output
    as one head product of the mixed hidden state. Route's head then costs one product over the batch, as
    Adapt's does, instead of two plus a vocabulary-wide cosine (a 128k vocabulary makes that matter).
    The router's score is chosen by state.router, see `router_score`.
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
        self._gram: dict[bool, tuple[tuple, torch.Tensor]] = {}  # centered? -> (key of W, Gram matrix)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (N, T, d + d_up) -> (B, T, V)
        st, top = self.state, self.state.n_groups
        if st.mode == "route":
            h = self._route(h)
            const = st.const_preserve >= top and st.const_adapt >= top
        else:
            const = (st.const_preserve if st.mode == "preserve" else st.const_adapt) >= top
        empty = self.weight.new_empty(0, self.d), self.weight.new_empty(0, self.in_features - self.d)
        plan = _Rows((True,), (const,), concat=st.products == "concat")
        return _BlockLinear.apply(h, self.weight, None, self.weight_up, *empty, None, plan)

    def _route(self, h: torch.Tensor) -> torch.Tensor:
        """[h_p; h_a] (2B, T, d + d_up) -> the hidden state whose head product is Eq. 5's output (B, T, ...)."""
        st, d = self.state, self.d
        hp, ha = h.chunk(2, dim=0)
        hp_d = hp[..., :d]
        if st.const_preserve >= st.n_groups:  # the preserve path's original channels carry no gradient
            hp_d = hp_d.detach()
        with torch.no_grad():
            score = self.router_score(hp_d, ha[..., :d])  # (B, T) float32
            keep = score > st.tau  # (B, T)
        st.preserve_mask, st.route_score = keep, score
        if st.never_rows is not None and not torch.is_grad_enabled():
            st.path_hidden = (hp_d.detach(), ha[..., :d].detach())
        mixed = torch.cat([(hp_d + ha[..., :d]) / 2, hp[..., d:]], dim=-1)  # (Z_p + Z_a)/2 + Z_p_up
        return torch.where(keep.unsqueeze(-1), mixed, ha)  # else Z_a + Z_a_up

    def router_score(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The score Route compares with tau, for original-channel states a (preserve), b (adapt) (..., d).

        "logit":    cos(Z_p, Z_a), the paper's Eq. 5 on raw logits (hidden space, Gram matrix).
        "centered": cos(Z_p - mean_v Z_p, Z_a - mean_v Z_a): logits centred over the vocabulary, so that a
                    shift of every logit (which softmax ignores) does not count; hidden space, centred Gram.
        "prob":     cos(softmax(Z_p), softmax(Z_a)): needs the explicit (..., V) logits, under no_grad.
        """
        router = self.state.router
        if router == "logit":
            return self.logit_cosine(a, b)
        if router == "centered":
            return self.logit_cosine(a, b, centered=True)
        if router == "prob":
            return self.prob_cosine(a, b)
        raise ValueError(f"unknown router {router!r}")  # validated earlier; a guard for direct library use

    def logit_cosine(self, a: torch.Tensor, b: torch.Tensor, eps: float = 1e-8, centered: bool = False) -> torch.Tensor:
        """cos(W a, W b) over the vocabulary for original-channel states a, b (..., d), as F.cosine_similarity.

        centered=True: the logits are first centred over the vocabulary, z - mean_v(z). With m the mean row
        of W, mean_v(W a) = m.a and <W a - (m.a) 1, W b - (m.b) 1> = a^T (W^T W - V m m^T) b: the same
        computation with the centred Gram matrix.
        """
        g = self.gram(centered)
        a, b = a.float(), b.float()
        ga, gb = a @ g, b @ g
        ab, aa, bb = (ga * b).sum(-1), (ga * a).sum(-1), (gb * b).sum(-1)
        return ab / (aa * bb).clamp_min(eps * eps).sqrt()

    def prob_cosine(self, a: torch.Tensor, b: torch.Tensor, chunk_elements: int = 1 << 24) -> torch.Tensor:
        """cos(softmax(W a), softmax(W b)) over the vocabulary, from explicit float32 logits (no gradient).

        Computed over blocks of positions instead of whole (N, V) tensors: one biography evaluation forward at
        50,304 rows (256 x 19 positions) needed 4.7 GiB for them, 340 MiB in blocks (benchmarks/README.md).
        A block holds about `chunk_elements` logits per path (64 MiB in float32) and never fewer than 16
        positions: a product of at least 4 rows gives every row the bits of the whole product (CPU BLAS; 1-3
        rows take another kernel), so the scores equal the one-block computation bit for bit
        (tests/methods/test_scale_options.py).
        """
        with torch.no_grad(), torch.autocast(a.device.type, enabled=False):
            w = self.weight.detach().float()
            shape = a.shape[:-1]
            a, b = a.detach().float().reshape(-1, self.d), b.detach().float().reshape(-1, self.d)
            blocks = max(1, a.shape[0] // max(16, chunk_elements // w.shape[0]))  # each >= 16 rows, or all
            out = [F.cosine_similarity(torch.softmax(x @ w.t(), dim=-1), torch.softmax(y @ w.t(), dim=-1), dim=-1)
                   for x, y in zip(a.tensor_split(blocks), b.tensor_split(blocks), strict=True)]
            return torch.cat(out).reshape(shape)

    @torch.compiler.disable  # its cache is keyed by W's storage and version, which a compiled graph cannot compare
    def gram(self, centered: bool = False) -> torch.Tensor:
        """W^T W (centered: W^T W - V m m^T) in float32, recomputed only when W is replaced or modified in place."""
        w = self.weight
        key = (w.data_ptr(), w._version, w.device, w.dtype)
        cached = self._gram.get(centered)
        if cached is None or cached[0] != key:
            with torch.no_grad(), torch.autocast(w.device.type, enabled=False):
                wf = w.detach().float()  # (V, d)
                g = wf.t() @ wf  # (d, d)
                if centered:
                    m = wf.mean(0)  # (d,) the mean row
                    g = g - wf.shape[0] * torch.outer(m, m)
                self._gram[centered] = cached = (key, g)
        return cached[1]
