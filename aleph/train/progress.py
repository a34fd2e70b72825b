"""Rank 0's view of the loop: TensorBoard scalars, metrics.json and the console progress line."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from aleph._io import atomic_write_json, read_json
from aleph.record.layout import RunLayout
from aleph.train import outputs
from aleph.train.identity import utc_now
from aleph.train.step import StepResult

if TYPE_CHECKING:
    from aleph.train.trainer import Trainer


class Reporter:
    """Rank 0's TensorBoard scalars, metrics.json and console progress line: every value of a
    StepResult under its own name, so a new loss term shows up in all three."""

    def __init__(self, t: Trainer, start_step: int) -> None:
        self.t = t
        self.scalars = outputs.Scalars(t.run_dir, start_step + 1) if t.world.is_main else None
        self.t0, self.start_step, self.last_progress = time.monotonic(), start_step, 0.0
        self.last_t, self.last_step = self.t0, start_step
        self.previous = read_metrics(t.run_dir) if t.world.is_main else {}
        self.first_loss = self.previous.get("first_loss")
        self.result: StepResult | None = None

    def after_step(self, res: StepResult) -> None:
        """A step's values: scalars and metrics on logged steps, the progress line on its cadence."""
        if not self.t.world.is_main:
            return
        self.result, step = res, res.step
        self.first_loss = res.loss if self.first_loss is None else self.first_loss
        cfg, now = self.t.cfg, time.monotonic()
        if step % cfg.log_every_steps == 0 or step == self.t.total_steps:
            rate = (step - self.last_step) * cfg.batch_size / max(now - self.last_t, 1e-9)
            values = {f"train/{k}": v for k, v in res.values.items()}
            values.update({"train/lr": res.lr, "train/samples_per_sec": rate})
            values.update({f"health/{k}": v for k, v in self.t.model.health().items()})
            self.scalars.write(step, values)
            self.last_t, self.last_step = now, step
            self.write_metrics(step)
        if now - self.last_progress >= cfg.progress_every_seconds or step == self.t.total_steps:
            self.last_progress = now
            self.t.log(self.progress_line(step, res, now))

    def progress_line(self, step: int, res: StepResult, now: float) -> str:
        t, total, done = self.t, self.t.total_steps, step - self.start_step
        rate = done / max(now - self.t0, 1e-9)  # steps per second this launch
        eta = (total - step) / rate if rate > 0 else 0.0
        epoch = t.pos.samples_seen / (t.order.steps_per_epoch * t.cfg.batch_size)
        terms = " ".join(f"{k} {v:.4g}" for k, v in res.terms.items())
        return (f"step {step}/{total} ({100 * step / total:.0f}%) epoch {epoch:.2f}/"
                f"{t.cfg.epochs} loss {res.loss:.4f} ({terms}) lr {res.lr:.3g} "
                f"{rate * t.cfg.batch_size:.0f} samples/s ETA {fmt_duration(eta)}")

    def write_metrics(self, step: int) -> None:
        """metrics.json: wall_time_s = training seconds over all launches (setup excluded);
        samples_per_sec = this launch's average; final = the last step's values."""
        t, res = self.t, self.result
        launch_s = time.monotonic() - self.t0
        done = (step - self.start_step) * t.cfg.batch_size
        atomic_write_json(RunLayout(t.run_dir).metrics, {
            "run_id": t.run_dir.name, "step": step, "total_steps": t.total_steps,
            "samples_seen": t.pos.samples_seen, "rows": t.tokens.rows,
            "epochs_done": t.pos.samples_seen / (t.order.steps_per_epoch * t.cfg.batch_size),
            "epochs": t.cfg.epochs, "wall_time_s": t.pos.train_seconds,
            "launch_wall_time_s": launch_s, "samples_per_sec": done / max(launch_s, 1e-9),
            "world_size": t.world.size, "first_loss": self.first_loss,
            "final": None if res is None else {**res.values, "lr": res.lr}, "updated": utc_now()})

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
    """metrics.json of an earlier launch, for the carry-over of first_loss ({} if none)."""
    path = RunLayout(run_dir).metrics
    try:
        data = read_json(path) if path.is_file() else {}
    except (OSError, ValueError):  # a hand edit or a stranger's file: start the carry-over afresh
        return {}
    return data if isinstance(data, dict) else {}
