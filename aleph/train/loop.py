"""The optimisation loop: data order, optimiser, schedule, one step, stop signals.

No model math lives here (that is aleph.model); this file decides which rows each step
sees, how the update is made, and when the loop stops.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from aleph.errors import ConfigError, NonFiniteError
from aleph.model.objective import distill_loss
from aleph.train.config import TrainConfig
from aleph.train.distributed import World

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

NO_DECAY_SUFFIXES = ("address.anchors",)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; matrices decay, vectors (norms, biases, gates) do not (as nanoGPT).

    a1's anchors do not decay either: they are normalised before use, so decay would only
    shrink their length and thereby speed up the drift of their direction, a push a3's
    frozen anchors never get; a1 vs a3 must differ only in what the loss moves.

    On CUDA the fused kernel (one launch for all parameters, step counters on the device,
    no host read of them); on CPU the default single-tensor path, whose results the
    bitwise resume tests pin (fused=True on CPU is a different kernel in torch 2.4).
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if p.ndim >= 2 and not n.endswith(NO_DECAY_SUFFIXES)]
    other = [p for n, p in named if p.ndim < 2 or n.endswith(NO_DECAY_SUFFIXES)]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": other, "weight_decay": 0.0}]
    cuda = all(p.is_cuda for _, p in named) and bool(named)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                             fused=True if cuda else None)


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
    """Forward on this rank's rows, loss over the global batch, checked update.

    One host synchronisation per step: loss, its parts and the clipped gradient norm come
    to the host in one stacked `.tolist()` after clipping (each `.item()` would drain the
    GPU queue and leave the accelerator idle while the host catches up). A non-finite
    loss makes the gradient norm non-finite too, so the single check still comes before
    `opt.step()`: no update is made on NaN/inf. No cross-rank flag is needed under DDP:
    the loss is computed from the all-gathered global batch and the norm from the
    all-reduced gradients, so every rank sees the same values and raises together.
    """
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
        raise NonFiniteError(_nonfinite_message(step, value, nce, mse, grad_norm))
    lr = opt.param_groups[0]["lr"]
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return StepResult(value, nce, mse, grad_norm, lr)


def _nonfinite_message(step: int, loss: float, nce: float, mse: float, norm: float) -> str:
    """Names the first non-finite value: the loss, else the gradient norm."""
    intact = "no update was made, the last resume state is intact"
    if not math.isfinite(loss):
        return f"step {step + 1}: loss is {loss} (nce {nce}, mse {mse}); {intact}"
    return f"step {step + 1}: gradient norm is {norm} (loss {loss}); {intact}"


# --- batch length under torch.compile ------------------------------------------------------

LENGTH_MULTIPLE = 16
"""Compiled batches are padded to a multiple of this (at most max_len)."""


def bucket_width(width: int, max_len: int) -> int:
    """The compiled batch width for a batch whose longest row is `width` tokens.

    Why buckets of 16 and not max_len always (bench/bench_lengths.py, CPU, torch 2.4.1): on
    the smoke captions (synthetic, 4,096 rows, max_len 32, batch 32; no real caption set is
    available offline) padding every batch to max_len left 64.6% of the token slots padding,
    buckets of 16 left 29.1% (trimming to the longest row: 26.4%), and aot_eager built 1
    graph for either (2 for trimmed widths: automatic dynamic shapes make L symbolic after
    the first recompile, so widths never reach the recompile limit). With long captions
    (CC12M's average ~580 characters, beyond 128 tokens) nearly every batch has a row at
    max_len, so a bucket is max_len and nothing changes; with shorter ones the bucket saves
    the padded compute. Multiples of 16 keep attention masks aligned for fused kernels.
    """
    return min(-(-width // LENGTH_MULTIPLE) * LENGTH_MULTIPLE, max_len)


def fixed_length(ids: torch.Tensor, mask: torch.Tensor, length: int,
                 pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad a (B, L') batch to (B, length) with pad_id / False (L' <= length).

    Used when the model is compiled, with length = bucket_width(L', max_len):
    `TokenStore.gather` trims each batch to its longest row, and every new L' could make
    dynamo recompile; a few bucket widths bound the shapes it sees. The padded slots are
    masked out exactly like the store's own padding.
    """
    width = ids.shape[1]
    if width > length:
        raise ValueError(f"batch length {width} exceeds max_len {length}")
    if width == length:
        return ids, mask
    extra = length - width
    return (torch.nn.functional.pad(ids, (0, extra), value=pad_id),
            torch.nn.functional.pad(mask, (0, extra), value=False))


# --- stop signals -----------------------------------------------------------------------

class StopRequested(BaseException):
    """A stop signal arrived during preflight (before the first step): the launch ends, exit 0.

    A BaseException (like KeyboardInterrupt) so no `except Exception` in a store build
    swallows it. Every build it can interrupt writes to a temporary sibling (or a resumable
    partial file) and marks completion last, so nothing it leaves counts as complete.
    """

    def __init__(self, signame: str) -> None:
        super().__init__(f"stopped by {signame} before the first step")
        self.signame = signame


class StopFlag:
    """SIGTERM/SIGINT handling of one launch, installed as soon as the run lock is held.

    Two modes. 'interrupt' (preflight: store builds, model build, resume load): the
    handler raises StopRequested at once, so a long store build does not outlive
    `docker compose stop`'s grace period. 'flag' (the step loop, and the short stretch
    before the launch is in the manifest): the handler only sets a flag; the loop finishes
    the step, saves, and exits 0. `docker compose stop` sends SIGTERM; torchrun forwards it
    to every rank. The first signal restores the previous handler, so a second one still
    forces the stop.
    """

    def __init__(self, mode: str = "flag") -> None:
        self.event = threading.Event()
        self.signame = ""
        self.mode = "flag"
        self._old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)
        self.set_mode(mode)

    def _handle(self, signum, frame) -> None:
        self.signame = signal.Signals(signum).name
        self.event.set()
        signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
        if self.mode == "interrupt":
            raise StopRequested(self.signame)

    def set_mode(self, mode: str) -> None:
        """Switch mode; entering 'interrupt' with a signal already received raises now."""
        if mode not in ("flag", "interrupt"):
            raise ValueError(f"StopFlag mode {mode!r}: expected 'flag' or 'interrupt'")
        self.mode = mode
        if mode == "interrupt" and self.event.is_set():
            raise StopRequested(self.signame)

    def is_set(self) -> bool:
        return self.event.is_set()

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


PAUSE_ENV = "ALEPH_TRAIN_PAUSE_AFTER_STEP"
PREFLIGHT_PAUSE_ENV = "ALEPH_TRAIN_PAUSE_IN_PREFLIGHT"
PREFLIGHT_PHASES = ("targets", "tokens", "model")


def pause_step() -> int | None:
    """Test hook: after this step (and its checkpoint) the loop waits until signalled.

    Lets tests kill (SIGKILL) or stop (SIGTERM) a real run at a known step without races.
    """
    value = os.environ.get(PAUSE_ENV)
    return int(value) if value else None


def preflight_pause(phase: str, log, stop: StopFlag) -> None:
    """Test hook: with ALEPH_TRAIN_PAUSE_IN_PREFLIGHT=<phase>, wait before that phase.

    Phases: targets (target store), tokens (token store), model (build and resume load).
    The stop handlers are in 'interrupt' mode there, so the awaited signal ends the wait
    by raising StopRequested from the handler, as it would in the middle of a build.
    """
    want = os.environ.get(PREFLIGHT_PAUSE_ENV)
    if want and want not in PREFLIGHT_PHASES:
        raise ConfigError(f"environment variable {PREFLIGHT_PAUSE_ENV}={want!r}: expected one "
                          f"of {', '.join(PREFLIGHT_PHASES)}")
    if want != phase:
        return
    log(f"pause hook: paused in preflight before {phase} ({PREFLIGHT_PAUSE_ENV}); "
        "waiting for a signal")
    while not stop.is_set():
        time.sleep(0.05)
    raise StopRequested(stop.signame)  # reached only if the flag was set in 'flag' mode
