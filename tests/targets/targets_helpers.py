"""Helpers shared by the target store tests (imported by name: pytest puts this
directory on sys.path, and the name is unique across the test tree)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[2]


def save_chunk(t: torch.Tensor, path: Path) -> Path:
    """Write one chunk in the format its suffix names."""
    if path.suffix == ".pt":
        torch.save(t, path)
    elif path.suffix == ".npy":
        np.save(path, t.numpy())
    elif path.suffix == ".safetensors":
        save_file({"targets": t.contiguous()}, str(path))
    else:
        raise ValueError(path)
    return path


def run_cli(args: list[str], env_extra: dict | None = None, **kw) -> subprocess.Popen:
    """Start `python -m aleph <args>` in a subprocess rooted at the repo."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "aleph", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Wait until `path` exists (the builder reached its fault point)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"builder exited {proc.returncode} before the fault point:\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"builder never reached {path}")
        time.sleep(0.02)


def store_bytes(store_dir: Path) -> bytes:
    return (Path(store_dir) / "targets.bin").read_bytes()


def scramble_keep_stat(path: Path) -> None:
    """Overwrite a file with garbage of the same size and restore its mtime: anything
    that reads it afterwards fails or produces different bytes (works as root too,
    where chmod 000 does not stop reads)."""
    st = path.stat()
    path.write_bytes(b"\xff" * st.st_size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def scramble_rows_keep_stat(path: Path) -> None:
    """Overwrite only the rows of an .npy/.safetensors chunk (header intact, same size
    and mtime): a build that re-reads them writes different bytes."""
    from aleph.targets import inspect_chunk

    info = inspect_chunk(path)
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(info.data_offset)
        f.write(b"\xff" * info.nbytes)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
