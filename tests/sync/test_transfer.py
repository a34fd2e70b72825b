"""push/pull with a directory destination: roundtrip, only changed files sent, every sha256
checked, and a push or pull killed half way never leaves anything that looks complete."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aleph._io import sha256_file
from aleph.record.layout import PULLED
from aleph.record.layout import SYNC_STATE as STATE_FILE
from aleph.sync import SyncError, parse_destination, pull, push
from aleph.sync.dest import PAUSE_ENV
from aleph.sync.index import run_path
from aleph.sync.local import DirDestination
from tests.sync.conftest import REPO, aleph, child_env


def tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): sha256_file(p)
            for p in sorted(root.rglob("*")) if p.is_file()}


def synced_part(run_dir: Path) -> dict[str, str]:
    """What a push must carry: everything but the lock, the local record and the older state."""
    newest = sorted((run_dir / "checkpoints").iterdir())[-1].name
    return {k: v for k, v in tree(run_dir).items()
            if k not in ("run.lock", STATE_FILE, PULLED)
            and (not k.startswith("checkpoints/") or k.startswith(f"checkpoints/{newest}/"))}


def test_roundtrip_sends_only_what_changed_and_restores_byte_identical(run_copy, tmp_path):
    dest = tmp_path / "bucket"
    dest.mkdir()
    expected = synced_part(run_copy)
    (run_copy / "run.lock").write_text("{}")  # never synced
    (run_copy / "checkpoints" / "step-00000099").mkdir()  # a save in progress: no COMPLETE
    (run_copy / "checkpoints" / "step-00000099" / "meta.json").write_text("{}")
    (run_copy / "weights" / "step-00000099").mkdir()  # weights without their config: incomplete
    (run_copy / "weights" / "step-00000099" / "model.safetensors").write_bytes(b"x")

    first = push(run_copy, parse_destination(str(dest)))
    assert (first.revision, first.step, first.sent) == ("r1", 12, len(expected))
    again = push(run_copy, parse_destination(str(dest)))
    assert (again.revision, again.sent) == ("r1", 0)  # nothing changed: nothing written

    metrics = run_copy / "metrics.json"
    metrics.write_text(json.dumps({**json.loads(metrics.read_text()), "note": "changed"}))
    third = push(run_copy, parse_destination(str(dest)))
    assert (third.revision, third.sent, third.files) == ("r2", 1, len(expected))

    into = tmp_path / "new-work"
    (res,) = pull(parse_destination(str(dest)), into)
    assert (res.revision, res.step, res.path) == ("r2", 12, into / run_path(run_copy))
    restored = tree(res.path)
    assert restored.pop(STATE_FILE)  # the pulled hashes, so the first push re-hashes nothing
    assert restored.pop(PULLED)  # where it came from (a sync_to it came with is not adopted)
    assert restored == {**expected, "metrics.json": sha256_file(metrics)}
    assert not list(into.glob(".aleph-pull-*"))


def test_pruned_state_is_dropped_from_the_next_snapshot(run_copy, tmp_path):
    dest = DirDestination(tmp_path / "bucket")
    dest.root.mkdir()
    push(run_copy, dest)
    newest = sorted((run_copy / "checkpoints").iterdir())[-1]
    shutil.rmtree(newest)  # the older complete state is now the newest
    res = push(run_copy, dest)
    snap = dest.latest(run_path(run_copy))
    assert res.step == 9 and snap.step == 9
    assert not any(newest.name in rel for rel in snap.files)
    # four files of the older state (marker included) are new at the destination
    assert res.sent == 4


def test_pull_checks_every_sha256_and_leaves_nothing_on_a_mismatch(run_copy, tmp_path):
    dest = DirDestination(tmp_path / "bucket")
    dest.root.mkdir()
    push(run_copy, dest)
    rec = dest.latest(run_path(run_copy)).files["metrics.json"]
    obj = dest.root / run_path(run_copy) / "objects" / rec["sha256"][:2] / rec["sha256"]
    data = bytearray(obj.read_bytes())
    data[0] ^= 1
    obj.write_bytes(bytes(data))

    into = tmp_path / "new-work"
    with pytest.raises(SyncError, match=r"a2_dense-s5/metrics.json: sha256 .* records "
                       f"{rec['sha256'][:16]}.*damaged; nothing was restored"):
        pull(dest, into)
    assert not (into / run_path(run_copy)).exists()
    assert not list(into.glob(".aleph-pull-*"))

    # A plain push trusts the stored copy (that keeps it cheap); --verify re-hashes the
    # destination, sends the damaged file again, and the pull then restores the run.
    assert "up to date, nothing sent" in push(run_copy, dest).line()
    assert dest.damaged(run_path(run_copy), dest.latest(run_path(run_copy)), tmp_path) == [
        "metrics.json"]
    line = push(run_copy, dest, verify=True).line()
    assert "revision r2: 1 of " in line and "1 of them damaged at the destination" in line
    assert dest.damaged(run_path(run_copy), dest.latest(run_path(run_copy)), tmp_path) == []
    (restored,) = pull(dest, into)
    assert synced_part(restored.path) == synced_part(run_copy)
    assert "up to date, nothing sent" in push(run_copy, dest, verify=True).line()


def test_pull_never_replaces_an_existing_run(run_copy, tmp_path):
    dest = DirDestination(tmp_path / "bucket")
    dest.root.mkdir()
    push(run_copy, dest)
    work = run_copy.parents[len(Path(run_path(run_copy)).parts) - 1]
    before = tree(run_copy)
    with pytest.raises(SyncError, match="already exists; a pull never replaces"):
        pull(dest, work)
    assert tree(run_copy) == before


def _paused(proc: subprocess.Popen) -> None:
    """Wait for the sync pause hook's line on stderr."""
    deadline = time.monotonic() + 60
    line = ""
    while "sync pause hook" not in line:
        assert time.monotonic() < deadline and proc.poll() is None, f"no pause: {line}"
        line = proc.stderr.readline()


def _start(work: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "aleph", *args], cwd=REPO,
                            env=child_env(work, **{PAUSE_ENV: "2"}), stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)


def test_push_killed_mid_upload_leaves_the_previous_snapshot_pullable(run_copy, tmp_path):
    dest = tmp_path / "bucket"
    dest.mkdir()
    work = tmp_path / "work"
    push(run_copy, DirDestination(dest))
    before = synced_part(run_copy)
    newest = sorted((run_copy / "checkpoints").iterdir())[-1]
    shutil.rmtree(newest)  # next push: the other state's 4 files plus the changed metrics
    (run_copy / "metrics.json").write_text("{}")

    proc = _start(work, "runs", "push", str(run_copy), "--to", str(dest))
    _paused(proc)  # two files sent, no index yet
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL

    into = tmp_path / "after-kill"
    out = aleph(work, "runs", "pull", str(dest), "--into", str(into))
    assert out.returncode == 0, out.stderr
    assert "revision r1 (step 12)" in out.stdout
    restored = tree(into / run_path(run_copy))
    restored.pop(STATE_FILE)
    restored.pop(PULLED)
    assert restored == before

    again = aleph(work, "runs", "push", str(run_copy), "--to", str(dest))
    assert again.returncode == 0, again.stderr
    # 5 files differ from the snapshot; the two the killed push stored are found in place
    assert "revision r2: 5 of" in again.stdout
    leftovers = [p for p in dest.rglob(".*") if p.name.startswith(".tmp-") or p.suffix == ".tmp"]
    assert leftovers == []


def test_pull_killed_midway_leaves_no_run_directory(run_copy, tmp_path):
    dest = tmp_path / "bucket"
    dest.mkdir()
    push(run_copy, DirDestination(dest))
    into = tmp_path / "new-work"
    proc = _start(into, "runs", "pull", str(dest), "--into", str(into))
    _paused(proc)  # two files fetched and verified, the rest not
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    assert not (into / "runs").exists()  # nothing lists or resumes a half-pulled run
    assert [p.name.split("-")[2] for p in into.glob(".aleph-pull-*")] == [str(proc.pid)]

    out = aleph(into, "runs", "pull", str(dest))  # --into defaults to ALEPH_WORK
    assert out.returncode == 0, out.stderr
    assert (into / run_path(run_copy) / "weights" / "final" / "model.safetensors").is_file()
    assert not list(into.glob(".aleph-pull-*"))  # the killed pull's staging is cleared
    assert os.listdir(into) == ["runs"]


def test_an_unchanged_push_does_not_read_weights_or_states_again(run_copy, tmp_path):
    """The local record spares reading files that never change once written: a push of an
    unchanged run costs the mutable files only, however many weights and states it holds.
    Shown by changing final weights in place behind the record's back (same size, mtime and
    inode): a push that re-read them would send them."""
    dest = DirDestination(tmp_path / "bucket")
    dest.root.mkdir()
    push(run_copy, dest)
    weights = run_copy / "weights" / "final" / "model.safetensors"
    st = weights.stat()
    with open(weights, "r+b") as f:
        f.seek(st.st_size - 1)
        last = f.read(1)
        f.seek(st.st_size - 1)
        f.write(bytes([last[0] ^ 1]))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert push(run_copy, dest).sent == 0

    (run_copy / STATE_FILE).unlink()  # the record lost: everything is read, the change seen
    res = push(run_copy, dest)
    assert (res.sent, res.revision) == (1, "r2")


@pytest.mark.parametrize("existing", [False, True])
def test_a_refused_pull_removes_only_the_directories_it_made(tmp_path, existing):
    """One damaged object: the refusal leaves no new --into (nor its new parents); an --into
    that was there before stays."""
    from tests.sync.test_hostile_dir import small_run

    bucket = tmp_path / "bucket"
    bucket.mkdir()
    run_dir = small_run(tmp_path / "work")
    push(run_dir, DirDestination(bucket))
    obj = max((p for p in (bucket / run_path(run_dir) / "objects").rglob("*") if p.is_file()),
              key=lambda p: p.stat().st_size)
    data = obj.read_bytes()
    obj.chmod(0o644)
    obj.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    into = tmp_path / "new" / "a" / "work"
    if existing:
        into.mkdir(parents=True)
    with pytest.raises(SyncError, match="damaged"):
        pull(DirDestination(bucket), into)
    if existing:
        assert into.is_dir() and list(into.iterdir()) == []
    else:
        assert not (tmp_path / "new").exists(), sorted(tmp_path.joinpath("new").rglob("*"))
