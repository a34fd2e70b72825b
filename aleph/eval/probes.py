"""Probes of how well the student mimics its targets, and how spread its embeddings are.

- Mimicry R@1: in each full batch of `batch_size` consecutive rows (a short last batch is
  dropped), a row is a hit when its own target is the most similar of the batch's targets;
  reported with the batch size, since more candidates make it harder. Ties split
  (TIE_RULE): sharing the top score with k-1 others scores 1/k. A candidate bitwise equal
  to the own target gets exactly its score (`aleph.data.align.retrieval_credit`), so a
  duplicated target is a tie by identity, never a hit or a miss by GEMM rounding.
- cos->target: mean cosine between a row's embedding and its own target.
- erank: participation ratio (sum l)^2 / sum l^2 of the eigenvalues l of the embeddings'
  (centred) covariance; between 1 (one direction) and D (isotropic), reported out of D.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aleph.data.align import bitwise_same, retrieval_credit
from aleph.errors import DataError


def _check(student: torch.Tensor, target: torch.Tensor) -> None:
    if student.shape != target.shape or student.ndim != 2:
        raise DataError(f"probe: student {tuple(student.shape)} and target "
                        f"{tuple(target.shape)} must both be (N, D)")


TIE_RULE = "split"  # recorded in eval.json next to the figure


def mimicry_r_at_1(student: torch.Tensor, target: torch.Tensor, batch_size: int) -> float:
    """Fraction of rows whose own target ranks first among their batch's targets (ties split)."""
    _check(student, target)
    n_batches = student.shape[0] // batch_size
    if batch_size < 2 or n_batches == 0:
        raise DataError(f"R@1 needs batch_size >= 2 and at least one full batch: "
                        f"{student.shape[0]} rows, batch_size {batch_size}")
    rows = n_batches * batch_size
    s = F.normalize(student.double(), dim=-1)[:rows].view(n_batches, batch_size, -1)  # (n, B, D)
    t = F.normalize(target.double(), dim=-1)[:rows].view(n_batches, batch_size, -1)  # (n, B, D)
    sims = s @ t.transpose(1, 2)  # (n, B, B): row i of batch k vs every target of batch k
    # identity from the targets as given (before normalising): bitwise-equal rows tie
    same = bitwise_same(target[:rows].view(n_batches, batch_size, -1))  # (n, B, B)
    credit = retrieval_credit(sims, same)  # (n, B): 1/k when the own target is among k tied
    return float(credit.mean())


def cos_to_target(student: torch.Tensor, target: torch.Tensor) -> float:
    _check(student, target)
    cos = F.cosine_similarity(student.double(), target.double(), dim=-1)  # (N,)
    return float(cos.mean())


def erank(emb: torch.Tensor) -> float:
    """Participation ratio of the covariance spectrum of `emb` (N, D)."""
    if emb.ndim != 2 or emb.shape[0] < 2:
        raise DataError(f"erank needs at least 2 embeddings (N, D), got {tuple(emb.shape)}")
    x = emb.double() - emb.double().mean(0, keepdim=True)  # (N, D)
    # Eigenvalues of the covariance are the squared singular values of x (up to 1/(N-1),
    # which cancels in the ratio); svdvals avoids forming the D x D matrix.
    lam = torch.linalg.svdvals(x) ** 2  # (min(N, D),)
    total = lam.sum()
    if total == 0:
        return 0.0  # every embedding identical: no spread at all
    return float(total**2 / (lam**2).sum())


def probe_all(student: torch.Tensor, target: torch.Tensor, batch_size: int) -> dict:
    return {
        "r_at_1": mimicry_r_at_1(student, target, batch_size),
        "r_at_1_batch_size": batch_size,
        "r_at_1_ties": TIE_RULE,
        "rows": int(student.shape[0]),
        "rows_scored_r_at_1": (student.shape[0] // batch_size) * batch_size,
        "cos_target": cos_to_target(student, target),
        "erank": erank(student),
        "dim": int(student.shape[1]),
    }
