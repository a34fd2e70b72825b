"""The scheduler: every queued run launched once on a free device, watched to its end.

One polling loop: reap the children that ended, watch launches of an earlier (killed)
campaign process, re-probe runs another launch holds, fill the free devices in queue order.
Every change is in campaign.json before the next step, so after a SIGKILL a restart waits
for a launch that still lives (never launching it again) and settles one that ended from
its run directory. The run lock (aleph.train.identity.RunLock) decides who trains a run: a
trainer that loses the race exits 75 and changes nothing.
A stop signal (SIGTERM, SIGINT, SIGHUP, SIGUSR1/2): one SIGTERM per trainer (it checkpoints,
exits 76), wait, exit 76.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from aleph._io import open_write_nofollow
from aleph._signals import STOP_SIGNALS, console
from aleph.campaign import procs, rundirs
from aleph.campaign.spec import Device, Spec
from aleph.campaign.state import (
    COMPLETE,
    FAILED,
    LAUNCH_LOGS,
    LOCKED,
    QUEUED,
    RUNNING,
    STATE_FILE,
    State,
    campaign_dir,
)
from aleph.errors import EXIT_STOPPED, RunLocked
from aleph.train.identity import RunLock, hostname, utc_now

LOCKED_EXIT = RunLocked.exit_code  # 75: another launch holds the run lock
REFUSED_EXIT = 2  # config / data / store refusal: the same launch would be refused again
RELOCK_REPORT_S = 600.0  # repeat "still locked" this often


@dataclass
class Child:
    proc: Any  # subprocess.Popen of this campaign process
    device: Device
    entry: dict


@dataclass
class Orphan:
    """A launch of an earlier campaign process that still runs (or whose lock is held)."""

    pid: int | None
    started: str | None
    device: str
    entry: dict


class Campaign:
    def __init__(self, spec: Spec, configs: dict[str, Any], devices: list[Device],
                 retries: int = 2, retry_failed: bool = False, poll_seconds: float = 1.0,
                 out: TextIO = sys.stdout) -> None:
        self.spec, self.configs, self.devices = spec, configs, devices
        self.retries, self.retry_failed, self.poll = retries, retry_failed, poll_seconds
        self.out = out
        self.dir = campaign_dir(spec.name)
        self.state = State.open(self.dir / STATE_FILE, spec)
        self.children: dict[str, Child] = {}
        self.orphans: dict[str, Orphan] = {}
        self.stop_signal: str | None = None
        self.signalled: set[int] = set()
        self.said_locked: dict[str, float] = {}

    # --- output -------------------------------------------------------------------------
    def say(self, message: str) -> None:
        line = f"[campaign {self.spec.name}] {utc_now()} {message}"
        self.dir.mkdir(parents=True, exist_ok=True)
        with os.fdopen(open_write_nofollow(self.dir / "campaign.log", append=True), "a",
                       encoding="utf-8") as f:
            f.write(line + "\n")
        console(line, self.out)  # a closed pipe or hung-up terminal never stops the campaign

    # --- entry point --------------------------------------------------------------------
    @contextlib.contextmanager
    def session(self, options: dict):
        """Hold the campaign's lock (one process per campaign directory) and the SIGTERM/
        SIGINT handlers; record this process in the state, and how it ended."""
        self.dir.mkdir(parents=True, exist_ok=True)
        lock = RunLock(self.dir)
        try:
            lock.acquire()
        except RunLocked as e:
            raise RunLocked(f"campaign {self.spec.name} is already running in another "
                            f"process: {procs.holder_text(str(e))}") from None
        old = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        try:
            for line in self.state.begin_process(os.getpid(), [d.name for d in self.devices], options):
                self.say(line)
            yield self
            self.state.end_process(f"stopped by {self.stop_signal}" if self.stopping
                                   else "finished")
        except BaseException as e:
            self.state.end_process(f"error: {type(e).__name__}: {e}")
            raise
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            lock.release()

    def schedule(self) -> None:
        """Run the queue until every run is complete or failed, or until a stop signal."""
        self.say(f"{len(self.state.queue)} runs ({', '.join(self.state.queue)}) on "
                 f"{', '.join(d.describe() for d in self.devices)}; state {self.state.path}")
        self._reconcile()
        self._loop()

    def adopt_finished(self) -> None:
        """--finish-only (the Slurm finish job): no launch; each run is complete when its run
        directory says so, any other is left queued and reported not finished."""
        for rid in self.state.queue:
            if self._adopt(rid, "complete in its run directory"):
                continue
            self.state.run(rid).update(status=QUEUED, note="not complete: not launched by "
                                       "--finish-only (aleph campaign status)")
            self.say(f"{rid}: not complete; --finish-only launches nothing")
        self.state.save()

    def _adopt(self, rid: str, note: str) -> bool:
        """Whether the run directory is complete; if so, the run is complete with `note`, or
        failed when that directory holds another config."""
        rd = rundirs.run_dir(self.configs[rid])
        if not rundirs.is_complete(rd):
            return False
        if conflict := rundirs.config_conflict(rd, self.configs[rid]):
            self._fail(rid, conflict)
        else:
            self._complete(rid, note)
        return True

    def _on_signal(self, signum, frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signal.Signals(signum).name

    @property
    def stopping(self) -> bool:
        return self.stop_signal is not None

    # --- restart ------------------------------------------------------------------------
    def _reconcile(self) -> None:
        """Adopt what an earlier campaign process left: live launches, ended ones."""
        here = hostname()
        for rid in self.state.queue:
            run = self.state.run(rid)
            if run["status"] == FAILED and self.retry_failed:
                run.update(status=QUEUED, failures=0, note="requeued by --retry-failed")
                self.say(f"{rid}: failed earlier; requeued (--retry-failed)")
            if run["status"] == LOCKED:
                self.say(f"{rid}: still waiting for another launch: {run['note']}")
            if run["status"] != RUNNING:
                continue
            e = run["launches"][-1]
            pid, started = e.get("pid"), e.get("pid_start")
            live = False
            if e.get("host") == here:
                if pid is None:  # killed between spawn and recording the pid
                    pid = procs.find_token(e["token"])
                    started = procs.start_time(pid)
                    if pid is not None:
                        e.update(pid=pid, pid_start=started)
                live = procs.alive(pid, started)
            elif procs.lock_holder(rundirs.run_dir(self.configs[rid])):
                live = True  # another host: only its lock can say it still runs
            if live:
                self.orphans[rid] = Orphan(pid if e.get("host") == here else None, started,
                                           e["device"], e)
                self.say(f"{rid}: launch {e['n']} (pid {pid} on {e['device']}) of an earlier "
                         "campaign process is still running: waiting for it, not launching it "
                         "again")
            else:
                self._settle_unwatched(rid, e)
        self.state.save()

    # --- the loop -----------------------------------------------------------------------
    def _loop(self) -> None:
        announced = False
        while True:
            self._reap()
            self._watch_orphans()
            if self.stopping:
                if not announced:
                    announced = True
                    self.say(f"{self.stop_signal}: stopping; each running trainer gets one "
                             "SIGTERM, saves a resume state and exits; nothing new is launched")
                self._forward()
                if not self.children and all(o.pid is None for o in self.orphans.values()):
                    for rid, o in self.orphans.items():  # only their own host can stop them
                        self.say(f"{rid}: launch {o.entry['n']} runs on {o.entry.get('host')}, "
                                 "where this campaign cannot signal it: left running; the next "
                                 "campaign launch waits for it again")
                    return
            else:
                self._check_locked()
                self._fill_devices()
                if not self.state.with_status(QUEUED, RUNNING, LOCKED):
                    return
            time.sleep(self.poll)

    def _busy(self) -> set[str]:
        return {c.device.name for c in self.children.values()} | {
            o.device for o in self.orphans.values()}

    def _fill_devices(self) -> None:
        busy = self._busy()
        free = [d for d in self.devices if d.name not in busy]
        for rid in self.state.with_status(QUEUED):
            if not free or self.stopping:
                return
            if self._adopt(rid, "already complete before this launch: skipped"):
                continue
            if holder := procs.lock_holder(rundirs.run_dir(self.configs[rid])):
                self._locked(rid, holder)
                continue
            self._launch(rid, free.pop(0))

    def _launch(self, rid: str, device: Device) -> None:
        run = self.state.run(rid)
        n = len(run["launches"]) + 1
        log = self.dir / LAUNCH_LOGS / f"{rid}.{n}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = ["train", *self.spec.train_args(run["arm"], run["seed"])]
        token = f"{self.state.data['id']}/{rid}/{n}"
        entry = {"n": n, "device": device.name, "cuda_visible_devices": device.cuda_visible,
                 "cpus": list(device.cpus) if device.cpus else None, "host": hostname(),
                 "campaign_pid": os.getpid(), "token": token, "pid": None, "pid_start": None,
                 "start": utc_now(), "end": None, "exit_status": None, "outcome": "running",
                 "log": str(log.relative_to(self.dir)), "argv": ["aleph", *argv]}
        run["launches"].append(entry)
        run["status"] = RUNNING
        self.state.save()  # before the spawn: a restart then knows to look for the token
        secrets = self.spec.secret_env()  # in the environment only, never in the argv
        given = f" (and {', '.join(sorted(secrets))} in its environment)" if secrets else ""
        with os.fdopen(open_write_nofollow(log, append=True), "a", encoding="utf-8") as f:
            f.write(f"campaign {self.spec.name}: launch {n} of {rid} on {device.describe()} at "
                    f"{entry['start']}: {' '.join(entry['argv'])}{given}\n")
        env = procs.child_env({**secrets, "CUDA_VISIBLE_DEVICES": device.cuda_visible,
                               procs.TOKEN_ENV: token})
        proc = procs.spawn(argv, env, log, device.cpus)
        entry.update(pid=proc.pid, pid_start=procs.start_time(proc.pid))
        self.state.save()
        self.children[rid] = Child(proc, device, entry)
        self.say(f"{rid}: launch {n} on {device.describe()}, pid {proc.pid}; log {log}")

    def _reap(self) -> None:
        for rid, child in list(self.children.items()):
            rc = child.proc.poll()
            if rc is None:
                continue
            del self.children[rid]
            self._settle(rid, child.entry, rc)

    def _watch_orphans(self) -> None:
        for rid, o in list(self.orphans.items()):
            if o.pid is not None:
                if procs.alive(o.pid, o.started):
                    continue
            elif procs.lock_holder(rundirs.run_dir(self.configs[rid])):
                continue
            del self.orphans[rid]
            self._settle_unwatched(rid, o.entry)

    def _forward(self) -> None:
        """One SIGTERM per trainer (a second would make it skip its checkpoint)."""
        targets = [(rid, c.proc.pid) for rid, c in self.children.items()]
        targets += [(rid, o.pid) for rid, o in self.orphans.items()
                    if o.pid is not None and procs.alive(o.pid, o.started)]
        for rid, pid in targets:
            if pid not in self.signalled:
                self.signalled.add(pid)
                if procs.signal_group(pid, signal.SIGTERM):
                    self.say(f"{rid}: SIGTERM sent to pid {pid}")

    def _check_locked(self) -> None:
        now = time.monotonic()
        for rid in self.state.with_status(LOCKED):
            rd = rundirs.run_dir(self.configs[rid])
            if holder := procs.lock_holder(rd):
                if now - self.said_locked.setdefault(rid, now) >= RELOCK_REPORT_S:
                    self.said_locked[rid] = now
                    self.say(f"{rid}: still waiting: {holder}")
                continue
            self.said_locked.pop(rid, None)
            if rundirs.is_complete(rd):
                self._complete(rid, "completed by another launch while this campaign waited")
            else:
                self.state.run(rid).update(status=QUEUED, note="lock released: queued")
                self.say(f"{rid}: the other launch released the run lock; queued")
                self.state.save()

    # --- outcomes -----------------------------------------------------------------------
    def _settle_unwatched(self, rid: str, entry: dict) -> None:
        """A launch that ended while no campaign process watched it: read how."""
        rd = rundirs.run_dir(self.configs[rid])
        if entry.get("pid") is None and not rundirs.is_complete(rd):
            # killed between recording the launch and spawning it (no process carries its
            # token): it never started, so it is no failure of the run
            entry.update(end=utc_now(), outcome="lost")
            self.state.run(rid).update(status=QUEUED, note=f"launch {entry['n']} never started")
            self.say(f"{rid}: launch {entry['n']} never started (the campaign was killed while "
                     "launching it); queued")
            self.state.save()
            return
        status, code = rundirs.launch_end(rd, entry.get("pid"), entry.get("host", ""))
        if rundirs.is_complete(rd):
            code = 0
        elif status is None and code is None:
            self.say(f"{rid}: launch {entry['n']} ended while no campaign process watched it; "
                     "its run directory records no end for it")
        self._settle(rid, entry, code, unwatched=True)

    def _settle(self, rid: str, entry: dict, rc: int | None, unwatched: bool = False) -> None:
        run, rd = self.state.run(rid), rundirs.run_dir(self.configs[rid])
        entry.update(end=utc_now(), exit_status=rc)
        log = self.dir / entry["log"]
        what = "exit status unknown" if rc is None else (
            f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}")
        if rundirs.is_complete(rd):
            entry["outcome"] = "complete"
            self._complete(rid, f"launch {entry['n']} on {entry['device']}: complete ({what})")
            return
        if rc == LOCKED_EXIT:
            entry["outcome"] = "locked"
            self._locked(rid, rundirs.error_line(log))
            return
        if self.stopping and (rc == EXIT_STOPPED or rc == -signal.SIGTERM or rc is None):
            entry["outcome"] = "stopped"
            run.update(status=QUEUED, note=f"stopped by {self.stop_signal}; resumes on restart")
            self.say(f"{rid}: stopped ({what}); the next campaign launch resumes it")
            self.state.save()
            return
        if rc == EXIT_STOPPED:
            entry["outcome"], reason = "stopped", "stopped by a signal from outside the campaign"
        elif rc is None and unwatched:
            entry["outcome"], reason = "lost", "ended while no campaign process watched it"
        else:
            entry["outcome"], reason = "failed", f"{what}: {rundirs.error_line(log)}"
        if rc == REFUSED_EXIT:
            self._fail(rid, f"launch {entry['n']} refused ({reason}); not retried: the same "
                       "launch would be refused again")
            return
        run["failures"] += 1
        if run["failures"] > self.retries:
            self._fail(rid, f"launch {entry['n']} {reason}; {run['failures']} failed launches, "
                       f"retries ({self.retries}) used up")
            return
        run.update(status=QUEUED, note=f"launch {entry['n']} {reason}; retry "
                   f"{run['failures']} of {self.retries}")
        self.say(f"{rid}: launch {entry['n']} {reason}; queued again (retry {run['failures']} "
                 f"of {self.retries}; log {log})")
        self.state.save()

    def _complete(self, rid: str, note: str) -> None:
        rd = rundirs.run_dir(self.configs[rid])
        self.state.run(rid).update(status=COMPLETE, note=note,
                                   weights_sha256=rundirs.weights_sha256(rd))
        self.say(f"{rid}: {note}")
        self.state.save()

    def _fail(self, rid: str, note: str) -> None:
        self.state.run(rid).update(status=FAILED, note=note)
        self.say(f"{rid}: FAILED: {note}")
        self.state.save()

    def _locked(self, rid: str, holder: str) -> None:
        holder = procs.holder_text(holder)
        self.state.run(rid).update(status=LOCKED, note=holder)
        self.said_locked[rid] = time.monotonic()
        self.say(f"{rid}: not launched: {holder}; waiting for that launch to end (the run lock "
                 "decides: this campaign never runs a second launch beside it)")
        self.state.save()

