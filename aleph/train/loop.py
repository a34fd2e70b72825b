"""The training loop of a launch: steps until the end or a stop, and what happens between them.

    train_loop(t)
      while t.pos.step < t.total_steps:
        batch = batches.take(...)           # gathered while the previous step ran (prefetch.py)
        res = train_step(t, batch)          # forward, loss, checked update (step.py)
        t.pos = advance(...)                # the data position a resume state records
        between.after_step(res)             # progress, resume states, weights, stop (below)
      between.finish()                      # final resume state, weights/final, metrics

`Between` is the rest, called once per step: the logging and saving cadences, the pause
hook, the stop (SIGTERM/SIGINT: save, exit 76) and the executed-code tracer's window.
"""

from __future__ import annotations

import time

import torch

from aleph._io import sha256_json
from aleph.errors import AlephError
from aleph.model.io import save_weights
from aleph.record.launch import NOTHING_TO_TRAIN
from aleph.record.layout import RunLayout
from aleph.train import checkpoint as ckpt
from aleph.train import outputs, prefetch
from aleph.train.config import to_dict
from aleph.train.progress import Reporter
from aleph.train.signals import PAUSE_ENV, StopFlag, pause_step
from aleph.train.step import StepResult, advance, train_step
from aleph.train.trainer import Trainer

TRACED_STEPS = 2  # the executed-code tracer's first window ends after this many steps
AGREE_EVERY_STEPS = 16  # under DDP, steps between the ranks' agreements on stop and timed save


def train_loop(t: Trainer) -> tuple[str, str]:
    """Run steps until the end, a stop signal, or an error; returns (status, note)."""
    t.stop.set_mode("flag")  # from the first step on: finish the step, save, then stop
    t.monitor.step_from = t.monitor.step = t.pos.step
    t.monitor.phase = "training"
    if t.manifest is not None:
        t.manifest.record(steps={"from": t.pos.step, "to": t.pos.step})
    if t.pos.step >= t.total_steps:
        t.log(f"run already complete at step {t.pos.step}; nothing to train")
        finish(t, None)
        return "complete", NOTHING_TO_TRAIN
    rep, batches = Reporter(t, t.pos.step), None
    try:
        batches = start_prefetch(t)
        between = Between(t, rep, batches)
        t.net.train()
        while t.pos.step < t.total_steps:
            between.before_step()
            res = train_step(t, batches.take(t.pos.epoch, t.pos.batch_in_epoch, t.pos.step))
            t.pos = advance(t.pos, t.order, between.clock.train_seconds())
            stopped = between.after_step(res)
            if stopped:
                return "stopped", stopped
        between.finish()
        return "complete", f"{t.pos.step} steps"
    finally:
        if batches is not None:
            batches.close()
        rep.close()  # the stop handlers are restored by run.train(), which installed them


class Between:
    """What happens between two steps: gauges on logged steps, the cadences, pause hook and
    stop, the executed-code tracer's window."""

    def __init__(self, t: Trainer, rep: Reporter, batches: prefetch.Prefetcher) -> None:
        self.t, self.rep, self.batches = t, rep, batches
        self.clock = Clock(t.pos.train_seconds)
        self.pause = pause_step()
        self.traced_until = t.pos.step + TRACED_STEPS

    def before_step(self) -> None:
        """The bank's health gauges are recorded only on a step that logs."""
        n = self.t.pos.step + 1
        self.t.model.set_gauges(n % self.t.cfg.log_every_steps == 0 or n == self.t.total_steps)

    def after_step(self, res: StepResult) -> str | None:
        """Progress, resume states and weights on their cadences, the pause hook, a stop;
        returns the stop's note when the launch stops here (state saved), else None."""
        t, stop = self.t, self.t.stop
        t.monitor.step = t.pos.step
        if t.pos.step == self.traced_until:
            close_trace_window(t)
        with t.tracer.during():  # the rare events: logging, saves, stop
            self.rep.after_step(res)  # now that the position is past the step
            saved, stopping = after_step(t, stop, self.clock)
        if self.pause is not None and t.pos.step == self.pause:
            wait_for_signal(t, stop, self.rep, self.batches)
            stopping = t.world.any_flag(stop.is_set())[0]
        if not stopping or t.pos.step >= t.total_steps:
            return None
        with t.tracer.during():
            if not saved:
                save_state(t)
            if t.world.is_main:
                self.rep.write_metrics(t.pos.step)
        who = stop.signame or "a signal on another rank"
        t.log(f"stopped by {who} after step {t.pos.step}; resume state saved; "
              "a restart resumes from it")
        return f"{stop.signame or 'signal'} after step {t.pos.step}"

    def finish(self) -> None:
        with self.t.tracer.during():
            finish(self.t, self.rep)


class Clock:
    """Training seconds over all launches, and the time of the last resume state."""

    def __init__(self, base_seconds: float) -> None:
        self.base, self.t0 = base_seconds, time.monotonic()
        self.last_save = self.t0

    def train_seconds(self) -> float:
        return self.base + time.monotonic() - self.t0

    def minutes_since_save(self) -> float:
        return (time.monotonic() - self.last_save) / 60


def after_step(t: Trainer, stop: StopFlag, clock: Clock) -> tuple[bool, bool]:
    """Resume state and periodic weights on their cadences; returns (saved, stop requested).
    Ranks agree on the timed save and the stop (clocks and signals differ per process; the
    save is a collective) in one all-reduce, a host sync: under DDP every AGREE_EVERY_STEPS
    steps and at step-cadence saves."""
    cfg, step, last = t.cfg, t.pos.step, t.pos.step >= t.total_steps
    minutes_due = cfg.ckpt_every_minutes > 0 and clock.minutes_since_save() >= cfg.ckpt_every_minutes
    step_due = cfg.ckpt_every_steps > 0 and step % cfg.ckpt_every_steps == 0
    time_due = stopping = False
    if not t.world.distributed or step_due or step % AGREE_EVERY_STEPS == 0:
        time_due, stopping = t.world.any_flag(minutes_due, stop.is_set())
    save = (step_due or time_due) and not last  # the last step is saved by finish()
    weights = bool(cfg.weights_every_steps) and not last and step % cfg.weights_every_steps == 0
    if save:
        save_state(t)
        clock.last_save = time.monotonic()
    if weights and t.world.is_main:  # the last step is weights/final
        save_weights(t.model, RunLayout(t.run_dir).step_weights(step))
    return save, stopping


def save_state(t: Trainer) -> None:
    """Collective: every rank contributes its RNG state; rank 0 writes."""
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


def finish(t: Trainer, rep: Reporter | None) -> None:
    """Final resume state, final weights, metrics (rank 0 writes; all ranks join collectives)."""
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
    """End the first traced window and record what ran so far (rewritten at the end)."""
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


def wait_for_signal(t: Trainer, stop: StopFlag, rep: Reporter,
                    batches: prefetch.Prefetcher) -> None:
    """The pause hook: flush everything first, so the paused run's files are at rest."""
    if rep.scalars is not None:
        rep.scalars.flush()
    ahead = batches.ahead
    what = f"epoch {ahead[0]} batch {ahead[1]}" if ahead else "none"
    t.log(f"pause hook: paused after step {t.pos.step} ({PAUSE_ENV}); batch gathered "
          f"ahead: {what}; waiting for a signal")
    while not stop.is_set():
        time.sleep(0.05)
