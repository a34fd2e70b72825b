"""One training step (`train_step`: forward, loss over the global batch, checked update) and
the data position after it (`advance`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from aleph.errors import NonFiniteError
from aleph.model.objective import distill_loss
from aleph.train.checkpoint import Position
from aleph.train.config import loss_weights
from aleph.train.order import DataOrder
from aleph.train.prefetch import Batch

if TYPE_CHECKING:
    from aleph.train.trainer import Trainer


@dataclass
class StepResult:
    values: dict[str, float]
    """"loss", each term of the objective by its name ("nce", "mse"), "grad_norm"."""
    lr: float
    step: int
    """The step (1-based) these values belong to."""

    @property
    def loss(self) -> float:
        return self.values["loss"]

    @property
    def grad_norm(self) -> float:
        return self.values["grad_norm"]

    @property
    def terms(self) -> dict[str, float]:
        """The objective's terms by name, without the total and the gradient norm."""
        return {k: v for k, v in self.values.items() if k not in ("loss", "grad_norm")}


def train_step(t: Trainer, batch: Batch) -> StepResult:
    """Forward on this rank's rows, loss over the global batch, checked update.

    One host sync per step: the loss, its terms and the clipped gradient norm are read in
    one stacked transfer (each `.item()` would drain the GPU queue) before `opt.step()`, so
    no update is made on NaN/inf. Under DDP every rank computes the same values (global
    batch, all-reduced gradients) and raises together: no cross-rank flag is needed.
    """
    cfg, world, device = t.cfg, t.world, t.device
    ids, mask, target = batch  # (b, L) long, (b, L) bool or None (no padding), (b, D); b = B / W
    use_bf16 = device.type == "cuda" and cfg.bf16
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
        student = t.net(ids, mask)  # (b, D)
    student = world.gather_with_grad(student.float())  # (B, D), rank order = batch order
    target = world.gather(target)  # (B, D)
    loss, terms = distill_loss(student, target, cfg.tau, loss_weights(cfg))
    loss.backward()
    clip = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(t.net.parameters(), clip)
    stats = torch.stack([loss.detach(), *(v.detach() for v in terms.values()),
                         norm.to(loss.device)]).float()  # (V,)
    try:  # the step's one host sync
        result = _checked(t.pos.step + 1, ("loss", *terms, "grad_norm"), stats.tolist(),
                          t.opt.param_groups[0]["lr"])
    except NonFiniteError:
        t.opt.zero_grad(set_to_none=True)  # the non-finite gradients must not reach a later step
        raise
    t.opt.step()  # the optimizer step
    t.sched.step()
    t.opt.zero_grad(set_to_none=True)
    return result


def _checked(step: int, names: tuple[str, ...], values: list[float], lr: float) -> StepResult:
    """The step's values, or NonFiniteError naming the first non-finite one: the loss (with
    its terms), else the gradient norm."""
    res = StepResult(dict(zip(names, values, strict=True)), lr, step)
    intact = "no update was made, the last resume state is intact"
    if not math.isfinite(res.loss):
        terms = ", ".join(f"{k} {v}" for k, v in res.terms.items())
        raise NonFiniteError(f"step {step}: loss is {res.loss} ({terms}); {intact}")
    if not math.isfinite(res.grad_norm):
        raise NonFiniteError(f"step {step}: gradient norm is {res.grad_norm} (loss {res.loss}); "
                             f"{intact}")
    return res


def advance(pos: Position, order: DataOrder, seconds: float) -> Position:
    """The position after one more global batch (`order.after` rolls the epoch over)."""
    epoch, batch = order.after(pos.epoch, pos.batch_in_epoch)
    return Position(pos.step + 1, epoch, batch, pos.samples_seen + order.global_batch, seconds)

