"""The signed aleph address: per-token signed weights over K learned (or frozen) anchors.

u_k = cos(x, a_k) / tau and w_k = sinh(u_k) / sum_j cosh(u_j). Since |sinh| < cosh,
sum_k |w_k| < 1, and w is odd in u (x -> -x flips every sign). Weights can be negative:
a token far *opposite* an anchor still dispatches to that expert, with a negative sign.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def signed_address(u: torch.Tensor) -> torch.Tensor:
    """w = sinh(u) / sum cosh(u) over the last axis, in float32, stable for any |u| (_signed)."""
    return _signed(u.float())[0]  # exp in bf16 would lose the small weights


def _signed(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, c) for float u: w = sinh(u) / sum cosh(u), c = cosh(u) / sum cosh(u).

    sinh and cosh overflow for |u| > ~89 in fp32, so both share one exp over (u, -u) shifted
    by m = max |u|: every exponent is <= 0 and the denominator >= 1/2. m cancels (no
    gradient), so it is detached; the result is odd in u bit for bit."""
    both = torch.cat([u, -u], dim=-1)  # (..., 2K)
    m = both.amax(dim=-1, keepdim=True).detach()  # (..., 1) = max_k |u_k|
    pos, neg = torch.exp(both - m).split(u.shape[-1], dim=-1)  # (..., K) each
    den = (pos + neg).sum(dim=-1, keepdim=True)  # (..., 1)
    return (pos - neg) / den, (pos + neg) / den  # (..., K) each


def _rnorm(t: torch.Tensor) -> torch.Tensor:
    """1 / max(|t|, 1e-12) over the last axis, (..., 1): F.normalize's eps."""
    return torch.rsqrt((t * t).sum(dim=-1, keepdim=True).clamp(min=1e-24))


class _AddressFn(torch.autograd.Function):
    """w = signed_address(normalize(x) @ normalize(A).T / tau), float32, with the gradient
    written out: the composed autograd graph of the same formula takes ~60 aten ops per
    bank in the backward (norm, clamp and division backwards), this one ~25.

    With u_k = (x . q_k) / |x|, q_k = a_k / (|a_k| tau), and C = sum_j cosh(u_j):
    dw_k/du_j = delta_kj cosh(u_k) / C - w_k w_j; du_k/dx = (q_k - u_k x / |x|) / |x|;
    du_k/da_k = (x / |x| - tau u_k q_k) ... projected off a_k, over |a_k| tau (see backward).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, anchors: torch.Tensor, tau: float) -> torch.Tensor:
        dtype = x.dtype
        wide = torch.float64 if dtype == torch.float64 else torch.float32  # f64: gradcheck
        x, a = x.to(wide), anchors.to(wide)
        ra = _rnorm(a)  # (K, 1)
        q = a * (ra / tau)  # (K, D) unit anchors over tau
        rx = _rnorm(x)  # (..., 1)
        u = (x @ q.T) * rx  # (..., K) cos(x, a_k) / tau
        w, c = _signed(u)
        ctx.save_for_backward(x, q, rx, ra, u, w, c)
        ctx.tau, ctx.dtype = tau, dtype
        return w

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, q, rx, ra, u, w, c = ctx.saved_tensors
        g = g.to(x.dtype)
        gu = g * c - w * (g * w).sum(dim=-1, keepdim=True)  # (..., K) dL/du
        gs = gu * rx  # (..., K) dL/d(x . q_k)
        gx = ga = None
        if ctx.needs_input_grad[0]:
            radial = (gu * u).sum(dim=-1, keepdim=True) * (rx * rx)  # (..., 1)
            gx = (gs @ q - x * radial).to(ctx.dtype)  # (..., D)
        if ctx.needs_input_grad[1]:
            gq = gs.reshape(-1, gs.shape[-1]).T @ x.reshape(-1, x.shape[-1])  # (K, D)
            # q = a / (|a| tau): remove the radial part (along q), scale by 1 / (|a| tau)
            t2 = ctx.tau * ctx.tau
            ga = (gq - q * ((gq * q).sum(dim=-1, keepdim=True) * t2)) * (ra / ctx.tau)
        return gx, ga, None


class Address(nn.Module):
    """K unit anchors in the residual space and the signed weights of each token over them.

    `learned=False` (arm a3) stores the anchors as a buffer: no optimiser can move them
    (not even weight decay), yet they sit under the same state-dict key as a1's parameter.
    The initial codebook is kept as a buffer ("home") so anchor drift can be reported.
    """

    def __init__(self, d_model: int, n_anchors: int, tau: float, learned: bool) -> None:
        super().__init__()
        self.tau = float(tau)
        init = F.normalize(torch.randn(n_anchors, d_model), dim=-1)  # (K, D) unit rows
        if learned:
            self.anchors = nn.Parameter(init.clone())
        else:
            self.register_buffer("anchors", init.clone())
        self.register_buffer("anchors_init", init.clone())

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """u = normalize(x) @ normalize(A).T / tau, in float32 even under autocast (in bf16 a
        cosine has ~3 digits, an error of ~0.04 in u at tau 0.1, for negligible work)."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            a = F.normalize(self.anchors.float(), dim=-1)  # (K, D)
            x = F.normalize(x.float(), dim=-1)  # (..., D)
            return x @ a.T / self.tau  # (..., K)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """signed_address(self.scores(x)), (..., K) float32, through _AddressFn."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            return _AddressFn.apply(x, self.anchors, self.tau)  # (..., K)

    @torch.no_grad()
    def drift(self) -> torch.Tensor:
        """Per anchor, 1 - cos(anchor, its initial value "home"): (K,), 0 at init, <= 2; the
        public E1-form bank's gauge (drift_mean/drift_max are its mean and max)."""
        a = F.normalize(self.anchors.float(), dim=-1)  # (K, D)
        home = F.normalize(self.anchors_init.float(), dim=-1)  # (K, D)
        return 1.0 - (a * home).sum(dim=-1)  # (K,)

    @torch.no_grad()
    def max_abs_cos(self) -> torch.Tensor:
        """Largest |cos| between two different anchors (1 = two anchors collapsed), 0-d."""
        a = F.normalize(self.anchors.float(), dim=-1)  # (K, D)
        cos = (a @ a.T).abs()  # (K, K)
        cos.fill_diagonal_(0.0)
        return cos.max()
