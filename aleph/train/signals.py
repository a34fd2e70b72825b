"""Stop signals (aleph._signals: any number of SIGTERM/SIGINT is one stop; before the first
step it raises StopRequested, in the loop it sets a flag read after each step) and the test
pause hooks that let tests stop or kill a real run at a known point.
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
    """Test hook: after this step (and its checkpoint) the loop waits until signalled."""
    value = os.environ.get(PAUSE_ENV)
    return int(value) if value else None


def preflight_pause(phase: str, log, stop: StopFlag) -> None:
    """Test hook: with ALEPH_TRAIN_PAUSE_IN_PREFLIGHT=<phase>, wait before that phase (inputs:
    before the lock; targets, tokens: the store builds; model: build and resume load). The
    handlers are in 'interrupt' mode there: the signal raises StopRequested, as mid-build."""
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
