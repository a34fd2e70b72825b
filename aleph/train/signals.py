"""Stop signals and the test pause hooks of a launch.

SIGTERM/SIGINT (`docker compose stop`, Ctrl-C, torchrun forwarding, Slurm's time limit and
preemption) end a launch cleanly: before the first step by raising StopRequested, in the step
loop by setting a flag the loop reads after each step. Any number of them is one stop: Slurm
sends SIGTERM twice within milliseconds at a time limit (slurmstepd, then srun), and torchrun
forwards its own again, so a second signal must not kill the save the first one started.
SIGKILL is the force (and Ctrl-\\, SIGQUIT, in a terminal). The pause hooks let tests stop or
kill a real run at a known point.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from aleph.errors import ConfigError


class StopRequested(BaseException):
    """A stop signal arrived during preflight (before the first step): the launch ends with
    errors.EXIT_STOPPED, recorded as stopped when the launch is already on record.

    A BaseException (like KeyboardInterrupt) so no `except Exception` in a store build
    swallows it. Every build it can interrupt writes to a temporary sibling (or a resumable
    partial file) and marks completion last, so nothing it leaves counts as complete.
    """

    def __init__(self, signame: str) -> None:
        super().__init__(f"stopped by {signame} before the first step")
        self.signame = signame

    def __reduce__(self):  # rebuilt from the name, not from the message
        return (StopRequested, (self.signame,))


class StopFlag:
    """SIGTERM/SIGINT handling of one launch, installed when `train` starts.

    Two modes. 'interrupt' (input checks, store builds, model build, resume load): the
    handler raises StopRequested at once, so a long store build does not outlive
    `docker compose stop`'s grace period or Slurm's KillWait. 'flag' (the step loop, taking
    the lock, recording the launch and its ending): the handler only sets a flag; the loop
    finishes the step, saves, and the launch exits errors.EXIT_STOPPED. The handlers stay
    until restore(): a repeated signal is counted (`repeats`) and changes nothing, in either
    mode, since the first one already raised or set the flag.
    """

    def __init__(self, mode: str = "flag") -> None:
        self.event = threading.Event()
        self.signame = ""
        self.mode = "flag"
        self.repeats = 0
        """Signals after the first (each ignored: one stop)."""
        self._old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)
        self.set_mode(mode)

    def _handle(self, signum, frame) -> None:
        if self.event.is_set():  # already stopping: raising again would cut the save short
            self.repeats += 1
            return
        self.signame = signal.Signals(signum).name
        self.event.set()
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
PREFLIGHT_PHASES = ("inputs", "targets", "tokens", "model")


def pause_step() -> int | None:
    """Test hook: after this step (and its checkpoint) the loop waits until signalled.

    Lets tests kill (SIGKILL) or stop (SIGTERM) a real run at a known step without races.
    """
    value = os.environ.get(PAUSE_ENV)
    return int(value) if value else None


def preflight_pause(phase: str, log, stop: StopFlag) -> None:
    """Test hook: with ALEPH_TRAIN_PAUSE_IN_PREFLIGHT=<phase>, wait before that phase.

    Phases: inputs (the input checks, before the lock: nothing written yet), targets (target
    store), tokens (token store), model (build and resume load).
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
