"""Feed-forward layers of a block: the a2 dense FFN and the a1/a3 anchored bank.

Both are bias-free, so the bank is parameter-matched to the dense FFN exactly in its
matrices: trunk d*ff*2 + K experts d*ff*2 = (1 + K) * 2*d*ff = 2*d*2048 for ff=512, K=3.
Only the address (K*D anchors) and K gates are extra: 1,539 numbers per block at E1.
Initialisation: ModelConfig.init (aleph.model.config.INIT_SCHEMES).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from aleph.model.address import Address

_STD = 0.02  # scale of the "normal_0.02" scheme (BERT-style)


@torch.no_grad()
def init_matrix(weight: torch.Tensor, init: str) -> None:
    """Initialise one 2-D weight in place by scheme: `nn.init.orthogonal_` (orthonormal rows
    or columns, whichever side is smaller) or normal(0, 0.02)."""
    if init == "e1_orthogonal":
        nn.init.orthogonal_(weight)
    elif init == "normal_0.02":
        nn.init.normal_(weight, std=_STD)
    else:  # ModelConfig rejects any other name; this is a programming error
        raise ValueError(f"unknown init scheme {init!r}")


class DenseFFN(nn.Module):
    """a2: Linear d->ff, GELU, Linear ff->d, no bias (the bank draws its trunk's init with one)."""

    def __init__(self, d_model: int, ff: int, init: str = "e1_orthogonal") -> None:
        super().__init__()
        self.w_in = nn.Linear(d_model, ff, bias=False)
        self.w_out = nn.Linear(ff, d_model, bias=False)
        init_matrix(self.w_in.weight, init)
        init_matrix(self.w_out.weight, init)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.w_out(F.gelu(self.w_in(x)))  # (B, L, D)


class AnchoredBank(nn.Module):
    """out = trunk(x) + sum_k w_k(x) * sigmoid(g_k) * expert_k(x).

    Every expert runs on every token (no top-k, no argmax, no balance loss). The trunk and
    the K experts are one (D, (1 + K) * ff) input matmul and one ((1 + K) * ff, D) output
    matmul: `w_in` holds the trunk's input map in columns [0, ff) and expert k's in
    [(1 + k) * ff, (2 + k) * ff), `w_out` the output maps in the same row blocks (the
    layout the matmuls read: nothing is permuted or copied per forward). The hidden units
    between are scaled per token by (1, c_1, ..., c_K), c_k = w_k * sigmoid(g_k). Expert
    w_out blocks start at zero, so at init the bank *is* its trunk. `blocks()` gives the
    per-expert views.
    """

    def __init__(self, d_model: int, ff: int, n_anchors: int, tau: float,
                 gate_init: float, learned_anchors: bool, init: str = "e1_orthogonal") -> None:
        super().__init__()
        self.n_anchors, self.ff = n_anchors, ff
        # Drawn as the earlier layout drew them (a DenseFFN trunk, with nn.Linear's own
        # draws, then the anchors, then the experts): a seed gives the same numbers.
        trunk = DenseFFN(d_model, ff, init)
        trunk_in, trunk_out = trunk.w_in.weight.detach(), trunk.w_out.weight.detach()
        self.address = Address(d_model, n_anchors, tau, learned=learned_anchors)
        if init == "normal_0.02":  # the former draw, kept as it was (same RNG use)
            experts = torch.randn(n_anchors, d_model, ff) * _STD  # (K, D, ff)
        else:
            experts = torch.empty(n_anchors, d_model, ff)
            for k in range(n_anchors):
                init_matrix(experts[k], init)  # each expert's (D, ff) orthogonal on its own
        w_in = torch.cat([trunk_in.T, experts.permute(1, 0, 2).reshape(d_model, -1)], dim=1)
        w_out = torch.cat([trunk_out.T, torch.zeros(n_anchors * ff, d_model)], dim=0)
        self.w_in = nn.Parameter(w_in.contiguous())  # (D, (1+K)*ff)
        self.w_out = nn.Parameter(w_out)  # ((1+K)*ff, D)
        self.gates = nn.Parameter(torch.full((n_anchors,), float(gate_init)))  # (K,)
        self.dispatch = True
        # Record health()'s address statistics in each forward (off on the trainer's steps
        # that log no gauges; compiled, always recorded, so switching never recompiles).
        self.gauges = True
        # Summary of the last recorded forward's address, for health(): |w| mass on each of
        # the 2K half-axes (k+, k-), negative-weight count, token count. Updated in place
        # so torch.compile sees a buffer mutation, not a Python attribute write.
        self.register_buffer("_usage", torch.zeros(2 * n_anchors), persistent=False)
        self.register_buffer("_neg", torch.zeros(()), persistent=False)
        self.register_buffer("_count", torch.zeros(()), persistent=False)

    def blocks(self) -> dict[str, torch.Tensor]:
        """Views of the merged matrices: trunk_in (D, ff), trunk_out (ff, D), and for each
        expert k in_k (D, ff), out_k (ff, D)."""
        ff, out = self.ff, {}
        for j, name in enumerate(["trunk", *(str(k) for k in range(self.n_anchors))]):
            out[f"{name}_in"] = self.w_in[:, j * ff:(j + 1) * ff]
            out[f"{name}_out"] = self.w_out[j * ff:(j + 1) * ff]
        return out

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, L, D); mask (B, L) bool, True on real tokens (health counts only those)."""
        h = F.gelu(x @ self.w_in)  # (B, L, (1+K)*ff), trunk and experts in one matmul
        if self.dispatch:
            w = self.address(x)  # (B, L, K) float32
            if torch.compiler.is_compiling() or self.gauges:  # this order: no guard on gauges
                self._record(w, mask)
            # The hidden's dtype, not x's: under bf16 autocast x (a LayerNorm output) is fp32
            # while the matmul gives bf16; an fp32 coef would promote the hidden to fp32 and
            # back (memory traffic a2's dense FFN does not pay).
            coef = (w * torch.sigmoid(self.gates.float())).to(h.dtype)  # (B, L, K)
        else:  # trunk only: the experts' hidden scaled by 0 (same matmuls, so same rounding)
            coef = h.new_zeros(*h.shape[:-1], self.n_anchors)  # (B, L, K)
        coef = F.pad(coef, (1, 0), value=1.0)  # (B, L, 1+K): the trunk's scale is 1
        h = h.unflatten(-1, (self.n_anchors + 1, self.ff)) * coef.unsqueeze(-1)  # (B, L, 1+K, ff)
        return h.flatten(-2) @ self.w_out  # (B, L, D) = trunk + sum_k c_k expert_k

    @torch.no_grad()
    def _record(self, w: torch.Tensor, mask: torch.Tensor | None) -> None:
        w = w.detach()  # (B, L, K)
        keep = (mask.unsqueeze(-1).to(w.dtype) if mask is not None
                else torch.ones_like(w[..., :1]))  # (B, L, 1)
        half = torch.cat([w.clamp(min=0), (-w).clamp(min=0)], dim=-1) * keep  # (B, L, 2K)
        self._usage.copy_(half.sum(dim=(0, 1)))
        self._neg.copy_(((w < 0).to(w.dtype) * keep).sum())
        self._count.copy_(keep.sum() * w.shape[-1])

    @torch.no_grad()
    def health_tensors(self) -> dict[str, torch.Tensor]:
        """The gauges as 0-d tensors on the bank's device (no host sync): the caller moves
        every bank's gauges to the host in one transfer (AlephEncoder.health)."""
        gates = torch.sigmoid(self.gates.float())  # (K,)
        out = {f"gate{k}": g for k, g in enumerate(gates.unbind())}
        out["gate_mean"] = gates.mean()
        drift = self.address.drift()  # (K,) 1 - cos(anchor, home)
        out["anchor_drift"] = drift.mean()
        out["anchor_drift_max"] = drift.max()
        out["anchor_max_cos"] = self.address.max_abs_cos()
        # Usage is undefined before a forward with dispatch on (or all-zero weights): NaN.
        total = self._usage.sum()
        p = self._usage / total.clamp(min=1e-30)  # (2K,)
        entropy = -(p * torch.log(p.clamp(min=1e-30))).sum()
        nan = torch.full_like(total, math.nan)
        out["usage_ppl"] = torch.where(total > 0, torch.exp(entropy), nan)  # in [1, 2K]
        out["neg_frac"] = torch.where(total > 0, self._neg / self._count.clamp(min=1), nan)
        return out

    def health(self) -> dict[str, float]:
        """Gauges of this bank; address-derived ones describe the last forward that recorded
        them (dispatch on, gauges on or compiled)."""
        return tensors_to_floats(self.health_tensors())


def tensors_to_floats(values: dict[str, torch.Tensor]) -> dict[str, float]:
    """{name: 0-d tensor} -> {name: float} with one device-to-host transfer for all."""
    if not values:
        return {}
    stacked = torch.stack([v.detach().float().reshape(()) for v in values.values()])
    return dict(zip(values, stacked.tolist(), strict=True))
