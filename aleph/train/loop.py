"""The training loop of a launch: steps until the end or a stop, and what happens between steps.

    train_loop(t)
      while t.pos.step < t.total_steps:
        batch = prefetcher.take(...)        # gathered while the previous step ran (prefetch.py)
        train_step(t, batch)                # forward, loss, checked update (step.py)
                                            # (defer_step_sync: returns the step before)
        t.pos = advance(...)                # the data position a resume state records
        progress, resume states, weights    # on their cadences (after_step)
        stop?                               # SIGTERM/SIGINT: save, exit 76 (signals.py)
      finish(t)                             # final resume state, weights/final, metrics
"""

from __future__ import annotations

import time

import torch

from aleph._io import sha256_json
from aleph.errors import AlephError
from aleph.model.io import save_weights
from aleph.record.layout import RunLayout
from aleph.train import checkpoint as ckpt
from aleph.train import outputs, prefetch
from aleph.train.config import to_dict
from aleph.train.progress import Reporter
from aleph.train.signals import PAUSE_ENV, StopFlag, pause_step
from aleph.train.step import StepResult, advance, deferring, settle, train_step
from aleph.train.trainer import Trainer

# The executed-code tracer (aleph.record.fingerprint) covers the CLI, preflight and this
# many steps, then only the loop's rare events (logging, saves, stop, the end).
TRACED_STEPS = 2

AGREE_EVERY_STEPS = 16
"""Under DDP, steps between the ranks' agreements on stopping and on the timed save."""


def train_loop(t: Trainer) -> tuple[str, str]:
    """Run steps until the end, a stop signal, or an error; returns (status, note)."""
    stop = t.stop
    stop.set_mode("flag")  # from the first step on: finish the step, save, then stop
    t.monitor.step_from = t.monitor.step = t.pos.step
    t.monitor.phase = "training"
    if t.manifest is not None:
        t.manifest.record(steps={"from": t.pos.step, "to": t.pos.step})
    if t.pos.step >= t.total_steps:
        t.log(f"run already complete at step {t.pos.step}; nothing to train")
        finish(t, None)
        return "complete", outputs.NOTHING_TO_TRAIN
    if t.cfg.defer_step_sync:
        t.log("defer_step_sync: " + ("on: each step's loss and gradient norm are read during the next step"
                                     if deferring(t) else "no effect here: it needs fused AdamW (CUDA)"))
    rep, clock = Reporter(t, t.pos.step), Clock(t.pos.train_seconds)
    pause = pause_step()
    traced_until = t.pos.step + TRACED_STEPS
    t.net.train()
    batches = None
    try:
        batches = start_prefetch(t)
        while t.pos.step < t.total_steps:
            n = t.pos.step + 1  # the bank's health gauges only on the steps that log them
            logs = n % t.cfg.log_every_steps == 0 or n == t.total_steps
            t.model.set_gauges(logs)
            res = train_step(t, batches.take(t.pos.epoch, t.pos.batch_in_epoch, t.pos.step))
            t.pos = advance(t.pos, t.order.steps_per_epoch, t.cfg.batch_size, clock.train_seconds())
            t.monitor.step = t.pos.step
            if t.pos.step == traced_until:
                close_trace_window(t)
            with t.tracer.during():  # the rare events: logging, saves, stop
                now = settle(t) if logs else None  # deferred: a logged step is read at once
                report(rep, res, now)
                saved, stopping, late = after_step(t, stop, clock)
                report(rep, late)
            if pause is not None and t.pos.step == pause:
                wait_for_signal(t, stop, rep, batches)
                stopping = t.world.any_flag(stop.is_set())[0]
            if stopping and t.pos.step < t.total_steps:
                with t.tracer.during():
                    if not saved:
                        report(rep, save_state(t))
                    if t.world.is_main:
                        rep.write_metrics(t.pos.step)
                who = stop.signame or "a signal on another rank"
                t.log(f"stopped by {who} after step {t.pos.step}; resume state saved; "
                      "a restart resumes from it")
                return "stopped", f"{stop.signame or 'signal'} after step {t.pos.step}"
        with t.tracer.during():
            finish(t, rep)
        return "complete", f"{t.pos.step} steps"
    finally:
        if batches is not None:
            batches.close()
        rep.close()  # the stop handlers are restored by run.train(), which installed them


class Clock:
    """Training seconds over all launches, and the time of the last resume state."""

    def __init__(self, base_seconds: float) -> None:
        self.base, self.t0 = base_seconds, time.monotonic()
        self.last_save = self.t0

    def train_seconds(self) -> float:
        return self.base + time.monotonic() - self.t0

    def minutes_since_save(self) -> float:
        return (time.monotonic() - self.last_save) / 60


def report(rep: Reporter, *results: StepResult | None) -> None:
    """Hand the steps whose values are known to the reporter (None: nothing new yet)."""
    for res in results:
        if res is not None:
            rep.after_step(res.step, res)


def after_step(t: Trainer, stop: StopFlag, clock: Clock) -> tuple[bool, bool, StepResult | None]:
    """Resume state and periodic weights on their cadences; returns (saved, stop requested,
    the step a save read under defer_step_sync).

    Ranks agree on the time-based save and on stopping (one tiny all-reduce), since the
    clocks and the signal arrival differ per process and the save is a collective. Reading
    the agreed flags is a host sync, so under DDP they are agreed every AGREE_EVERY_STEPS
    steps (and at step-cadence saves, which sync anyway): a stop or a timed save comes at
    most that many steps later (well under a second at E1's step times).
    """
    cfg, step = t.cfg, t.pos.step
    minutes_due = cfg.ckpt_every_minutes > 0 and clock.minutes_since_save() >= cfg.ckpt_every_minutes
    step_due = cfg.ckpt_every_steps > 0 and step % cfg.ckpt_every_steps == 0
    time_due = stopping = False
    if not t.world.distributed or step_due or step % AGREE_EVERY_STEPS == 0:
        time_due, stopping = t.world.any_flag(minutes_due, stop.is_set())
    saved, late = False, None
    if (step_due or time_due) and step < t.total_steps:  # the last step is saved by finish()
        late = save_state(t)
        saved, clock.last_save = True, time.monotonic()
    if cfg.weights_every_steps and step < t.total_steps and step % cfg.weights_every_steps == 0:
        late = late or settle(t)  # a non-finite step in flight must not be exported
        if t.world.is_main:  # the last step is weights/final
            save_weights(t.model, RunLayout(t.run_dir).step_weights(step))
    return saved, stopping, late


def save_state(t: Trainer) -> StepResult | None:
    """Collective: every rank contributes its RNG state; rank 0 writes. First reads the
    step still in flight (defer_step_sync), so a non-finite one raises before any save;
    returns it."""
    late = settle(t)
    rngs = t.world.gather_objects(ckpt.rng_state(t.device))

    def save() -> None:
        path = ckpt.save(t.run_dir, t.model, t.opt, t.sched, t.pos, rngs,
                         sha256_json(to_dict(t.cfg)), t.cfg.keep_checkpoints)
        t.log(f"resume state saved: {path.relative_to(t.run_dir)} (step {t.pos.step}, "
              f"samples {t.pos.samples_seen})")
        if t.syncer is not None:  # a complete state: sync if due (background)
            t.syncer.saved(t.pos.step)

    # The others poll meanwhile: a save to a slow disk never trips the collective timeout.
    t.world.on_main(f"saving the resume state of step {t.pos.step}", save, t.log)
    return late


def finish(t: Trainer, rep: Reporter | None) -> None:
    """Final resume state, final weights, metrics (rank 0 writes; all ranks join collectives)."""
    late = settle(t)  # the loop reads the last step itself; this covers any other way here
    if rep is not None:
        report(rep, late)
    done = ckpt.latest(t.run_dir) if t.world.is_main else None
    have = t.world.broadcast_object(done is not None and done[1]["step"] == t.pos.step)
    if not have:
        save_state(t)
    if t.world.is_main:
        final = RunLayout(t.run_dir).final_weights
        save_weights(t.model, final)
        if rep is not None:
            rep.write_metrics(t.pos.step)
        t.log(f"final weights: {final.relative_to(t.run_dir)}; {t.pos.step} steps, "
              f"{t.pos.samples_seen} samples, {t.pos.train_seconds:.1f} s training")
    if t.device.type == "cuda":
        torch.cuda.synchronize()


def close_trace_window(t: Trainer) -> None:
    """End the traced window after the first steps and record what ran so far (rewritten
    with the later rare events when the launch ends)."""
    t.tracer.close_window(f"from the CLI through step {t.pos.step}, then logging, resume "
                          "states, weights, stop and the end of the launch")
    if t.manifest is not None:
        outputs.write_executed(t.manifest, t.tracer, t.launch_id)


def start_prefetch(t: Trainer) -> prefetch.Prefetcher:
    """The batch prefetcher of this launch; the local rank 0 also warms the target store."""
    if t.world.local_rank == 0:
        headroom = int(t.cfg.store_headroom_gib * (1 << 30))
        try:
            t.log(prefetch.warm_target_store(t.targets, t.sources.targets, headroom))
        except (AlephError, OSError) as e:  # a hint: the gathers read the store anyway
            t.log(f"target store prefault: skipped ({e})")
    t.world.barrier("the target store prefault", t.log)  # minutes at E1's size: poll for it
    source = prefetch.BatchSource(t.tokens, t.targets, t.order, t.world, t.device, t.cfg.compile)
    return prefetch.Prefetcher(source, t.total_steps)


def wait_for_signal(t: Trainer, stop: StopFlag, rep: Reporter, batches: prefetch.Prefetcher) -> None:
    """The pause hook: flush everything first, so the paused run's files are at rest."""
    report(rep, settle(t))  # the paused step's values, deferred or not, are on record
    if rep.scalars is not None:
        rep.scalars.flush()
    ahead = batches.ahead
    what = f"epoch {ahead[0]} batch {ahead[1]}" if ahead else "none"
    t.log(f"pause hook: paused after step {t.pos.step} ({PAUSE_ENV}); batch gathered "
          f"ahead: {what}; waiting for a signal")
    while not stop.is_set():
        time.sleep(0.05)
