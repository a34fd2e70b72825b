"""The step loop of a launch and its outputs: scalars, progress, resume states, weights."""

from __future__ import annotations

import time

import torch

from aleph.errors import AlephError
from aleph.model.io import save_weights
from aleph.train import checkpoint as ckpt
from aleph.train import loop, outputs, prefetch
from aleph.train.config import to_dict


class Reporter:
    """Rank 0's TensorBoard scalars, metrics.json and console progress line."""

    def __init__(self, s, start_step: int) -> None:
        self.s = s
        self.scalars = outputs.Scalars(s.run_dir, start_step + 1) if s.world.is_main else None
        self.t0 = time.monotonic()
        self.start_step = start_step
        self.last_t, self.last_step = self.t0, start_step
        self.last_progress = 0.0
        self.previous = read_metrics(s.run_dir) if s.world.is_main else {}
        self.first_loss = self.previous.get("first_loss")
        self.result: loop.StepResult | None = None

    def after_step(self, step: int, res: loop.StepResult) -> None:
        if not self.s.world.is_main:
            return
        self.result = res
        if self.first_loss is None:
            self.first_loss = res.loss
        cfg = self.s.cfg
        now = time.monotonic()
        if step % cfg.log_every_steps == 0 or step == self.s.total_steps:
            rate = (step - self.last_step) * cfg.batch_size / max(now - self.last_t, 1e-9)
            values = {"train/loss": res.loss, "train/nce": res.nce, "train/mse": res.mse,
                      "train/lr": res.lr, "train/grad_norm": res.grad_norm,
                      "train/samples_per_sec": rate}
            plain = getattr(self.s.model, "_orig_mod", self.s.model)
            values.update({f"health/{k}": v for k, v in plain.health().items()})
            self.scalars.write(step, values)
            self.last_t, self.last_step = now, step
            self.write_metrics(step)
        if now - self.last_progress >= cfg.progress_every_seconds or step == self.s.total_steps:
            self.last_progress = now
            self.s.log(self.progress_line(step, res, now))

    def progress_line(self, step: int, res: loop.StepResult, now: float) -> str:
        total, done = self.s.total_steps, step - self.start_step
        rate = done / max(now - self.t0, 1e-9)  # steps per second this launch
        eta = (total - step) / rate if rate > 0 else 0.0
        epoch = self.s.pos.samples_seen / (self.s.order.steps_per_epoch * self.s.cfg.batch_size)
        return (f"step {step}/{total} ({100 * step / total:.0f}%) epoch {epoch:.2f}/"
                f"{self.s.cfg.epochs} loss {res.loss:.4f} (nce {res.nce:.4f} mse {res.mse:.6f}) "
                f"lr {res.lr:.3g} {rate * self.s.cfg.batch_size:.0f} samples/s "
                f"ETA {fmt_duration(eta)}")

    def write_metrics(self, step: int) -> None:
        """metrics.json: wall_time_s = training seconds over all launches (setup excluded);
        samples_per_sec = this launch's average; final = the last step's values."""
        s, res = self.s, self.result
        launch_s = time.monotonic() - self.t0
        done = (step - self.start_step) * s.cfg.batch_size
        outputs.write_metrics(s.run_dir, {
            "run_id": s.run_dir.name, "step": step, "total_steps": s.total_steps,
            "samples_seen": s.pos.samples_seen, "rows": s.tokens.rows,
            "epochs_done": s.pos.samples_seen / (s.order.steps_per_epoch * s.cfg.batch_size),
            "epochs": s.cfg.epochs, "wall_time_s": s.pos.train_seconds,
            "launch_wall_time_s": launch_s, "samples_per_sec": done / max(launch_s, 1e-9),
            "world_size": s.world.size, "first_loss": self.first_loss,
            "final": None if res is None else {"loss": res.loss, "nce": res.nce, "mse": res.mse,
                                               "grad_norm": res.grad_norm, "lr": res.lr}})

    def close(self) -> None:
        if self.scalars is not None:
            self.scalars.close()


def fmt_duration(seconds: float) -> str:
    """'1d 02:03:04' style (E1 runs for days; a plain %H:%M:%S would wrap at 24 h)."""
    total = int(round(seconds))
    days, rest = divmod(total, 86400)
    hms = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}d {hms}" if days else hms


def read_metrics(run_dir) -> dict:
    from aleph._io import read_json

    path = run_dir / outputs.METRICS
    try:
        return read_json(path) if path.is_file() else {}
    except ValueError:  # atomic writes make this a hand edit; start the carry-over afresh
        return {}


def advance(pos: ckpt.Position, steps_per_epoch: int, batch: int, seconds: float) -> ckpt.Position:
    nxt = pos.batch_in_epoch + 1
    epoch, nxt = (pos.epoch + 1, 0) if nxt == steps_per_epoch else (pos.epoch, nxt)
    return ckpt.Position(pos.step + 1, epoch, nxt, pos.samples_seen + batch, seconds)


def save_state(s) -> None:
    """Collective: every rank contributes its RNG state; rank 0 writes."""
    rngs = s.world.gather_objects(ckpt.rng_state(s.device))
    if s.world.is_main:
        path = ckpt.save(s.run_dir, s.model, s.opt, s.sched, s.pos, rngs,
                         _config_sha(s), s.cfg.keep_checkpoints)
        s.log(f"resume state saved: {path.relative_to(s.run_dir)} (step {s.pos.step}, "
              f"samples {s.pos.samples_seen})")
        if getattr(s, "syncer", None) is not None:  # a complete state: sync if due (background)
            s.syncer.saved(s.pos.step)


def _config_sha(s) -> str:
    from aleph._io import sha256_json

    return sha256_json(to_dict(s.cfg))


# The executed-code tracer (aleph.record.fingerprint) covers the CLI, preflight and this
# many steps, then only the loop's rare events (logging, saves, stop, the end).
TRACED_STEPS = 2


def fit(s) -> tuple[str, str]:
    """Run steps until the end, a stop signal, or an error; returns (status, note)."""
    stop = s.stop
    stop.set_mode("flag")  # from the first step on: finish the step, save, then stop
    s.monitor.step_from = s.monitor.step = s.pos.step
    s.monitor.phase = "training"
    if s.manifest is not None:
        s.manifest.record(steps={"from": s.pos.step, "to": s.pos.step})
    if s.pos.step >= s.total_steps:
        s.log(f"run already complete at step {s.pos.step}; nothing to train")
        finish(s, None)
        return "complete", outputs.NOTHING_TO_TRAIN
    rep, clock = Reporter(s, s.pos.step), Clock(s.pos.train_seconds)
    pause = loop.pause_step()
    traced_until = s.pos.step + TRACED_STEPS
    s.net.train()
    batches = None
    try:
        batches = start_prefetch(s)
        while s.pos.step < s.total_steps:
            res = one_step(s, batches)
            s.pos = advance(s.pos, s.order.steps_per_epoch, s.cfg.batch_size, clock.train_seconds())
            s.monitor.step = s.pos.step
            if s.pos.step == traced_until:
                close_trace_window(s)
            with s.tracer.during():  # the rare events: logging, saves, stop
                rep.after_step(s.pos.step, res)
                saved, stopping = after_step_saves(s, stop, clock)
            if pause is not None and s.pos.step == pause:
                wait_for_signal(s, stop, rep, batches)
                stopping = s.world.any_flag(stop.is_set())[0]
            if stopping and s.pos.step < s.total_steps:
                with s.tracer.during():
                    if not saved:
                        save_state(s)
                    if s.world.is_main:
                        rep.write_metrics(s.pos.step)
                who = stop.signame or "a signal on another rank"
                s.log(f"stopped by {who} after step {s.pos.step}; resume state saved; "
                      "a restart resumes from it")
                return "stopped", f"{stop.signame or 'signal'} after step {s.pos.step}"
        with s.tracer.during():
            finish(s, rep)
        return "complete", f"{s.pos.step} steps"
    finally:
        if batches is not None:
            batches.close()
        rep.close()  # the stop handlers are restored by run.train(), which installed them


def close_trace_window(s) -> None:
    """End the traced window after the first steps and record what ran so far (rewritten
    with the later rare events when the launch ends)."""
    s.tracer.close_window(f"from the CLI through step {s.pos.step}, then logging, resume "
                          "states, weights, stop and the end of the launch")
    if s.manifest is not None:
        outputs.write_executed(s.manifest, s.tracer, s.launch_id)


AGREE_EVERY_STEPS = 16
"""Under DDP, steps between the ranks' agreements on stopping and on the timed save."""


class Clock:
    """Training seconds over all launches, and the time of the last resume state."""

    def __init__(self, base_seconds: float) -> None:
        self.base, self.t0 = base_seconds, time.monotonic()
        self.last_save = self.t0

    def train_seconds(self) -> float:
        return self.base + time.monotonic() - self.t0

    def minutes_since_save(self) -> float:
        return (time.monotonic() - self.last_save) / 60


def after_step_saves(s, stop: loop.StopFlag, clock: Clock) -> tuple[bool, bool]:
    """Resume state and periodic weights on their cadences; returns (saved, stop requested).

    Ranks agree on the time-based save and on stopping (one tiny all-reduce), since the
    clocks and the signal arrival differ per process and the save is a collective. Reading
    the agreed flags is a host sync, so under DDP they are agreed every AGREE_EVERY_STEPS
    steps (and at step-cadence saves, which sync anyway): a stop or a timed save comes at
    most that many steps later (well under a second at E1's step times).
    """
    cfg, step = s.cfg, s.pos.step
    minutes_due = cfg.ckpt_every_minutes > 0 and clock.minutes_since_save() >= cfg.ckpt_every_minutes
    step_due = cfg.ckpt_every_steps > 0 and step % cfg.ckpt_every_steps == 0
    time_due = stopping = False
    if not s.world.distributed or step_due or step % AGREE_EVERY_STEPS == 0:
        time_due, stopping = s.world.any_flag(minutes_due, stop.is_set())
    saved = False
    if (step_due or time_due) and step < s.total_steps:  # the last step is saved by finish()
        save_state(s)
        saved, clock.last_save = True, time.monotonic()
    if (s.world.is_main and cfg.weights_every_steps and step < s.total_steps
            and step % cfg.weights_every_steps == 0):  # the last step is weights/final
        save_weights(s.model, s.run_dir / "weights" / f"step-{step:08d}")
    return saved, stopping


def one_step(s, batches: prefetch.Prefetcher) -> loop.StepResult:
    ids, mask, target = batches.take(s.pos.epoch, s.pos.batch_in_epoch, s.pos.step)
    s.model.set_gauges((n := s.pos.step + 1) % s.cfg.log_every_steps == 0 or n == s.total_steps)
    return loop.train_step(s.net, s.opt, s.sched, ids, mask, target, s.cfg, s.world,
                           s.pos.step, s.device)


def start_prefetch(s) -> prefetch.Prefetcher:
    """The batch prefetcher of this launch; the local rank 0 also warms the target store."""
    if s.world.local_rank == 0:
        headroom = int(s.cfg.store_headroom_gib * (1 << 30))
        try:
            s.log(prefetch.warm_target_store(s.targets, s.sources.targets, headroom))
        except (AlephError, OSError) as e:  # a hint: the gathers read the store anyway
            s.log(f"target store prefault: skipped ({e})")
    source = prefetch.BatchSource(s.tokens, s.targets, s.order, s.world, s.device, s.cfg.compile)
    return prefetch.Prefetcher(source, s.total_steps)


def wait_for_signal(s, stop: loop.StopFlag, rep: Reporter, batches: prefetch.Prefetcher) -> None:
    """The pause hook: flush everything first, so the paused run's files are at rest."""
    if rep.scalars is not None:
        rep.scalars.flush()
    ahead = batches.ahead
    what = f"epoch {ahead[0]} batch {ahead[1]}" if ahead else "none"
    s.log(f"pause hook: paused after step {s.pos.step} ({loop.PAUSE_ENV}); batch gathered "
          f"ahead: {what}; waiting for a signal")
    while not stop.is_set():
        time.sleep(0.05)


def finish(s, rep: Reporter | None) -> None:
    """Final resume state, final weights, metrics (rank 0 writes; all ranks join collectives)."""
    done = ckpt.latest(s.run_dir) if s.world.is_main else None
    have = s.world.broadcast_object(done is not None and done[1]["step"] == s.pos.step)
    if not have:
        save_state(s)
    if s.world.is_main:
        final = s.run_dir / "weights" / "final"
        save_weights(s.model, final)
        if rep is not None:
            rep.write_metrics(s.pos.step)
        s.log(f"final weights: {final.relative_to(s.run_dir)}; {s.pos.step} steps, "
              f"{s.pos.samples_seen} samples, {s.pos.train_seconds:.1f} s training")
    if s.device.type == "cuda":
        torch.cuda.synchronize()
