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
    """w = sinh(u) / sum cosh(u) over the last axis, stable for any |u|.

    Both sinh and cosh overflow for |u| > ~89 in fp32, so numerator and denominator are
    divided by exp(m), m = max_k |u_k|: every exponent is then <= 0 and the largest term
    of the denominator is >= 1/2, so nothing overflows or divides by ~0. m carries no
    gradient in exact arithmetic (it cancels), so it is detached.
    """
    u = u.float()  # exp in bf16 would lose the small weights; K values per token are cheap
    m = u.abs().amax(dim=-1, keepdim=True).detach()  # (..., 1)
    pos = torch.exp(u - m)  # (..., K)
    neg = torch.exp(-u - m)  # (..., K)
    return (pos - neg) / (pos + neg).sum(dim=-1, keepdim=True)  # (..., K)


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
        """u = normalize(x) @ normalize(A).T / tau, in float32 even under autocast.

        In bf16 a cosine carries ~3 significant digits, i.e. an error of ~0.04 in u at
        tau 0.1; the K=3 dot products are negligible work, so they stay in float32.
        """
        with torch.autocast(device_type=x.device.type, enabled=False):
            a = F.normalize(self.anchors.float(), dim=-1)  # (K, D)
            x = F.normalize(x.float(), dim=-1)  # (..., D)
            return x @ a.T / self.tau  # (..., K)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return signed_address(self.scores(x))  # (..., K) float32

    @torch.no_grad()
    def drift(self) -> torch.Tensor:
        """Per anchor, 1 - cos(anchor, its initial value "home"): (K,), 0 at init, <= 2.

        The cosine distance of the public E1-form bank's gauge (its drift_mean/drift_max
        are the mean and max of this); an anchor's length never matters, only its direction.
        """
        a = F.normalize(self.anchors.float(), dim=-1)  # (K, D)
        home = F.normalize(self.anchors_init.float(), dim=-1)  # (K, D)
        return 1.0 - (a * home).sum(dim=-1)  # (K,)

    @torch.no_grad()
    def max_abs_cos_tensor(self) -> torch.Tensor:
        """Largest |cos| between two different anchors (1 = two anchors collapsed), 0-d."""
        a = F.normalize(self.anchors.float(), dim=-1)  # (K, D)
        cos = (a @ a.T).abs()  # (K, K)
        cos.fill_diagonal_(0.0)
        return cos.max()

    def max_abs_cos(self) -> float:
        return float(self.max_abs_cos_tensor())
