"""One stop for any number of SIGTERM/SIGINT: the handler every stoppable command installs.

Slurm sends SIGTERM twice within milliseconds at a time limit or a preemption (slurmstepd,
then srun), and torchrun forwards its own again, so a second signal must not kill the save
or the cleanup the first one started. SIGKILL is the force (and Ctrl-\\, SIGQUIT, in a
terminal). Used by `aleph train` (aleph.train.signals re-exports these) and by `aleph
targets extract` / `consensus`, which sit below train in the import graph.
"""

from __future__ import annotations

import shlex
import signal
import threading
from collections.abc import Callable

from aleph.errors import EXIT_STOPPED


class StopRequested(BaseException):
    """A stop signal arrived while StopFlag was in 'interrupt' mode: the command ends with
    errors.EXIT_STOPPED (a launch of `aleph train` before its first step, recorded as
    stopped when already on record; `targets extract`/`consensus` anywhere in their pass).

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
    """SIGTERM/SIGINT handling of one launch, installed when a stoppable command starts.

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


def ignore_stops() -> None:
    """The command has ended and said how: a SIGTERM/SIGINT still arriving (Slurm's second,
    torchrun's forwarded ones) must not turn the exit status into a death by signal."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def run_until_stop(command: str, body: Callable[[], int], kept: Callable[[str], str],
                   again: Callable[[], list[str]]) -> int:
    """`body()`'s exit code, run under one StopFlag('interrupt') (any number of SIGTERM/SIGINT
    is one stop, raised where it lands). After a stop: one line, `aleph <command>: <kept(the
    signal's name)>; resume with: aleph <again()>`, further signals ignored, and
    errors.EXIT_STOPPED. Used by `aleph targets extract` and `consensus`."""
    stop = StopFlag("interrupt")
    try:
        rc = body()
    except StopRequested as e:
        again_line = shlex.join(["aleph", *again()])
        print(f"aleph {command}: {kept(e.signame)}; resume with: {again_line}", flush=True)
        ignore_stops()  # not restore(): Python's exit would reset them to the default (death)
        return EXIT_STOPPED
    except BaseException:
        stop.restore()
        raise
    stop.restore()
    return rc
