"""docker/entrypoint.sh under tini: `docker compose stop` (SIGTERM to PID 1) reaches the trainer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"

# Stands in for the trainer: reports its pid, waits, records the signal it gets.
CHILD = """
import os, signal, sys, time
out = sys.argv[1]
def on_term(signum, frame):
    with open(out, "a") as f:
        f.write(f"got {signal.Signals(signum).name} in {os.getpid()}\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
with open(out, "w") as f:
    f.write(f"ready {os.getpid()}\\n")
time.sleep(30)
sys.exit(9)
"""


def _launch(prefix: list[str], tmp_path: Path) -> tuple[subprocess.Popen, Path, int]:
    out = tmp_path / "child.log"
    env = {**os.environ, "ALEPH_WORK": str(tmp_path)}
    proc = subprocess.Popen(
        [*prefix, str(ENTRYPOINT), sys.executable, "-c", CHILD, str(out)], env=env
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if out.exists() and out.read_text().startswith("ready"):
            return proc, out, int(out.read_text().split()[1])
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("child never became ready")


def test_sigterm_to_tini_reaches_the_trainer(tini_bin, tmp_path):
    proc, out, child_pid = _launch([tini_bin, "--"], tmp_path)
    assert child_pid != proc.pid  # tini is the parent, as PID 1 in the container
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0  # tini exits with the child's status
    assert out.read_text().splitlines()[-1] == f"got SIGTERM in {child_pid}"


def test_entrypoint_execs_so_the_command_keeps_its_pid(tmp_path):
    proc, out, child_pid = _launch([], tmp_path)
    assert child_pid == proc.pid  # exec: no shell left between the signal and the trainer
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert out.read_text().splitlines()[-1] == f"got SIGTERM in {child_pid}"


def test_missing_work_root_is_created_and_status_passes_through(tmp_path):
    env = {**os.environ, "ALEPH_WORK": str(tmp_path / "absent" / "work")}
    p = subprocess.run([str(ENTRYPOINT), "sh", "-c", "exit 7"], env=env, timeout=20)
    assert p.returncode == 7
    assert (tmp_path / "absent" / "work").is_dir()


def _as_nobody() -> list[str]:
    # root writes anywhere: run as nobody (the image runs as 1000)
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []


def test_read_only_service_needs_a_readable_work_root_only():
    # tensorboard mounts the volume :ro; the writability check would restart it forever.
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)
        work = Path(top) / "work"
        work.mkdir(mode=0o555)
        env = {**os.environ, "ALEPH_WORK": str(work), "ALEPH_WORK_READ_ONLY": "1"}
        ok = subprocess.run([*_as_nobody(), str(ENTRYPOINT), "sh", "-c", "exit 5"], env=env,
                            capture_output=True, text=True, timeout=20)
        assert ok.returncode == 5, ok.stderr
        absent = {**env, "ALEPH_WORK": str(work / "absent")}
        p = subprocess.run([*_as_nobody(), str(ENTRYPOINT), "true"], env=absent,
                           capture_output=True, text=True, timeout=20)
    assert p.returncode == 73
    assert f"work root {work / 'absent'} is not a directory readable by uid" in p.stderr


def test_unwritable_work_root_fails_early_with_a_clear_message():
    with tempfile.TemporaryDirectory() as top:  # under /tmp: traversable by any uid
        os.chmod(top, 0o755)
        work = Path(top) / "work"
        work.mkdir(mode=0o555)
        prefix = []
        if os.geteuid() == 0:  # root writes anywhere: run as nobody (the image runs as 1000)
            prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        env = {**os.environ, "ALEPH_WORK": str(work)}
        p = subprocess.run(
            [*prefix, str(ENTRYPOINT), "true"], env=env, capture_output=True, text=True, timeout=20
        )
    assert p.returncode == 73
    assert f"work root {work} is not writable by uid" in p.stderr
