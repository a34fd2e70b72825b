"""The trainer's background sync: rank 0 hands requests to one worker thread.

`saved(step)` (training thread, after a complete resume state) wakes the worker when
`every_minutes` have passed and returns at once: a sync never blocks a step. The worker
pushes the run as it is then; a failure is logged and retried with backoff (RETRY_FIRST_S
doubling to RETRY_MAX_S) while training goes on. `finish()` makes a final push, tried
FINAL_ATTEMPTS times, and waits for it. Results reach `on_synced` on the training thread
only, so the manifest is written by one thread.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import threading
import time
from collections.abc import Callable
from pathlib import Path

from aleph.sync.dest import Destination, scrub
from aleph.sync.transfer import PushResult, push

RETRY_FIRST_S = 10.0
RETRY_MAX_S = 600.0
FINAL_ATTEMPTS = 3
FINAL_RETRY_S = 0.5
WORKER_NICE = 10
FINAL_WAIT_S = 900.0
"""finish() waits at most this long; a push still running then is abandoned (the
destination keeps its previous snapshot) and logs nothing more."""


class Syncer:
    def __init__(self, run_dir: Path, dest: Destination, every_minutes: float, log: Callable,
                 on_synced: Callable[[PushResult], None] | None = None) -> None:
        self.run_dir, self.dest, self.every_s = Path(run_dir), dest, every_minutes * 60
        self.log, self.on_synced = log, on_synced
        self._cv = threading.Condition()
        self._wanted = self._final = False
        self._last_request: float | None = None
        self._done: list[PushResult] = []  # successes not yet handed to on_synced
        self.last: PushResult | None = None
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name="aleph-sync", daemon=True)
        self._thread.start()

    def header_line(self) -> str:
        every = (f"every {self.every_s / 60:g} min" if self.every_s
                 else "after every resume state")
        return (f"sync: to {self.dest.spec}, {every} (complete resume state, weights, logs, "
                "metrics, TensorBoard events), and once more at the end or a stop")

    # --- training thread -------------------------------------------------------------------
    def saved(self, step: int) -> None:
        """A complete resume state of `step` was just saved: request a sync if one is due."""
        self._deliver()
        now = time.monotonic()
        if self._last_request is not None and now - self._last_request < self.every_s:
            return
        self._last_request = now
        with self._cv:
            self._wanted = True
            self._cv.notify()

    def finish(self, timeout: float = FINAL_WAIT_S,
               cut: Callable[[], str] = lambda: "") -> PushResult | None:
        """The final sync: wait for it (and any in flight) at most `timeout` seconds, or
        until `cut()` names why not to (a stop's bound); returns the last success. An
        abandoned push leaves the destination's previous snapshot whole."""
        with self._cv:
            self._final = True
            self._cv.notify()
        t0, why = time.monotonic(), ""
        while self._thread.is_alive() and not why:
            left = timeout - (time.monotonic() - t0)
            if left <= 0:
                why = f"still running after {timeout:g} s"
                break
            self._thread.join(min(left, 0.2))
            why = "" if not self._thread.is_alive() else cut()
        if self._thread.is_alive():
            self.log(f"sync: final push to {self.dest.spec} {why}; abandoned (the destination "
                     f"keeps {self._kept()}); push later with "
                     f"`aleph runs push {shlex.quote(str(self.run_dir))}`")
            self.log = lambda message: None  # the launch log closes next
        self._deliver()
        return self.last

    def _deliver(self) -> None:
        with self._cv:
            done, self._done = self._done, []
        for result in done:
            if self.on_synced is not None:
                self.on_synced(result)

    # --- worker thread ---------------------------------------------------------------------
    def _run(self) -> None:
        with contextlib.suppress(OSError):  # on Linux: this thread's nice value only
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)
        while True:
            with self._cv:
                while not (self._wanted or self._final):
                    self._cv.wait()
                final, self._wanted = self._final, False
            if final:
                self._attempts(FINAL_ATTEMPTS)
                return
            self._attempts(None)

    def _attempts(self, limit: int | None) -> None:
        """Push until it works: `limit` attempts FINAL_RETRY_S * n apart (the final sync), or
        (None) with growing backoff until it works or finish() cuts a wait short."""
        final = limit is not None
        for n in itertools.count(1):
            try:
                result = push(self.run_dir, self.dest)
            except Exception as e:  # any failure: logged, retried, never raised into training
                self.failures += 1
                why = scrub(f"{type(e).__name__}: {e}")
                if final and n >= limit:
                    self.log(f"sync: final push to {self.dest.spec} failed (attempt {n} of "
                             f"{limit}): {why}; giving up; the destination keeps {self._kept()}; "
                             f"push later with `aleph runs push {shlex.quote(str(self.run_dir))}`")
                    return
                wait = FINAL_RETRY_S * n if final else min(RETRY_FIRST_S * 2 ** (n - 1), RETRY_MAX_S)
                goes_on = "" if final else "training continues; "
                self.log(f"sync: {'final ' if final else ''}push to {self.dest.spec} failed "
                         f"(attempt {n}): {why}; {goes_on}retrying in {wait:g} s")
                if final:
                    time.sleep(wait)
                elif self._wait(wait):
                    return  # finish() came: the final sync takes over
                continue
            self.last = result
            with self._cv:
                self._done.append(result)
            self.log(f"sync: {'final: ' if final else ''}{result.line()}")
            return

    def _wait(self, seconds: float) -> bool:
        """Sleep `seconds`, cut short by finish(); True when finish() was called."""
        deadline = time.monotonic() + seconds
        with self._cv:
            while not self._final:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def _kept(self) -> str:
        return (f"revision {self.last.revision} (step {self.last.step}) from this launch"
                if self.last else "what an earlier push left there, if any")
