"""One stop for any number of stop signals (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2): the
handler every stoppable command installs; `console`, printing that a console gone away
cannot break; `alarm_at`, a deadline whatever the code inside waits on.

Slurm sends SIGTERM twice within milliseconds (slurmstepd, then srun) and torchrun forwards
its own again, so a second signal must not kill the save or cleanup the first one started.
SIGHUP is a dropped ssh session; SIGUSR1/2 are what sites often choose as the pre-timeout
signal. SIGKILL (or Ctrl-\\, SIGQUIT) is the force. Here, not in aleph.train, for `targets extract`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from aleph.errors import EXIT_STOPPED

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# The commands that install a StopFlag; a stop before they do is held for it (`hold_early`).
_STOPPABLE = (("train",), ("targets", "extract"), ("targets", "consensus"), ("targets", "build"),
              ("data", "tokens"))
_held: list[str] = []  # names of the stop signals that came before the StopFlag


def console(text: str, stream: TextIO | None = None) -> bool:
    """Print `text` to `stream` (default sys.stdout) and flush; False when the console is
    gone (a closed pipe, a hung-up terminal: EPIPE, EIO). Its descriptor then points at
    /dev/null, so later prints and the exit's flush cannot fail either: a console that went
    away never changes how a command ends (its logs keep every line)."""
    stream = stream if stream is not None else sys.stdout
    try:
        print(text, file=stream, flush=True)
        return True
    except OSError:
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)  # nofollow-ok: the system's /dev/null
            os.dup2(null, stream.fileno())
            os.close(null)
        return False


def hold_early(argv: list[str]) -> None:
    """For a stoppable command, hold a stop signal that comes before its StopFlag exists:
    importing torch takes seconds, and the default action would end the launch with 143 and
    no line (a requeued Slurm element stopped then would count as failed)."""
    if any(tuple(argv[:len(c)]) == c for c in _STOPPABLE):
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda signum, frame: _held.append(signal.Signals(signum).name))


class StopRequested(BaseException):
    """A stop signal arrived while StopFlag was in 'interrupt' mode: the command ends with
    errors.EXIT_STOPPED. A BaseException, so no `except Exception` in a store build swallows
    it; every build it interrupts marks completion last, so nothing it leaves counts."""

    def __init__(self, signame: str) -> None:
        super().__init__(f"stopped by {signame} before the first step")
        self.signame = signame

    def __reduce__(self):  # rebuilt from the name, not from the message
        return (StopRequested, (self.signame,))


class StopFlag:
    """Stop-signal handling of one launch, until restore(). 'interrupt' mode (input
    checks, store and model builds, resume load) raises StopRequested at once, so a long
    build does not outlive a grace period; 'flag' mode (the step loop, the lock, the
    records) only sets the flag: the loop saves and exits errors.EXIT_STOPPED. A repeated
    signal is counted (`repeats`): it never cuts a save short, only a wait that `bound`
    checks (the final push)."""

    def __init__(self, mode: str = "flag") -> None:
        self.event = threading.Event()
        self.signame = ""
        self.mode = "flag"
        self.repeats = 0
        """Signals after the first (each ignored: one stop)."""
        self.last = ""  # the newest signal's name
        self._old = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        if _held:  # a stop that came during the imports is this launch's stop
            self.signame, self.repeats, self.last = _held[0], len(_held) - 1, _held[-1]
            self.event.set()
            _held.clear()
        self.set_mode(mode)

    def _handle(self, signum, frame) -> None:
        self.last = signal.Signals(signum).name
        if self.event.is_set():  # already stopping: raising again would cut the save short
            self.repeats += 1
            return
        self.signame = self.last
        self.event.set()
        if self.mode == "interrupt":
            raise StopRequested(self.signame)

    def bound(self, seconds: float) -> Callable[[], str]:
        """A check for a wait a stop bounds (the final push): '' until `seconds` have passed
        since the stop (one that came before this call: since the call) or a further stop
        signal comes, then why the wait ends."""
        before, seen = self.event.is_set(), self.repeats
        since = [time.monotonic() if before else None]

        def cut() -> str:
            if not self.event.is_set():
                return ""
            if since[0] is None:  # the stop came during the wait
                since[0] = time.monotonic()
            if self.repeats > (seen if before else 0):
                return f"cut short by a further {self.last}"
            if time.monotonic() - since[0] >= seconds:
                return f"still running {seconds:g} s after the {self.signame}"
            return ""
        return cut

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
    """The command has ended and said how: a late stop signal (Slurm's second SIGTERM,
    torchrun's forwarded ones) must not turn the exit status into a death by signal."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def run_until_stop(command: str, body: Callable[[], int | str], kept: Callable[[str], str],
                   again: Callable[[], list[str]]) -> int:
    """`body()`'s exit code under one StopFlag('interrupt'); a str is its success summary
    (exit 0), printed after the switch to 'flag' mode: the work is committed, and a signal
    then cannot turn a done command into a stopped one. After a stop: one line, `aleph
    <command>: <kept(signal name)>; resume with: aleph <again()>`, and EXIT_STOPPED."""
    stop = StopFlag()
    done = None
    try:
        stop.set_mode("interrupt")  # a stop held since the imports (hold_early) raises here
        done = body()
        stop.set_mode("flag")
    except StopRequested as e:
        if done is None:  # not raised between body's return and the switch: it is done
            again_line = shlex.join(["aleph", *again()])
            console(f"aleph {command}: {kept(e.signame)}; resume with: {again_line}")
            ignore_stops()  # not restore(): Python's exit would reset them to the default (death)
            return EXIT_STOPPED
    except BaseException:
        stop.restore()
        raise
    if isinstance(done, str):
        console(done)
    if stop.is_set():  # a stop came: the process is ending, as after a stop
        ignore_stops()
    else:
        stop.restore()
    return 0 if isinstance(done, str) else done


@contextlib.contextmanager
def alarm_at(deadline: float, late: BaseException) -> Iterator[None]:
    """`late` raised at `deadline` (time.monotonic()) whatever the code inside waits on
    (per-read timeouts cannot bound headers trickled byte by byte). SIGALRM: in the main
    thread only; elsewhere the caller's per-read bounds alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):
        raise late

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
