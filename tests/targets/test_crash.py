"""Crash safety, the build lock, and disk full: real subprocess builds, really killed.

The builder is stopped at a named fault point (ALEPH_FAULT, see
aleph._faults.fault_point) and SIGKILLed there. Afterwards the store must not
open as complete, and the next build must produce bytes identical to an
uninterrupted build. The rows of chunks already recorded are scrambled (header, size
and mtime kept) before resuming: the result is right only if the resume did not
re-read them.
"""

from __future__ import annotations

import resource
import signal

import numpy as np
import pytest
import torch
from targets_helpers import run_cli, scramble_rows_keep_stat, store_bytes, wait_for

from aleph.errors import StoreError
from aleph.targets import build_store, open_store, verify_store

ROWS = (40, 25, 33, 12)
pytestmark = pytest.mark.slow  # a dozen subprocess builds: deselect with -m 'not slow'


def _kill_at(paths, out, point, tmp_path, impl="streaming"):
    marker = tmp_path / f"reached-{point}"
    proc = run_cli(["targets", "build", *map(str, paths), "--out", str(out), "--implementation", impl,
                    "--no-plan"], {"ALEPH_FAULT": point, "ALEPH_FAULT_FILE": str(marker)})
    wait_for(marker, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("point,recorded", [("written:0", 0), ("recorded:1", 2), ("written:2", 2),
                                            ("recorded:3", 4), ("finalize-renamed:0", 4)])
def test_streaming_kill_then_resume_is_byte_identical(make_chunks, tmp_path, point, recorded):
    paths, ref = make_chunks(rows=ROWS, suffixes=(".npy", ".safetensors"))
    out = tmp_path / "s"
    _kill_at(paths, out, point, tmp_path)
    with pytest.raises(StoreError, match="no manifest"):
        open_store(out)
    for p in paths[:recorded]:
        scramble_rows_keep_stat(p)  # resume must take these rows from the partial file
    build_store(paths, out)
    assert store_bytes(out) == ref.numpy().tobytes()
    assert verify_store(out, full=True)["ok"]
    assert not (out / "build.json").exists() and not (out / "targets.bin.partial").exists()


def test_corrupted_partial_chunk_is_rewritten(make_chunks, tmp_path):
    paths, ref = make_chunks(rows=ROWS, suffixes=(".npy",))
    out = tmp_path / "s"
    _kill_at(paths, out, "recorded:2", tmp_path)
    with open(out / "targets.bin.partial", "r+b") as f:  # damage recorded chunk 1
        f.seek(45 * 16)
        f.write(b"\x00" * 16)
    build_store(paths, out)
    assert store_bytes(out) == ref.numpy().tobytes()


def test_kill_during_switch_over_never_mixes_old_and_new(make_chunks, tmp_path):
    old_paths, old_ref = make_chunks(rows=(7, 7), seed=1, subdir="old")
    paths, ref = make_chunks(rows=ROWS)
    out = tmp_path / "s"
    build_store(old_paths, out)
    _kill_at(paths, out, "written:1", tmp_path)
    assert torch.equal(open_store(out).gather(np.arange(14)), old_ref)  # old store untouched
    _kill_at(paths, out, "finalize-unlinked:0", tmp_path)
    with pytest.raises(StoreError, match="no manifest"):
        open_store(out)
    build_store(paths, out)
    assert store_bytes(out) == ref.numpy().tobytes()


def test_in_ram_kill_restarts_cleanly(make_chunks, tmp_path):
    paths, ref = make_chunks(rows=ROWS)
    out = tmp_path / "s"
    for point in ("concatenated:0", "finalize-renamed:0"):
        _kill_at(paths, out, point, tmp_path, impl="in_ram")
        with pytest.raises(StoreError, match="no manifest"):
            open_store(out)
    store = build_store(paths, out, "in_ram")
    assert store_bytes(out) == ref.numpy().tobytes() and store.implementation == "in_ram"


def test_second_builder_fails_clearly_or_waits(make_chunks, tmp_path):
    paths, ref = make_chunks(rows=ROWS)
    out = tmp_path / "s"
    marker = tmp_path / "paused"
    first = run_cli(["targets", "build", *map(str, paths), "--out", str(out)],
                    {"ALEPH_FAULT": "written:1", "ALEPH_FAULT_FILE": str(marker)})
    wait_for(marker, first)
    with pytest.raises(StoreError, match=rf"another process \(pid {first.pid}\) is building"):
        build_store(paths, out, lock_timeout_s=0.3)
    waiter = run_cli(["targets", "build", *map(str, paths), "--out", str(out)])
    with pytest.raises(Exception, match="timed out"):
        waiter.wait(timeout=1.5)  # still waiting for the lock
    first.send_signal(signal.SIGKILL)  # the kernel frees the flock of a dead holder
    first.communicate()
    out_text, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err
    assert store_bytes(out) == ref.numpy().tobytes()


def test_disk_full_fails_clearly_and_keeps_the_old_store(make_chunks, tmp_path):
    old_paths, old_ref = make_chunks(rows=(7, 7), seed=1, subdir="old")
    paths, _ = make_chunks(rows=(3000, 3000), dim=64, subdir="big")  # 768,000 B store
    out = tmp_path / "s"
    build_store(old_paths, out)
    limit = 256 << 10

    def cap():  # RLIMIT_FSIZE: writes past `limit` bytes fail with EFBIG, like a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = run_cli(["targets", "build", *map(str, paths), "--out", str(out)], preexec_fn=cap)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "targets.bin.partial: disk full while reserving 768,000 bytes" in err
    assert not (out / "targets.bin.partial").exists()
    assert torch.equal(open_store(out).gather(np.arange(14)), old_ref)
