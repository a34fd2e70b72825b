"""One training step: forward, distillation loss over the global batch, checked update."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from aleph.errors import NonFiniteError
from aleph.model.objective import distill_loss
from aleph.train.checkpoint import Position
from aleph.train.prefetch import Batch

if TYPE_CHECKING:
    from aleph.train.trainer import Trainer


@dataclass
class StepResult:
    loss: float
    nce: float
    mse: float
    grad_norm: float
    lr: float


def train_step(t: Trainer, batch: Batch) -> StepResult:
    """Forward on this rank's rows, loss over the global batch, checked update.

    One host synchronisation per step: loss, its parts and the clipped gradient norm come
    to the host in one stacked `.tolist()` after clipping (each `.item()` would drain the
    GPU queue and leave the accelerator idle while the host catches up). A non-finite
    loss makes the gradient norm non-finite too, so the single check still comes before
    `opt.step()`: no update is made on NaN/inf. No cross-rank flag is needed under DDP:
    the loss is computed from the all-gathered global batch and the norm from the
    all-reduced gradients, so every rank sees the same values and raises together.
    """
    cfg, world, device, model, opt = t.cfg, t.world, t.device, t.net, t.opt
    ids, mask, target = batch  # (b, L) long, (b, L) bool or None (no padding), (b, D); b = B / W
    use_bf16 = device.type == "cuda" and cfg.bf16
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
        student = model(ids, mask)  # (b, D) with b = B / W
    student = world.gather_with_grad(student.float())  # (B, D), rank order = batch order
    target = world.gather(target)  # (B, D)
    loss, parts = distill_loss(student, target, cfg.tau, cfg.w_nce, cfg.w_mse)
    loss.backward()
    clip = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    stats = torch.stack([loss.detach(), parts["nce"].detach(), parts["mse"].detach(),
                         norm.to(loss.device)]).float()  # (4,)
    value, nce, mse, grad_norm = stats.tolist()  # the step's one host sync
    if not (math.isfinite(value) and math.isfinite(grad_norm)):
        opt.zero_grad(set_to_none=True)  # the non-finite gradients must not reach a later step
        raise NonFiniteError(_nonfinite_message(t.pos.step, value, nce, mse, grad_norm))
    lr = opt.param_groups[0]["lr"]
    opt.step()
    t.sched.step()
    opt.zero_grad(set_to_none=True)
    return StepResult(value, nce, mse, grad_norm, lr)


def _nonfinite_message(step: int, loss: float, nce: float, mse: float, norm: float) -> str:
    """Names the first non-finite value: the loss, else the gradient norm."""
    intact = "no update was made, the last resume state is intact"
    if not math.isfinite(loss):
        return f"step {step + 1}: loss is {loss} (nce {nce}, mse {mse}); {intact}"
    return f"step {step + 1}: gradient norm is {norm} (loss {loss}); {intact}"




def advance(pos: Position, steps_per_epoch: int, batch: int, seconds: float) -> Position:
    """The position after one more step of `batch` rows (the epoch rolls over at its end)."""
    nxt = pos.batch_in_epoch + 1
    epoch, nxt = (pos.epoch + 1, 0) if nxt == steps_per_epoch else (pos.epoch, nxt)
    return Position(pos.step + 1, epoch, nxt, pos.samples_seen + batch, seconds)
