"""The trainer's sync worker: never blocks the caller, logs failures with the reason, keeps
trying, and the final sync catches up once the destination is back."""

from __future__ import annotations

import threading
import time

from aleph.sync import Syncer, parse_destination
from aleph.sync.index import run_path
from aleph.sync.worker import RETRY_FIRST_S


def test_failures_are_logged_and_retried_and_the_final_sync_catches_up(run_copy, tmp_path):
    dest = tmp_path / "bucket"
    dest.write_text("not a directory")  # unwritable even for root
    lines, synced = [], []
    failed = threading.Event()

    def log(message: str) -> None:
        lines.append(message)
        if "failed" in message:
            failed.set()

    syncer = Syncer(run_copy, parse_destination(str(dest)), 0.0, log, synced.append)
    assert syncer.header_line().startswith(f"sync: to {dest}, after every resume state")
    t0 = time.monotonic()
    syncer.saved(12)
    assert time.monotonic() - t0 < 0.1  # handed over, not pushed on the caller's thread
    assert failed.wait(30)
    assert (f"sync: push to {dest} failed (attempt 1): SyncError: sync destination {dest}: "
            "not a directory") in lines[0]
    assert f"training continues; retrying in {RETRY_FIRST_S:.0f} s" in lines[0]
    assert synced == []  # nothing delivered yet

    dest.unlink()
    dest.mkdir()  # the destination is back: finish() cuts the backoff short
    result = syncer.finish(timeout=60)
    assert result is not None and result.revision == "r1" and result.step == 12
    assert synced == [result]  # delivered on the caller's thread by finish()
    assert lines[-1].startswith(f"sync: final: synced {run_path(run_copy)} step 12 -> {dest}")
    assert result.record() == {"destination": str(dest), "time": result.time, "step": 12,
                               "revision": "r1"}


def test_cadence_skips_requests_until_due(run_copy, tmp_path):
    dest = tmp_path / "bucket"
    dest.mkdir()
    lines = []
    syncer = Syncer(run_copy, parse_destination(str(dest)), 30.0, lines.append)
    syncer.saved(3)  # the first request is always due
    deadline = time.monotonic() + 30
    while not lines and time.monotonic() < deadline:
        time.sleep(0.02)
    syncer.saved(6)  # 30 minutes have not passed: no request
    time.sleep(0.5)
    assert len(lines) == 1 and " revision r1: " in lines[0]
    result = syncer.finish(timeout=60)
    assert len(lines) == 2 and lines[1].startswith("sync: final: ")
    assert "revision r1: up to date, nothing sent" in lines[1]
    assert result.revision == "r1" and syncer.failures == 0


def test_a_further_stop_signal_ends_the_wait_for_a_hung_final_push(run_copy, tmp_path,
                                                                  monkeypatch):
    import os
    import signal

    from aleph._signals import StopFlag
    from aleph.sync.dest import PAUSE_ENV

    dest = tmp_path / "bucket"
    dest.mkdir()
    monkeypatch.setenv(PAUSE_ENV, "1")  # the push hangs after its first file (a daemon thread)
    lines = []
    syncer = Syncer(run_copy, parse_destination(str(dest)), 0.0, lines.append)
    stop = StopFlag()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the launch's stop: it saved, now the final push
        assert stop.is_set()
        cut = stop.bound(120)
        assert cut() == ""  # the stop that came before the wait does not end it
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGHUP)).start()
        t0 = time.monotonic()
        assert syncer.finish(timeout=120, cut=cut) is None
        waited = time.monotonic() - t0
    finally:
        stop.restore()
    assert waited < 30, waited  # ended by the further signal, not by the 120 s
    assert lines[-1] == (f"sync: final push to {dest} cut short by a further SIGHUP; abandoned "
                         "(the destination keeps what an earlier push left there, if any); push "
                         f"later with `aleph runs push {run_copy}`")
