"""The optimisation loop: data order, optimiser, schedule, one step, stop signals.

No model math lives here (that is aleph.model); this file decides which rows each step
sees, how the update is made, and when the loop stops.
"""

from __future__ import annotations

import math
import os
import signal
import threading
from dataclasses import dataclass

import numpy as np
import torch

from aleph.errors import AlephError, ConfigError
from aleph.model.objective import distill_loss
from aleph.train.config import TrainConfig
from aleph.train.distributed import World


class NonFiniteError(AlephError):
    """Loss or gradient norm became NaN/Inf; the optimiser step was not taken."""


# --- data order ------------------------------------------------------------------------

class DataOrder:
    """Row order of every epoch: a permutation derived from (seed, epoch) only.

    Because it is a pure function, the resume state needs only (epoch, batch index): the
    permutation is recomputed, never stored. Each global batch is a contiguous slice of
    the permutation; rank r takes the r-th contiguous part of that slice.
    """

    def __init__(self, seed: int, rows: int, global_batch: int) -> None:
        self.seed, self.rows, self.global_batch = seed, rows, global_batch
        # Drop the last incomplete batch: every step has the full global batch, so the
        # InfoNCE negatives and the per-rank split are the same at every step.
        self.steps_per_epoch = rows // global_batch
        if self.steps_per_epoch == 0:
            raise ConfigError(f"config field 'batch_size': {global_batch} exceeds the {rows} rows "
                              "of the data; lower batch_size")
        self._epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._epoch, self._perm = epoch, rng.permutation(self.rows)
        return self._perm

    def indices(self, epoch: int, batch: int, world: World) -> np.ndarray:
        """Rows of global batch `batch` of `epoch` that this rank encodes, (B / W,)."""
        start = batch * self.global_batch
        local = self.global_batch // world.size
        lo = start + world.rank * local
        return self.permutation(epoch)[lo:lo + local]


# --- optimiser and schedule --------------------------------------------------------------

def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; matrices decay, vectors (norms, biases, gates) do not (as nanoGPT)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    other = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine to min_ratio at `total` (step counts from 0)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    span = max(total - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_scheduler(opt, cfg: TrainConfig, total_steps: int):
    warmup = min(cfg.warmup_steps, total_steps)
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, warmup, total_steps, cfg.min_lr_ratio))


# --- one step ------------------------------------------------------------------------------

@dataclass
class StepResult:
    loss: float
    nce: float
    mse: float
    grad_norm: float
    lr: float


def train_step(model, opt, sched, ids, mask, target, cfg: TrainConfig, world: World,
               step: int, device: torch.device) -> StepResult:
    """Forward on this rank's rows, loss over the global batch, checked update."""
    use_bf16 = device.type == "cuda" and cfg.bf16
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
        student = model(ids, mask)  # (b, D) with b = B / W
    student = world.gather_with_grad(student.float())  # (B, D), rank order = batch order
    target = world.gather(target)  # (B, D)
    loss, parts = distill_loss(student, target, cfg.tau, cfg.w_nce, cfg.w_mse)
    value = loss.item()
    if not math.isfinite(value):
        raise NonFiniteError(f"step {step + 1}: loss is {value} (nce {parts['nce'].item()}, mse "
                             f"{parts['mse'].item()}); no update was made, the last resume state is intact")
    loss.backward()
    clip = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()
    if not math.isfinite(norm):
        raise NonFiniteError(f"step {step + 1}: gradient norm is {norm} (loss {value}); no update "
                             "was made, the last resume state is intact")
    lr = opt.param_groups[0]["lr"]
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return StepResult(value, parts["nce"].item(), parts["mse"].item(), norm, lr)


# --- stop signals -----------------------------------------------------------------------

class StopFlag:
    """SIGTERM/SIGINT set a flag; the loop finishes the step, saves, and exits 0.

    `docker compose stop` sends SIGTERM; torchrun forwards it to every rank. A second
    signal restores the default handler, so a user can still force the stop.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signame = ""
        self._old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signame = signal.Signals(signum).name
        self.event.set()
        signal.signal(signum, self._old.get(signum, signal.SIG_DFL))

    def is_set(self) -> bool:
        return self.event.is_set()

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


PAUSE_ENV = "ALEPH_TRAIN_PAUSE_AFTER_STEP"


def pause_step() -> int | None:
    """Test hook: after this step (and its checkpoint) the loop waits until signalled.

    Lets tests kill (SIGKILL) or stop (SIGTERM) a real run at a known step without races.
    """
    value = os.environ.get(PAUSE_ENV)
    return int(value) if value else None
