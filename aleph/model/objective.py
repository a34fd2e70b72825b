"""The distillation objective: symmetric in-batch InfoNCE plus per-sample MSE to the target."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aleph.errors import ConfigError


def distill_loss(student: torch.Tensor, target: torch.Tensor, tau: float = 0.07,
                 w_nce: float = 1.0, w_mse: float = 1.0
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """total = w_nce * InfoNCE + w_mse * MSE, with both terms returned (undetached).

    student (B, D): the encoder's unit embeddings. target (B, D): the teacher targets
    (fp16 on disk). Both are cast to float32 (the B x B logits are precision-sensitive
    under bf16 autocast) and L2-normalised: the targets are unit by construction, but
    fp16 storage moves norms by ~1e-3 and renormalising is idempotent on good data, so
    the loss always measures direction, as the cos-to-target metric does.
    InfoNCE: row i of student should pick target i among the batch and vice versa
    (mean of both cross-entropies). MSE: mean squared error over elements, i.e. each
    sample's (2 - 2 cos) / D averaged over the batch (`F.mse_loss`).
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
    nce = 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))
    mse = F.mse_loss(s, t)
    return w_nce * nce + w_mse * mse, {"nce": nce, "mse": mse}
