"""The distillation objective: named loss terms (symmetric in-batch InfoNCE, per-sample MSE to
the target), each weighted by its config field (`TrainConfig.w_<term>`) and summed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aleph.errors import ConfigError


def distill_loss(student: torch.Tensor, target: torch.Tensor, tau: float = 0.07,
                 weights: dict[str, float] | None = None
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """total = sum of weights[name] * term over the named terms (weights None: 1 each), with
    the terms returned (undetached, in this order: the trainer logs each as train/<name>).

    student, target (B, D): cast to float32 (the B x B logits are precision-sensitive under
    bf16) and L2-normalised (fp16 storage moves the targets' norms by ~1e-3), so the loss
    measures direction, as the cos-to-target metric does. nce: row i of student picks
    target i among the batch and vice versa (mean of both cross-entropies); mse: each
    sample's (2 - 2 cos) / D, averaged. A new term is one line here and its weight field.
    """
    if student.ndim != 2 or student.shape != target.shape:
        raise ConfigError(
            f"distill_loss: student {tuple(student.shape)} and target {tuple(target.shape)} "
            "must both be (B, D) with the same D (check ModelConfig.out_dim against the "
            "target store's dim)")
    s = F.normalize(student.float(), dim=-1)  # (B, D)
    t = F.normalize(target.float(), dim=-1)  # (B, D)
    logits = s @ t.T / tau  # (B, B)
    labels = torch.arange(s.shape[0], device=s.device)  # (B,)
    terms = {
        "nce": 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)),
        "mse": F.mse_loss(s, t),
    }
    weights = dict.fromkeys(terms, 1.0) if weights is None else weights
    if set(weights) != set(terms):  # a term without its weight field, or a weight without its term
        raise ConfigError(f"distill_loss: weights for {sorted(weights)}, terms {sorted(terms)}")
    weighted = [weights[name] * value for name, value in terms.items()]
    total = sum(weighted[1:], weighted[0])  # w_nce * nce + w_mse * mse, in that order
    return total, terms
