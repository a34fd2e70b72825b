"""Run identity: run names, the run lock (an flock taken before anything is written; a
duplicate launch exits RunLocked touching nothing), launch ids, per-launch tagged logs.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import stat
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from aleph._io import RUNS_DIR, open_write_nofollow, work_root
from aleph._signals import console
from aleph.errors import ConfigError, DataError, RunLocked
from aleph.record.layout import RunLayout

# The preset whose runs keep the seed's names (runs/<arm>-s<seed>); any other preset's runs
# go one level down (runs/<preset>/<arm>-s<seed>), so a smoke run never meets a real one.
TOP_LEVEL_PRESET = "e1"
_NAME_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def check_run_name(name: str, what: str = "--name") -> str:
    """`name` if it is a safe run name relative to <work>/runs (one or two parts, as `aleph
    runs list` looks one level down; no '..', hidden or absolute path), else ConfigError."""
    parts = name.split("/")
    if not 1 <= len(parts) <= 2 or not all(_NAME_PART.fullmatch(p) for p in parts):
        raise ConfigError(f"{what} {name!r}: expected a run name relative to <work root>/runs: "
                          "one or two '/'-separated parts of letters, digits, '.', '_' or '-', "
                          "each starting with a letter or digit (no '..', no absolute path), "
                          "e.g. my-a2 or smoke/a2_dense-s0")
    return name


def run_name(preset: str, arm: str, seed: int) -> str:
    """The default run name: `<arm>-s<seed>` for the e1 preset (the seed's names), else
    `<preset>/<arm>-s<seed>`."""
    base = f"{arm}-s{seed}"
    name = base if preset == TOP_LEVEL_PRESET else f"{preset}/{base}"
    return check_run_name(name, "run name (from config field 'preset')")


def run_ref(run_dir: Path) -> str:
    """How a command names `run_dir`: its run name when it lies under <work>/runs (every
    command that takes a run accepts the name), else the directory itself."""
    try:
        return Path(run_dir).relative_to(work_root() / RUNS_DIR).as_posix()
    except ValueError:
        return str(run_dir)


def run_dir_for(cfg, name: str | None = None) -> Path:
    """<work>/runs/<name>: `name` (checked) when given, else the config's default run name."""
    chosen = check_run_name(name) if name else run_name(cfg.preset, cfg.arm, cfg.seed)
    return _check_place(work_root() / RUNS_DIR, chosen)


def _check_place(runs: Path, name: str) -> Path:
    """runs/<name>, unless it would nest one run inside another: a name whose first part
    is a run (`a2_dense-s0/x`), or a folder of runs itself (`--name smoke` where
    runs/smoke/ holds the smoke preset's runs). ConfigError naming both otherwise."""
    run_dir, parent = runs / name, (runs / name).parent
    if parent != runs and RunLayout(parent).config.is_file():  # every run has a config.json
        raise ConfigError(f"run name {name!r}: {parent} is a run, and a run cannot live inside "
                          "another; pick a name whose first part is not a run")
    if run_dir.is_dir() and not RunLayout(run_dir).config.is_file():
        nested = sorted(c.name for c in run_dir.iterdir() if RunLayout(c).config.is_file())
        if nested:
            raise ConfigError(f"run name {name!r}: {run_dir} is a folder of runs "
                              f"({', '.join(nested[:3])}{', ...' if len(nested) > 3 else ''}), "
                              f"not a run; pick another name, e.g. {name}/my-run")
    return run_dir


def utc_now() -> str:
    """ISO-8601 UTC timestamp with seconds, e.g. 2026-11-30T01:02:03Z."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def hostname() -> str:
    return socket.gethostname() or "unknown-host"


def make_launch_id() -> str:
    """`<UTC compact>-<host>-<pid>`: distinct per launch even on one host within one second."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    host = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in hostname())
    return f"{stamp}-{host}-{os.getpid()}"


class RunLock:
    """An exclusive, non-blocking flock on `<run_dir>/run.lock` holding pid/host/start. The
    kernel drops it when the process dies (even by SIGKILL): a stale file never blocks."""

    def __init__(self, run_dir: Path) -> None:
        self.path = RunLayout(run_dir).lock
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise RunLocked naming the holder; writes nothing else."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_RDWR without O_TRUNC: a losing launch must not blank the holder's description;
        # O_NOFOLLOW: a run.lock planted as a link (a pulled or shared run) is never written
        # through; O_NONBLOCK: a FIFO there cannot hang the open.
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as e:
            raise DataError(f"{self.path}: cannot take the run lock ({e.strerror}); expected a "
                            "regular file the trainer writes (remove it if it is a link)") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise DataError(f"{self.path}: not a regular file; expected the run lock the trainer "
                            "writes (remove it)")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunLocked(
                f"run directory {self.path.parent} is locked by another launch (pid "
                f"{holder.get('pid', '?')} on host {holder.get('host', '?')}, started "
                f"{holder.get('start', '?')}); this launch changed nothing and exits") from None
        info = json.dumps({"pid": os.getpid(), "host": hostname(), "start": utc_now()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, info + b"\n", 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _read_holder(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (ValueError, OSError):
        return {}


class LaunchLog:
    """Append-mode console log of one launch (one per rank); every line tagged and echoed."""

    def __init__(self, path: Path, tag: str, echo: TextIO | None = sys.stdout) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tag = tag
        self._echo = echo
        # appended, never through a planted link or into a FIFO; closed in close()
        self._f = os.fdopen(open_write_nofollow(self.path, append=True), "a", encoding="utf-8",
                            buffering=1)
        self._lock = threading.Lock()  # the sync worker (aleph.sync) logs from its thread

    def __call__(self, message: str) -> None:
        with self._lock:
            for line in str(message).splitlines() or [""]:
                text = f"[{self.tag}] {utc_now()} {line}"
                self._f.write(text + "\n")
                if self._echo is not None and not console(text, self._echo):
                    self._echo = None  # the console went away: the log file keeps every line

    def close(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
