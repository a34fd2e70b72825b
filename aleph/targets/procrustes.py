"""Generalized Procrustes analysis of k teachers' rows, from their streamed second moments.

Teacher i's fit rows X_i (N x D) enter only through the sums `GramAccumulator` adds up
block by block: s_i = sum of rows (D) and the block Gram matrix C = [X_1 .. X_k]^T
[X_1 .. X_k] (kD x kD, float64). Everything after that works on D x D blocks, so the fit's
memory is k^2 D^2 x 8 B (118 MB for five 768-d teachers) whatever N is, and no row is
held after its block.

The fit (`fit_gpa`): each teacher is first mapped to Z_i = (X_i - mu_i) W_i, where for
`whiten="none"` mu_i = 0 and W_i = I (rotation only), and for `whiten="zca"` mu_i is its
mean and W_i = Sigma_i^(-1/2) its ZCA whitener. Then orthogonal R_i minimise
sum_i ||Z_i R_i - Y||^2 with Y = mean_j Z_j R_j, by the classic leave-one-out sweep
(R_i = polar(sum_{j != i} G_ij R_j), G_ij = Z_i^T Z_j / N), which never increases the
objective; sweeps stop when it falls by less than `tol` (relative) or after `max_iter`.
A GPA solution is defined up to one common rotation: the result is turned so that the
consensus is best aligned with teacher 0 (its frame, for reproducibility).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from aleph.errors import StoreError

WHITEN_MODES = ("none", "zca")
EIG_FLOOR = 1e-6  # eigenvalues below this x the largest are clamped when whitening


class GramAccumulator:
    """Running s_i and C for k teachers of width dim (float64)."""

    def __init__(self, k: int, dim: int, device: str = "cpu") -> None:
        self.k, self.dim, self.rows = k, dim, 0
        self.sums = torch.zeros(k * dim, dtype=torch.float64, device=device)  # (kD,)
        self.gram = torch.zeros(k * dim, k * dim, dtype=torch.float64, device=device)  # (kD, kD)

    def add(self, blocks: list[torch.Tensor]) -> None:
        """One block of the same n rows of every teacher: k tensors (n, dim)."""
        x = torch.cat(blocks, dim=1).to(self.gram.device)  # (n, kD) float32
        if x.shape[1] != self.k * self.dim:
            raise ValueError(f"expected {self.k} blocks of width {self.dim}, got {x.shape}")
        self.sums += x.sum(0, dtype=torch.float64)
        self.gram += (x.T @ x).double()  # float32 per block, float64 across blocks
        self.rows += x.shape[0]


@dataclass
class GpaFit:
    """The fitted maps: consensus row = normalise(sum_i (x_i - mean_i) @ maps_i)."""

    rotations: list[torch.Tensor]  # k x (D, D) orthogonal, float64
    means: list[torch.Tensor]  # k x (D,), zeros without whitening
    whiteners: list[torch.Tensor]  # k x (D, D), identity without whitening
    iterations: int
    converged: bool
    objective: float  # mean squared distance of the aligned teacher rows to their mean
    objective_trace: list[float] = field(default_factory=list)
    residuals: list[float] = field(default_factory=list)  # per teacher: ||Z_i R_i - Y||^2 / N
    relative_residuals: list[float] = field(default_factory=list)  # ... / ||Z_i||^2


def fit_memory(k: int, dim: int, whiten: str, block_rows: int) -> int:
    """Bytes the fit of k teachers of width `dim` holds at its peak, an estimate (within a
    few D x D matrices) of the largest of its phases, each counted from the code above:
    accumulating (the float64 Gram sums, a block's float32 x^T x and its float64 copy, the
    block of rows twice), fitting (the Gram sums, the k^2 G_ij blocks, with ZCA their
    whitened copies and the whiteners, the rotations, the polar factor's SVD) and saving
    (the Gram sums, rotations and whiteners, their clones and the serialised file)."""
    kd2, d2 = (k * dim) ** 2, dim * dim
    accumulate = kd2 * (8 + 4 + 8) + 2 * block_rows * k * dim * 4
    fit = kd2 * 16 + (kd2 * 8 + k * d2 * 8 if whiten == "zca" else 0) + k * d2 * 8 + 8 * d2 * 8
    save = kd2 * 8 + 2 * k * d2 * 8 + 6 * k * d2 * 8
    return max(accumulate, fit, save)


def polar(m: torch.Tensor) -> torch.Tensor:
    """The orthogonal factor U V^T of m = U S V^T: argmax_R tr(R^T m) over rotations/reflections."""
    u, _, vh = torch.linalg.svd(m)
    return u @ vh


def _blocks(acc: GramAccumulator, whiten: str) -> tuple[list[list[torch.Tensor]], list, list]:
    """G_ij (D x D) of the mapped teachers, with the means and whiteners used."""
    k, d, n = acc.k, acc.dim, acc.rows
    eye = torch.eye(d, dtype=torch.float64, device=acc.gram.device)
    means, whiteners = [], []
    for i in range(k):
        mu = acc.sums[i * d:(i + 1) * d] / n if whiten == "zca" else torch.zeros_like(eye[0])
        means.append(mu)
        if whiten == "zca":
            cov = acc.gram[i * d:(i + 1) * d, i * d:(i + 1) * d] / n - torch.outer(mu, mu)
            lam, vec = torch.linalg.eigh(cov)
            lam = lam.clamp_min(EIG_FLOOR * float(lam.max()))
            whiteners.append(vec @ torch.diag(lam.rsqrt()) @ vec.T)
        else:
            whiteners.append(eye)
    block = [[acc.gram[i * d:(i + 1) * d, j * d:(j + 1) * d] / n for j in range(k)]
             for i in range(k)]
    if whiten == "none":  # W = I, mean 0: the raw second moments (no 2 k^2 D^3 products)
        return block, means, whiteners
    g = [[whiteners[i].T @ (block[i][j] - torch.outer(means[i], means[j])) @ whiteners[j]
          for j in range(k)] for i in range(k)]
    return g, means, whiteners


def _objective(g, rot) -> tuple[float, list[float], list[float]]:
    """(sum_i ||Z_i R_i - Y||^2 / N, per-teacher residuals, their relative form) from G.

    With M_i = sum_j G_ij R_j: <Z_i R_i, Y> / N = tr(R_i^T M_i) / k and ||Y||^2 / N =
    sum_i tr(R_i^T M_i) / k^2 (tr(A^T B) as the elementwise sum of A * B).
    """
    k = len(rot)
    cross = [float((rot[i] * sum(g[i][j] @ rot[j] for j in range(k))).sum()) for i in range(k)]
    y2 = sum(cross) / k**2
    norms = [float(torch.trace(g[i][i])) for i in range(k)]
    res = [norms[i] - 2 * cross[i] / k + y2 for i in range(k)]
    return sum(res), res, [r / n for r, n in zip(res, norms, strict=True)]


def fit_gpa(acc: GramAccumulator, whiten: str = "none", tol: float = 1e-10,
            max_iter: int = 500) -> GpaFit:
    """Rotations (and whiteners) from the accumulated moments; see the module docstring."""
    if whiten not in WHITEN_MODES:
        raise StoreError(f"whiten {whiten!r}: expected one of {WHITEN_MODES}")
    if acc.rows < 2:
        raise StoreError(f"the Procrustes fit needs at least 2 rows, got {acc.rows}")
    if whiten == "zca" and acc.rows <= acc.dim:
        raise StoreError(f"whiten 'zca' needs more fit rows than the width {acc.dim} "
                         f"(got {acc.rows}): a covariance of fewer rows is singular")
    g, means, whiteners = _blocks(acc, whiten)
    k = acc.k
    # start: every teacher aligned to teacher 0 (one Procrustes each), then sweep
    rot = [polar(g[i][0]) for i in range(k)]
    trace = [_objective(g, rot)[0]]
    converged, it = False, 0
    while not converged and it < max_iter:
        it += 1
        for i in range(k):
            rot[i] = polar(sum(g[i][j] @ rot[j] for j in range(k) if j != i))
        trace.append(_objective(g, rot)[0])
        converged = trace[-2] - trace[-1] <= tol * max(trace[-2], 1e-300)
    # gauge: the common rotation Q that best aligns the consensus with teacher 0
    q = polar(sum(rot[j].T @ g[j][0] for j in range(k)))
    rot = [r @ q for r in rot]
    total, res, rel = _objective(g, rot)
    return GpaFit(rot, means, whiteners, it, converged, total, trace, res, rel)
