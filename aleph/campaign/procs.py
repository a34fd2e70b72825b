"""Child processes of a campaign: launch, liveness across campaign restarts, the run lock probe.

Each run is launched in its own session (`start_new_session`): a Ctrl-C in the terminal
reaches only the campaign, which forwards one SIGTERM to each trainer (a second signal
would make the trainer skip its checkpoint), and a campaign killed with SIGKILL leaves its
trainers running. A restarted campaign recognises them by pid and the pid's start time (a
recycled pid has another), or, for a launch killed between spawn and recording its pid, by
the launch token in the child's environment; it waits for them instead of launching again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from aleph._io import open_write_nofollow
from aleph.errors import RunLocked
from aleph.record.layout import RunLayout
from aleph.train.identity import RunLock

TOKEN_ENV = "ALEPH_CAMPAIGN_LAUNCH"


def package_root() -> Path:
    """The directory holding the `aleph` package this campaign runs (children run the same)."""
    import aleph

    return Path(aleph.__file__).resolve().parents[1]


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    root = str(package_root())
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([root, *[p for p in parts if p != root]])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def spawn(argv: list[str], env: dict[str, str], log: Path, cpus: tuple[int, ...] | None
          ) -> subprocess.Popen:
    """Start `python -m aleph <argv>` in its own session, output appended to `log`."""
    with os.fdopen(open_write_nofollow(log, append=True), "ab") as out:  # a planted link: refused
        proc = subprocess.Popen([sys.executable, "-m", "aleph", *argv], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    if cpus:  # the child is one thread at this point: every thread it starts inherits this
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(proc.pid, cpus)
    return proc


def start_time(pid: int | None) -> str | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22), or None
    when no such live process exists (gone, or a zombie)."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state is field 3
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def alive(pid: int | None, started: str | None) -> bool:
    """Whether `pid` is still the process that started at `started`."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def find_token(token: str) -> int | None:
    """The pid of a live process whose environment carries this launch token, if any."""
    want = f"{TOKEN_ENV}={token}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        if want in env and start_time(int(entry.name)) is not None:
            return int(entry.name)
    return None


def holder_text(message: str) -> str:
    """The trainer's lock refusal, as the campaign reports it (without the trainer's
    "this launch ... exits", which describes the refused launch, not the campaign)."""
    message = message.strip().removeprefix("aleph train: error: ")
    return message.removesuffix("; this launch changed nothing and exits")


def lock_holder(run_dir: Path) -> str | None:
    """The trainer's own refusal message (holder_text) when another launch holds `run_dir`'s
    run lock, else None. It is aleph.train.identity.RunLock itself, taken and released at once: the
    kernel flock that decides for the trainer decides here (and the trainer still refuses,
    exit 75, if the lock is taken between this probe and its launch)."""
    if not RunLayout(run_dir).lock.exists():
        return None  # no launch ever held it (the trainer creates it under the lock)
    lock = RunLock(run_dir)
    try:
        lock.acquire()
    except RunLocked as e:
        return holder_text(str(e))
    lock.release()
    return None


def signal_group(pid: int, sig: int = signal.SIGTERM) -> bool:
    """Send `sig` to the session/process group a campaign child leads; False if gone."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
