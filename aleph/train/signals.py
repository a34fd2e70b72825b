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
import time

from aleph._signals import StopFlag, StopRequested
from aleph.errors import ConfigError

__all__ = ["StopFlag", "StopRequested", "pause_step", "preflight_pause"]


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
