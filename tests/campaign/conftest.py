"""Helpers for campaign tests: real `python -m aleph campaign` processes on tiny smoke runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMOKE_ROWS = 1024
# Every run: the smoke preset on 1,024 rows, batch 32, 8 steps (a few seconds of training;
# most of a launch is starting Python and torch). Deterministic on CPU, one thread.
RUN_SETS = ["--set", f"smoke_rows={SMOKE_ROWS}", "--set", "batch_size=32", "--set", "max_steps=8"]
TRAIN_ARGS = ["--preset", "smoke", *RUN_SETS]


@pytest.fixture(scope="session")
def smoke_data_dir(tmp_path_factory) -> Path:
    """Smoke data generated once per session; tests copy it into their own work root."""
    from aleph.data.smoke import ensure_smoke_data

    root = tmp_path_factory.mktemp("campaign-smoke") / "smoke"
    ensure_smoke_data(root, rows=SMOKE_ROWS)
    return root


def seed_work(work: Path, smoke: Path) -> Path:
    """Put the smoke data where the trainer looks for it (aleph.data.smoke.default_root)."""
    shutil.copytree(smoke, work / "data" / f"smoke-{SMOKE_ROWS}")
    return work


@pytest.fixture
def campaign_work(work, smoke_data_dir) -> Path:
    return seed_work(work, smoke_data_dir)


def child_env(work: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, ALEPH_WORK=str(work), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for hook in ("ALEPH_TRAIN_PAUSE_AFTER_STEP", "ALEPH_TRAIN_PAUSE_IN_PREFLIGHT",
                 "ALEPH_FAULT"):
        env.pop(hook, None)
    env.update(extra)
    return env


def campaign_cmd(name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "aleph", "campaign", "--name", name, *TRAIN_ARGS,
            "--no-probes", "--poll-seconds", "0.2", *extra]


def start(work: Path, cmd: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env=child_env(work, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def read_state(work: Path, name: str) -> dict | None:
    path = work / "campaigns" / name / "campaign.json"
    return json.loads(path.read_text()) if path.is_file() else None  # written atomically


def wait_for(what: str, check, proc: subprocess.Popen, timeout: float = 180):
    """Poll `check()` until it returns a true value; fail early if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"campaign exited ({proc.returncode}) before {what}:\n{out[-3000:]}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"timed out waiting for {what}")
