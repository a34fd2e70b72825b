"""The lost VM, for real: a smoke run syncing itself is killed with SIGKILL, its whole work
root deleted, the run pulled into a fresh work root and relaunched there; it resumes from
the last synced resume state and ends byte-identical (sha256 of the final weights) to an
uninterrupted run. Once through a directory destination, once through the hub (the local
stand-in); and a destination lost mid-run: training finishes, a later push catches up."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from aleph.sync.hub import HubDestination
from aleph.sync.index import run_path
from aleph.sync.local import DirDestination
from tests.sync.conftest import (
    ARM,
    SEED,
    SETS,
    aleph,
    final_sha,
    find_run,
    new_work,
)
from tests.sync.fake_hub import FakeHub
from tests.train.conftest import run_train, start_train, train_cmd, wait_for_log

pytestmark = pytest.mark.slow  # seven trainer subprocesses (~45 s): -m 'not slow' skips
TOKEN = "hf_aleph_lost_vm_token_9876543210"


def wait_for(what: str, check, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def lose_vm_and_resume(reference_run: Path, smoke_data: Path, tmp_path: Path, dest, spec: str,
                       **env: str) -> str:
    """Train with sync on, SIGKILL after step 7, delete the work root, pull, relaunch."""
    sets = (*SETS, f"sync_to={spec}", "sync_every_minutes=0")
    run = run_path(reference_run)
    work = new_work(tmp_path / "vm1", smoke_data)
    proc = start_train(work, train_cmd(ARM, SEED, *sets), ALEPH_TRAIN_PAUSE_AFTER_STEP="7", **env)
    wait_for_log(work / run, "paused after step 7", proc)
    # the resume state of step 6 was handed to the sync worker; wait until it has landed
    wait_for("the sync of step 6", lambda: (s := dest.latest(run)) is not None and s.step == 6)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    shutil.rmtree(tmp_path / "vm1")  # the VM and its volume are gone

    work = new_work(tmp_path / "vm2", smoke_data)
    pulled = aleph(work, "runs", "pull", spec, **env)
    assert pulled.returncode == 0, pulled.stderr
    assert f"pulled {run} from {spec} revision " in pulled.stdout
    assert "(step 6): " in pulled.stdout and "every sha256 verified" in pulled.stdout
    again = run_train(work, train_cmd(ARM, SEED, *sets), **env)
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = "resume: step 6, samples seen 192, from checkpoints/step-00000006"
    assert resumed in again.stdout
    assert final_sha(work / run) == final_sha(reference_run)
    launches = json.loads((work / run / "manifest.json").read_text())["launches"]
    assert [x["status"] for x in launches] == ["lost", "complete"]
    assert "sync" in launches[-1], "\n".join(x for x in again.stdout.splitlines() if "sync" in x)
    assert launches[-1]["sync"]["step"] == 12 and dest.latest(run).step == 12
    print(f"\n{pulled.stdout.strip()}\n{[x for x in again.stdout.splitlines() if resumed in x][0]}"
          f"\nfinal weights sha256: resumed {final_sha(work / run)} == uninterrupted "
          f"{final_sha(reference_run)}")
    return work


def test_lost_vm_resumes_from_a_directory_destination(reference_run, smoke_data_dir, tmp_path):
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    lose_vm_and_resume(reference_run, smoke_data_dir, tmp_path, DirDestination(bucket), str(bucket))


def test_lost_vm_resumes_from_the_hub(reference_run, smoke_data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    env = {"HF_TOKEN": TOKEN, "HF_HOME": str(tmp_path / "hf-home")}
    with FakeHub(tmp_path / "hub", token=TOKEN) as hub:
        env["HF_ENDPOINT"] = hub.endpoint
        dest = HubDestination("me/aleph-runs", endpoint=hub.endpoint)
        work = lose_vm_and_resume(reference_run, smoke_data_dir, tmp_path, dest,
                                  "hf:me/aleph-runs", **env)
    written = [p for p in [*work.rglob("*"), *(tmp_path / "hub").rglob("*")] if p.is_file()]
    assert not [p for p in written if TOKEN.encode() in p.read_bytes()]


def test_destination_lost_mid_run_training_finishes_and_a_later_push_catches_up(
        smoke_data_dir, tmp_path):
    bucket, away = tmp_path / "bucket", tmp_path / "bucket-away"
    bucket.mkdir()
    work = new_work(tmp_path / "vm", smoke_data_dir)
    sets = ("epochs=2", "max_steps=48", "ckpt_every_steps=4", f"sync_to={bucket}",
            "sync_every_minutes=0")
    proc = start_train(work, train_cmd(ARM, SEED + 1, *sets))
    wait_for("the first sync", lambda: DirDestination(bucket).runs())
    os.kill(proc.pid, signal.SIGSTOP)  # swap the destination for a file while it is frozen
    bucket.rename(away)
    bucket.write_text("the mount is gone")  # unwritable for root too
    os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert f"sync: push to {bucket} failed (attempt 1): " in out
    assert "training continues; retrying in" in out
    assert (f"sync: final push to {bucket} failed (attempt 3 of 3): SyncError: sync destination "
            f"{bucket}: not a directory") in out
    assert "launch ended: complete: 48 steps" in out
    run_dir = find_run(work)
    last = json.loads((run_dir / "manifest.json").read_text())["launches"][-1]["sync"]
    assert last["step"] < 48  # the last sync that worked, before the destination went

    bucket.unlink()
    away.rename(bucket)  # the destination is back
    push = aleph(work, "runs", "push", str(run_dir))  # to the run's own sync_to
    assert push.returncode == 0, push.stderr
    assert f"synced {run_path(run_dir)} step 48 -> {bucket} revision r" in push.stdout
    into = tmp_path / "vm2" / "work"
    pulled = aleph(into, "runs", "pull", str(bucket))
    assert pulled.returncode == 0, pulled.stderr
    assert final_sha(into / run_path(run_dir)) == final_sha(run_dir)
    print(f"\n{push.stdout.strip()}\n{pulled.stdout.strip()}")


@pytest.mark.parametrize("at", [7, 12], ids=["mid-run", "last-step"])
def test_a_stop_waits_for_a_hung_push_at_most_sync_stop_wait_seconds(smoke_data_dir, tmp_path, at):
    """A Slurm lead (300 s) must cover the stop's final push: a push that hangs is cut
    at sync_stop_wait_seconds (it was FINAL_WAIT_S, 900 s), also for a stop that comes
    after the last step (the launch is complete, the stop recorded); a relaunch pushes."""
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    work = new_work(tmp_path / "vm", smoke_data_dir)
    sets = (*SETS, f"sync_to={bucket}", "sync_every_minutes=0", "sync_stop_wait_seconds=2")
    cmd = train_cmd(ARM, SEED + 2, *sets)
    proc = start_train(work, cmd, ALEPH_TRAIN_PAUSE_AFTER_STEP=str(at),
                       ALEPH_SYNC_PAUSE_AFTER_FILES="1")  # the first push hangs after a file
    run_dir = work / "runs" / "smoke" / f"{ARM}-s{SEED + 2}"
    wait_for_log(run_dir, f"paused after step {at}", proc)
    wait_for("the hung push's first object", lambda: list(bucket.glob("runs/**/objects/*/*")))
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    waited = time.monotonic() - t0
    assert proc.returncode == (76 if at < 12 else 0), out
    assert (f"sync: final push to {bucket} still running 2 s after the SIGTERM; abandoned (the "
            "destination keeps what an earlier push left there, if any); push later with `aleph "
            f"runs push {run_dir}`") in out
    assert waited < 60, waited  # 2 s asked; unbounded by the stop it was 900 s
    assert DirDestination(bucket).runs() == []  # the cut push published nothing
    if at == 12:
        assert "launch ended: complete: 12 steps; SIGTERM after the last step" in out
        launch = json.loads((run_dir / "manifest.json").read_text())["launches"][-1]
        assert (launch["status"], launch["note"]) == ("complete", "12 steps; SIGTERM after the last step")

    again = run_train(work, cmd)  # the relaunch (resumes or has nothing to train) pushes it all
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"sync: final: synced {run_path(run_dir)} step 12 -> {bucket} revision r" in again.stdout
    assert DirDestination(bucket).latest(run_path(run_dir)).step == 12
    print(f"\nstop after step {at} with a hung push: exit {proc.returncode} after {waited:.1f} s "
          "(sync_stop_wait_seconds=2)")
