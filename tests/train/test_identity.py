"""Run identity: the seed's duplicate-orchestrator incident as a test; launch logs and header."""

from __future__ import annotations

import json
import re
import signal

from aleph.errors import EXIT_STOPPED
from aleph.record.provenance import code_revision, source_sha256
from aleph.train.identity import LaunchLog, RunLock
from tests.train.conftest import run_train, start_train, train_cmd, wait_for_log


def _snapshot(run_dir):
    """Every file of the run, but the live launch's heartbeat (rewritten every few seconds
    by the launch that holds the lock, not by the duplicate), with the temporary file its
    atomic rewrite holds for a moment (`.<launch>.heartbeat.json.<random>.tmp`)."""
    return {p.relative_to(run_dir).as_posix(): p.read_bytes()
            for p in sorted(run_dir.rglob("*")) if p.is_file()
            and ".heartbeat.json" not in p.name}


def test_second_launch_exits_75_and_changes_nothing(train_work):
    run_dir = train_work / "runs" / "smoke" / "a2_dense-s1"
    first = start_train(train_work, train_cmd("a2_dense", 1, "max_steps=6"),
                        ALEPH_TRAIN_PAUSE_AFTER_STEP="2")
    log = wait_for_log(run_dir, "paused after step 2", first)
    before = _snapshot(run_dir)

    dup = run_train(train_work, train_cmd("a2_dense", 1, "max_steps=6"), timeout=120)
    assert dup.returncode == 75, dup.stdout + dup.stderr
    holder = json.loads((run_dir / "run.lock").read_text())
    assert f"pid {first.pid} on host {holder['host']}, started {holder['start']}" in dup.stderr
    assert holder["pid"] == first.pid
    assert _snapshot(run_dir) == before  # not one byte of the first run changed
    assert sorted(p.name for p in (run_dir / "launches").iterdir()) == sorted(
        [log.name, f"{log.stem}.heartbeat.json", f"{log.stem}.code.json"])

    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=60)
    assert first.returncode == EXIT_STOPPED, out
    text = log.read_text()
    assert text.startswith(before[f"launches/{log.name}"].decode())  # appended, never truncated
    launches = json.loads((run_dir / "manifest.json").read_text())["launches"]
    assert len(launches) == 1 and launches[0]["pid"] == first.pid


def test_header_order_and_tagging(train_work):
    run_dir = train_work / "runs" / "smoke" / "a2_dense-s2"
    proc = run_train(train_work, train_cmd("a2_dense", 2, "max_steps=2", "hf_token=hf_SECRET123"))
    assert proc.returncode == 0, proc.stderr
    (log,) = (run_dir / "launches").glob("*.log")
    launch_id = log.stem
    assert re.fullmatch(r"\d{8}T\d{6}Z-[\w.-]+-\d+", launch_id)
    lines = log.read_text().splitlines()
    assert all(line.startswith(f"[{launch_id}] ") for line in lines)
    messages = [line.split(" ", 2)[2] for line in lines]
    expected = ["launch ", "allocator cap: none", "VRAM probe: skipped: no CUDA", "config: {",
                "resume: fresh start"]
    positions = [next(i for i, m in enumerate(messages) if m.startswith(e)) for e in expected]
    assert positions == sorted(positions) == list(range(5)), messages[:6]
    assert any(m.startswith("target store: streaming (chosen by the quota planner)") for m in messages)
    # secrets never reach the log, the console or config.json
    for text in (log.read_text(), proc.stdout, (run_dir / "config.json").read_text()):
        assert "hf_SECRET123" not in text
    assert '"hf_token":"<redacted>"' in messages[3]

    again = run_train(train_work, train_cmd("a2_dense", 2, "max_steps=2"))
    assert again.returncode == 0, again.stderr
    assert "resume: step 2, samples seen 64, from checkpoints/step-00000002" in again.stdout
    assert "run already complete at step 2" in again.stdout
    assert "token store: cache hit" in again.stdout and "target store: cache hit" in again.stdout
    assert len(list((run_dir / "launches").glob("*.log"))) == 2


def test_lock_in_process_names_holder_and_released_lock_is_reusable(tmp_path):
    import pytest

    from aleph.errors import RunLocked

    a, b = RunLock(tmp_path), RunLock(tmp_path)
    a.acquire()
    with pytest.raises(RunLocked, match=r"locked by another launch \(pid \d+ on host"):
        b.acquire()
    a.release()
    b.acquire()
    b.release()


def test_launch_log_appends_and_tags(tmp_path):
    path = tmp_path / "x.log"
    for tag in ("L1", "L2"):
        log = LaunchLog(path, tag, echo=None)
        log("one\ntwo")
        log.close()
    lines = path.read_text().splitlines()
    assert [line.split(" ")[0] for line in lines] == ["[L1]", "[L1]", "[L2]", "[L2]"]
    assert [line.split(" ", 2)[2] for line in lines] == ["one", "two", "one", "two"]


def test_provenance(tmp_path, monkeypatch):
    from aleph.record import provenance as identity  # where code provenance lives

    baked = identity.package_dir() / "REVISION"
    if baked.is_file():  # inside the image
        assert code_revision() == baked.read_text().strip()
    else:  # a source checkout (or a copy without git)
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?|unknown", code_revision())
    pkg = tmp_path / "aleph"
    pkg.mkdir()
    (pkg / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(identity, "package_dir", lambda: pkg)
    assert code_revision() == "unknown"  # no REVISION file, not a git tree
    h1 = source_sha256()
    (pkg / "a.py").write_text("x = 2\n")
    assert source_sha256() != h1
    (pkg / "REVISION").write_text("ae93b6b\n")  # what the image bakes in wins
    assert code_revision() == "ae93b6b"
