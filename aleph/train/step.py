"""One training step (`train_step`: forward, loss over the global batch, checked update) and
how the loop calls it (`Steps`: values handed on at once, or one step late under
defer_step_sync; the deferral lives here only).
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
    stats, names, lr, step = _forward_backward(t, batch)
    try:
        result = _checked(step, names, stats.tolist(), lr)  # the step's one host sync
    except NonFiniteError:
        t.opt.zero_grad(set_to_none=True)  # the non-finite gradients must not reach a later step
        raise
    _update(t)
    return result


def _forward_backward(t: Trainer, batch: Batch) -> tuple[torch.Tensor, tuple[str, ...], float, int]:
    """Loss and clipped gradients of one step; returns (values (V,) on the device, their
    names, the learning rate, the step number)."""
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
    names = ("loss", *terms, "grad_norm")
    stats = torch.stack([loss.detach(), *(v.detach() for v in terms.values()),
                         norm.to(loss.device)]).float()  # (V,)
    return stats, names, t.opt.param_groups[0]["lr"], t.pos.step + 1


def _update(t: Trainer, found_inf: torch.Tensor | None = None) -> None:
    """The optimiser and schedule step. `found_inf` (() 1.0 = skip) is what fused AdamW
    reads from the optimiser to skip a non-finite update on the device."""
    if found_inf is not None:
        t.opt.found_inf = found_inf
    try:
        t.opt.step()
    finally:
        t.opt.__dict__.pop("found_inf", None)
    t.sched.step()
    t.opt.zero_grad(set_to_none=True)


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


def deferring(t: Trainer) -> bool:
    """defer_step_sync and every group fused: only fused AdamW takes `found_inf` and skips
    a non-finite update on the device, so the host need not have looked first."""
    return t.cfg.defer_step_sync and all(g.get("fused") for g in t.opt.param_groups)


class Steps:
    """The loop's step: `steps(batch)` runs one; `deliver()` hands the StepResults read so
    far to `report`; `settle()` also reads a step still in flight (before anything is
    logged, saved, exported or stopped). Default: `train_step`. Under `deferring` the values
    are read in the next step before its update, fused AdamW skipping a non-finite update
    on the device (`found_inf`) meanwhile (README.md, "The step's one host sync").
    """

    def __init__(self, t: Trainer, report: Callable[[StepResult], None]) -> None:
        self.t, self.report, self.defer = t, report, deferring(t)
        self.pending: _InFlight | None = None
        self.read: list[StepResult] = []

    def __call__(self, batch: Batch) -> None:
        t = self.t
        if not self.defer:
            self.read.append(train_step(t, batch))
            return
        stats, names, lr, step = _forward_backward(t, batch)
        flight = _InFlight.send(step, names, stats, lr, t.pos)
        try:
            self._read_pending()  # the previous step: raises before this step's update
        except NonFiniteError:
            t.opt.zero_grad(set_to_none=True)
            raise
        _update(t, found_inf=(~torch.isfinite(stats).all()).float())  # () 1.0: skip
        self.pending = flight

    def deliver(self) -> None:
        read, self.read = self.read, []
        for res in read:
            self.report(res)

    def settle(self) -> None:
        """Read the step still in flight, if any, and deliver. Raises NonFiniteError for it,
        with the position (and the monitor's step) set back: that step made no update."""
        self._read_pending()
        self.deliver()

    def _read_pending(self) -> None:
        flight, self.pending = self.pending, None
        if flight is None:
            return
        try:
            self.read.append(flight.read())
        except NonFiniteError:
            self.t.pos = flight.before
            self.t.monitor.step = flight.before.step
            raise


@dataclass
class _InFlight:
    """A step whose values (V,) are still on their way to the host (defer_step_sync)."""

    step: int
    names: tuple[str, ...]
    host: torch.Tensor  # (V,) pinned on CUDA, filled by a non_blocking copy
    copied: torch.cuda.Event | None  # recorded after that copy; None on CPU (nothing queued)
    lr: float
    before: Position  # where training stood before this step (restored if it was non-finite)

    @classmethod
    def send(cls, step: int, names: tuple[str, ...], stats: torch.Tensor, lr: float,
             before: Position) -> _InFlight:
        """Start the copy of stats (V,) to the host without waiting for it."""
        if not stats.is_cuda:
            return cls(step, names, stats.clone(), None, lr, before)
        host = torch.empty(stats.shape, dtype=stats.dtype, pin_memory=True)
        host.copy_(stats, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return cls(step, names, host, copied, lr, before)

    def read(self) -> StepResult:
        """The step's one host sync, one step late: waits for this step's copy only."""
        if self.copied is not None:
            self.copied.synchronize()
        return _checked(self.step, self.names, self.host.tolist(), self.lr)
