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
    step: int = 0
    """The step (1-based) these values belong to: under defer_step_sync, the one before."""


@dataclass
class InFlight:
    """A step whose stats (4,) are still on their way to the host (defer_step_sync)."""

    step: int
    host: torch.Tensor  # (4,) pinned on CUDA, filled by a non_blocking copy
    copied: torch.cuda.Event | None  # recorded after that copy; None on CPU (nothing queued)
    lr: float
    before: Position  # where training stood before this step (restored if it was non-finite)

    def read(self) -> StepResult:
        """The step's one host sync, one step late: waits for this step's copy only, not for
        the work queued after it."""
        if self.copied is not None:
            self.copied.synchronize()
        return _checked(self.step, self.host.tolist(), self.lr)


def deferring(t: Trainer) -> bool:
    """defer_step_sync and every group fused: only fused AdamW takes `found_inf` and skips
    a non-finite update on the device, so the host need not have looked first."""
    return t.cfg.defer_step_sync and all(g.get("fused") for g in t.opt.param_groups)


def train_step(t: Trainer, batch: Batch) -> StepResult | None:
    """Forward on this rank's rows, loss over the global batch, checked update.

    One host synchronisation per step: loss, its parts and the clipped gradient norm come
    to the host in one stacked read after clipping (each `.item()` would drain the GPU
    queue and leave the accelerator idle while the host catches up). A non-finite loss
    makes the gradient norm non-finite too, so one check covers both. No cross-rank flag is
    needed under DDP: the loss is computed from the all-gathered global batch and the norm
    from the all-reduced gradients, so every rank sees the same values and raises together.

    By default the read comes before `opt.step()` (no update is made on NaN/inf) and this
    step's StepResult is returned. Under defer_step_sync (fused AdamW) the stats are
    copied to the host without waiting and the update is skipped on the device when they
    are non-finite (`found_inf`); the read happens in the next step, after its backward is
    queued and before its update, which returns the previous step's StepResult (None on
    the first) and raises NonFiniteError for it. `settle` reads what is still in flight.
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
    lr, step = opt.param_groups[0]["lr"], t.pos.step + 1
    if not deferring(t):
        try:
            result = _checked(step, stats.tolist(), lr)  # the step's one host sync
        except NonFiniteError:
            opt.zero_grad(set_to_none=True)  # the non-finite gradients must not reach a later step
            raise
        _update(t)
        return result
    flight = _send(step, stats, lr, t.pos)
    try:
        earlier = settle(t)  # the previous step: raises before this step's update
    except NonFiniteError:
        opt.zero_grad(set_to_none=True)
        raise
    opt.found_inf = (~torch.isfinite(stats).all()).float()  # () 1.0: skip, on the device
    try:
        _update(t)
    finally:
        del opt.found_inf
    t.pending = flight
    return earlier


def settle(t: Trainer) -> StepResult | None:
    """The step still in flight under defer_step_sync, read now (None if none is): before a
    save, a stop, the end, or a line that reports it. Raises NonFiniteError for it, with the
    position (and the monitor's step) set back to before it: that step made no update."""
    flight, t.pending = t.pending, None
    if flight is None:
        return None
    try:
        return flight.read()
    except NonFiniteError:
        t.pos = flight.before
        t.monitor.step = flight.before.step
        raise


def _update(t: Trainer) -> None:
    t.opt.step()
    t.sched.step()
    t.opt.zero_grad(set_to_none=True)


def _send(step: int, stats: torch.Tensor, lr: float, before: Position) -> InFlight:
    """Start the copy of stats (4,) to the host without waiting for it."""
    if not stats.is_cuda:
        return InFlight(step, stats.clone(), None, lr, before)
    host = torch.empty(stats.shape, dtype=stats.dtype, pin_memory=True)
    host.copy_(stats, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    return InFlight(step, host, copied, lr, before)


def _checked(step: int, values: list[float], lr: float) -> StepResult:
    """The step's values, or NonFiniteError naming the first non-finite one."""
    value, nce, mse, grad_norm = values
    if not (math.isfinite(value) and math.isfinite(grad_norm)):
        raise NonFiniteError(_nonfinite_message(step, value, nce, mse, grad_norm))
    return StepResult(value, nce, mse, grad_norm, lr, step)


def _nonfinite_message(step: int, loss: float, nce: float, mse: float, norm: float) -> str:
    """Names the first non-finite value: the loss, else the gradient norm."""
    intact = "no update was made, the last resume state is intact"
    if not math.isfinite(loss):
        return f"step {step}: loss is {loss} (nce {nce}, mse {mse}); {intact}"
    return f"step {step}: gradient norm is {norm} (loss {loss}); {intact}"


def advance(pos: Position, steps_per_epoch: int, batch: int, seconds: float) -> Position:
    """The position after one more step of `batch` rows (the epoch rolls over at its end)."""
    nxt = pos.batch_in_epoch + 1
    epoch, nxt = (pos.epoch + 1, 0) if nxt == steps_per_epoch else (pos.epoch, nxt)
    return Position(pos.step + 1, epoch, nxt, pos.samples_seen + batch, seconds)
