"""Shared material of the sync tests: one real, uninterrupted smoke run (sync off).

It is the unit tests' run directory (each test pushes its own copy) and the lost-VM
tests' reference: a run resumed elsewhere must end with byte-identical final weights.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aleph._io import sha256_file
from aleph.sync.index import run_path
from tests.train.conftest import (  # noqa: F401  (smoke_data_dir: the session's smoke data)
    REPO,
    child_env,
    run_train,
    smoke_data_dir,
    smoke_dir,
    train_cmd,
)

ARM, SEED = "a2_dense", 5
# 12 steps, a resume state every 3, dropout on: a resumed run matches only if every RNG
# state travelled with the resume state.
SETS = ("max_steps=12", "ckpt_every_steps=3", "dropout=0.1")


def find_run(work: Path) -> Path:
    """The one run directory under `work` (wherever the trainer puts runs of this preset)."""
    found = sorted(p.parent for p in Path(work).glob("runs/**/manifest.json"))
    assert len(found) == 1, found
    return found[0]


def final_sha(run_dir: Path) -> str:
    return sha256_file(run_dir / "weights" / "final" / "model.safetensors")


def new_work(root: Path, smoke_data: Path) -> Path:
    """A fresh work root holding only the smoke data (what a new VM regenerates offline)."""
    work = root / "work"
    shutil.copytree(smoke_data, smoke_dir(work))
    return work


def aleph(work: Path, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """`python -m aleph ARGS` with ALEPH_WORK=work."""
    return subprocess.run([sys.executable, "-m", "aleph", *args], cwd=REPO,
                          env=child_env(work, **env), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, smoke_data_dir) -> Path:  # noqa: F811
    work = new_work(tmp_path_factory.mktemp("sync-reference"), smoke_data_dir)
    proc = run_train(work, train_cmd(ARM, SEED, *SETS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return find_run(work)


@pytest.fixture
def run_copy(reference_run, tmp_path) -> Path:
    """A copy of the reference run in a fresh work root, at the same path under it."""
    out = tmp_path / "work" / run_path(reference_run)
    shutil.copytree(reference_run, out, ignore=shutil.ignore_patterns("run.lock"))
    return out
