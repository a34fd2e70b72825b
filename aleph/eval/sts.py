"""Spearman rank correlation, written out (no scipy), and cosine scoring of pairs.

Spearman is the Pearson correlation of the two rank vectors. Tied values share the
mean of the ranks they span ("average rank"), which is what STS evaluation uses; with
ties the shortcut 1 - 6*sum(d^2)/(n(n^2-1)) is wrong, so it is not used here.
"""

from __future__ import annotations

import numpy as np
import torch

from aleph.errors import DataError


def average_ranks(values) -> np.ndarray:
    """1-based ranks of `values`; each group of equal values gets the mean of its ranks."""
    x = np.asarray(values, dtype=np.float64)  # (N,)
    if x.ndim != 1:
        raise ValueError(f"average_ranks wants a 1-d sequence, got shape {x.shape}")
    if np.isnan(x).any():
        raise DataError("cannot rank a sequence containing NaN")
    order = np.argsort(x, kind="mergesort")  # (N,) stable, so equal values stay together
    sorted_x = x[order]
    # Start index of each run of equal values in the sorted order.
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])  # (G,)
    ends = np.r_[starts[1:], len(x)]  # (G,) one past each run
    # A run covering sorted positions s..e-1 holds ranks s+1..e: their mean is (s+1+e)/2.
    run_rank = (starts + 1 + ends) / 2.0  # (G,)
    ranks_sorted = np.repeat(run_rank, ends - starts)  # (N,)
    ranks = np.empty_like(ranks_sorted)
    ranks[order] = ranks_sorted
    return ranks


def pearson(x, y) -> float:
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    xc, yc = x - x.mean(), y - y.mean()
    denom = np.sqrt((xc * xc).sum() * (yc * yc).sum())
    if denom == 0.0:
        # A constant input has no ordering: the correlation is undefined, not zero.
        raise DataError("correlation undefined: one of the sequences is constant")
    return float((xc * yc).sum() / denom)


def spearman(x, y) -> float:
    """Spearman's rho with average-rank ties."""
    if len(x) != len(y):
        raise DataError(f"spearman: sequences differ in length ({len(x)} vs {len(y)})")
    if len(x) < 2:
        raise DataError(f"spearman: need at least 2 pairs, got {len(x)}")
    return pearson(average_ranks(x), average_ranks(y))


def pair_cosines(emb_a: torch.Tensor, emb_b: torch.Tensor) -> np.ndarray:
    """Row-wise cosine of two embedding matrices (N, D) -> (N,)."""
    a = torch.nn.functional.normalize(emb_a.double(), dim=-1)  # (N, D)
    b = torch.nn.functional.normalize(emb_b.double(), dim=-1)  # (N, D)
    return (a * b).sum(-1).cpu().numpy()  # (N,)
