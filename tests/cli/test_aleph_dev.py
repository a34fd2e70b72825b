"""./aleph-dev, the bare-machine wrapper: signals reach the program, paths are the caller's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aleph.errors import EXIT_STOPPED

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "aleph-dev"


@pytest.fixture
def stamped_venv():
    # The wrapper runs commands in .venv once its stamp matches the locks; elsewhere (the
    # image, a bare checkout without the venv) it would first build a 6 GB venv.
    if Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
        pytest.skip("not running in the repository's .venv (made by ./aleph-dev)")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALEPH_")}
    return {**env, **extra}


def test_sigterm_to_the_wrapper_pid_stops_the_trainer_cleanly(stamped_venv, tmp_path):
    out = tmp_path / "console.log"
    with open(out, "w") as f:
        proc = subprocess.Popen(
            [str(WRAPPER), "train-a2", "--seed", "9", "--set", "max_steps=4"],
            stdout=f, stderr=subprocess.STDOUT, cwd=tmp_path,
            env=_env(ALEPH_WORK=str(tmp_path / "w"), ALEPH_TRAIN_PAUSE_AFTER_STEP="2"))
    deadline = time.monotonic() + 180
    while "paused after step 2" not in out.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, out.read_text()[-2000:]
        time.sleep(0.2)
    # The pid the caller holds is the trainer itself (exec), not a shell around it.
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
    assert b"-m" in cmdline and b"aleph" in cmdline, cmdline
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == EXIT_STOPPED
    text = out.read_text()
    assert "stopped by SIGTERM after step 2" in text
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _is_child(p, proc.pid)]


def _is_child(proc_dir: Path, parent: int) -> bool:
    try:
        stat = (proc_dir / "stat").read_text()
    except OSError:
        return False
    return int(stat.rsplit(")", 1)[1].split()[1]) == parent


def test_relative_paths_are_the_callers(stamped_venv, tmp_path):
    # A relative path given from another directory names a place there, not in the checkout.
    (tmp_path / "elsewhere").mkdir()
    p = subprocess.run([str(WRAPPER), "aleph", "runs", "list", "elsewhere"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env=_env())
    assert p.returncode == 2
    assert "elsewhere/runs: no runs directory (is elsewhere a work root?" in p.stderr, p.stderr
    (tmp_path / "elsewhere" / "runs").mkdir()
    p = subprocess.run([str(WRAPPER), "aleph", "runs", "list", "elsewhere"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env=_env())
    assert p.returncode == 0, p.stderr
