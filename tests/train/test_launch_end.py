"""How a launch ends before or outside the step loop: a stop signal during preflight, and
a non-finite loss. Real `python -m aleph train` subprocesses and real signals."""

from __future__ import annotations

import json
import signal

import pytest

from aleph.errors import EXIT_STOPPED
from tests.train.conftest import run_train, start_train, train_cmd, wait_for_log


def _launches(run_dir):
    return json.loads((run_dir / "manifest.json").read_text())["launches"]


@pytest.mark.parametrize(("sig", "phase"), [(signal.SIGTERM, "tokens"), (signal.SIGINT, "model")])
def test_stop_during_preflight_exits_76_records_stopped_and_resumes(train_work, sig, phase):
    run_dir = train_work / "runs" / "smoke" / "a2_dense-s6"
    cmd = train_cmd("a2_dense", 6, "max_steps=2")
    proc = start_train(train_work, cmd, ALEPH_TRAIN_PAUSE_IN_PREFLIGHT=phase)
    wait_for_log(run_dir, f"paused in preflight before {phase}", proc)
    proc.send_signal(sig)
    proc.send_signal(sig)  # a second one (srun, torchrun) is the same stop
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_STOPPED, out
    assert f"stopped by {sig.name} in preflight (before the first step)" in out
    [launch] = _launches(run_dir)
    assert (launch["status"], launch["exit_status"]) == ("stopped", EXIT_STOPPED)
    assert launch["note"] == f"{sig.name} before the first step" and launch["end"]
    # nothing trained, nothing saved as if it were
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "weights").exists()
    tokens = train_work / "cache" / "tokens"
    if phase == "tokens":  # stopped before the token store: none exists, complete or not
        assert not tokens.exists() or list(tokens.iterdir()) == []

    again = run_train(train_work, cmd)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resume: fresh start" in again.stdout
    assert ("token store: built" in again.stdout) == (phase == "tokens")
    # the stopped launch is not taken for a killed one ('lost') by the next launch
    assert [(x["status"], x["exit_status"]) for x in _launches(run_dir)] == [
        ("stopped", EXIT_STOPPED), ("complete", 0)]


def test_stops_while_checking_the_inputs_leave_no_trace_and_exit_76(train_work):
    """Before the lock nothing is on record: three SIGTERMs end the launch at once, with the
    stopped status and a line saying nothing was written (no run directory)."""
    run_dir = train_work / "runs" / "smoke" / "a2_dense-s8"
    proc = start_train(train_work, train_cmd("a2_dense", 8, "max_steps=2"),
                       ALEPH_TRAIN_PAUSE_IN_PREFLIGHT="inputs")
    seen = []
    for line in proc.stdout:  # no run directory yet: the pause is announced on the console
        seen.append(line)
        if "paused in preflight before inputs" in line:
            break
    for _ in range(3):
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    out = "".join(seen) + out
    assert proc.returncode == EXIT_STOPPED, out
    assert "stopped by SIGTERM before the launch was recorded" in out
    assert "Traceback" not in out and not run_dir.exists()


def test_nonfinite_loss_exits_65_and_records_the_failure(train_work):
    run_dir = train_work / "runs" / "smoke" / "a2_dense-s7"
    proc = run_train(train_work, train_cmd("a2_dense", 7, "max_steps=4", "lr=1.0e+30",
                                           "warmup_steps=0"))
    assert proc.returncode == 65, proc.stdout + proc.stderr
    assert "aleph train: error: step 2: loss is nan" in proc.stderr
    [launch] = _launches(run_dir)
    assert (launch["status"], launch["exit_status"]) == ("failed", 65)
    assert launch["note"].startswith("NonFiniteError: step 2")


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process `pid` has a handler for `sig` (SigCgt of /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    return bool(mask >> (sig - 1) & 1)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_a_stop_while_the_launch_still_imports_exits_76_with_its_line(train_work, sig):
    """A stop signal is the launch's stop from the first lines of `aleph train` on: sent as
    soon as the process catches it (torch not yet imported), it ends with exit 76 and the
    stopped line, not a death by signal (143, no line: a Slurm element would count as
    failed); SIGHUP (a dropped ssh session) is a stop like SIGTERM."""
    import time

    run_dir = train_work / "runs" / "smoke" / "a2_dense-s9"
    proc = start_train(train_work, train_cmd("a2_dense", 9, "max_steps=2"))
    deadline = time.monotonic() + 60
    while not _catches(proc.pid, sig):
        assert proc.poll() is None and time.monotonic() < deadline, "never caught " + sig.name
        time.sleep(0.005)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_STOPPED, out
    assert f"stopped by {sig.name} before the launch was recorded" in out, out
    assert "Traceback" not in out and not run_dir.exists()


def test_a_stop_before_the_stopflag_is_held_for_it_and_only_for_stoppable_commands():
    """hold_early (called first by the `aleph` process): a signal before the StopFlag exists
    becomes the StopFlag's stop; commands without one keep the default actions."""
    from aleph import _signals
    from aleph.train.signals import StopFlag, StopRequested

    old = {s: signal.getsignal(s) for s in _signals.STOP_SIGNALS}
    try:
        _signals.hold_early(["runs", "list"])
        assert {s: signal.getsignal(s) for s in _signals.STOP_SIGNALS} == old
        _signals.hold_early(["train", "--arm", "a2_dense"])
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGTERM)
        stop = StopFlag()
        try:
            assert stop.is_set() and (stop.signame, stop.repeats) == ("SIGUSR1", 1)
            with pytest.raises(StopRequested, match="stopped by SIGUSR1"):
                stop.set_mode("interrupt")
        finally:
            stop.restore()
        assert StopFlag().is_set() is False  # held once, for the first StopFlag only
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def test_a_console_that_went_away_does_not_change_how_a_stop_ends(train_work):
    """`aleph train | tee log` and Ctrl-C: tee dies too, so every later console write fails
    (EPIPE; a hung-up ssh terminal gives EIO): the stop is still saved, recorded and exit 76,
    and the launch log keeps the lines the console lost."""
    run_dir = train_work / "runs" / "smoke" / "a2_dense-s10"
    proc = start_train(train_work, train_cmd("a2_dense", 10, "max_steps=6"),
                       ALEPH_TRAIN_PAUSE_AFTER_STEP="3")
    log = wait_for_log(run_dir, "paused after step 3", proc)
    proc.stdout.close()  # the pipe's reader is gone
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == EXIT_STOPPED
    [launch] = _launches(run_dir)
    assert (launch["status"], launch["exit_status"]) == ("stopped", EXIT_STOPPED)
    text = log.read_text()
    assert "stopped by SIGINT" in text and "resume state saved: checkpoints/step-00000003" in text
    assert "Error" not in text.split("paused after step 3", 1)[1]
