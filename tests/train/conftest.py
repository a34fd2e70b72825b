"""Helpers for trainer tests: real `python -m aleph train` subprocesses on tiny smoke data."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMOKE_ROWS = 1024
# A tiny, quick, bitwise-repeatable config: 1024 rows / batch 32 = 32 steps per epoch.
TINY = ["--preset", "smoke", "--set", f"smoke_rows={SMOKE_ROWS}", "--set", "batch_size=32",
        "--set", "epochs=1", "--set", "warmup_steps=3", "--set", "log_every_steps=1",
        "--set", "weights_every_steps=0", "--set", "num_threads=1"]


def smoke_dir(work: Path, rows: int = SMOKE_ROWS) -> Path:
    """Where the trainer looks for smoke data of `rows` rows (aleph.data.smoke.default_root)."""
    return work / "data" / f"smoke-{rows}"


@pytest.fixture(scope="session")
def smoke_data_dir(tmp_path_factory) -> Path:
    """Smoke data generated once per session; tests copy it into their own work root."""
    from aleph.data.smoke import ensure_smoke_data

    root = tmp_path_factory.mktemp("smoke-cache") / "smoke"
    ensure_smoke_data(root, rows=SMOKE_ROWS)
    return root


@pytest.fixture
def train_work(work, smoke_data_dir) -> Path:
    shutil.copytree(smoke_data_dir, smoke_dir(work))
    return work


def child_env(work: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, ALEPH_WORK=str(work), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for hook in ("ALEPH_TRAIN_PAUSE_AFTER_STEP", "ALEPH_TRAIN_PAUSE_IN_PREFLIGHT", "ALEPH_FAULT"):
        env.pop(hook, None)
    env.update(extra)
    return env


def train_cmd(arm: str = "a2_dense", seed: int = 1, *sets: str) -> list[str]:
    cmd = [sys.executable, "-m", "aleph", "train", "--arm", arm, "--seed", str(seed), *TINY]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def run_train(work: Path, cmd: list[str], timeout: float = 240, **env) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, env=child_env(work, **env), capture_output=True,
                          text=True, timeout=timeout)


def completed_run(tmp_path_factory, smoke_data_dir: Path, arm: str, seed: int,
                  *sets: str) -> Path:
    """Run dir of an uninterrupted smoke run of (arm, seed, sets) in its own work root."""
    work = tmp_path_factory.mktemp(f"{arm}-s{seed}") / "work"
    shutil.copytree(smoke_data_dir, smoke_dir(work))
    proc = run_train(work, train_cmd(arm, seed, *sets))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return work / "runs" / "smoke" / f"{arm}-s{seed}"


@contextlib.contextmanager
def in_background(cmd: list[str], cwd: Path, env: dict, console: Path,
                  timeout: float = 300) -> Iterator[Callable[[], None]]:
    """Start `cmd` now (its output to the file `console`: no pipe to drain), to run beside
    what the caller does next; the value waits for it once, its exit 0 asserted."""
    with open(console, "w+") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                text=True)
        waited: list[bool] = []

        def wait() -> None:
            if not waited:
                rc = proc.wait(timeout)
                out.seek(0)
                assert rc == 0, out.read()[-6000:]
                waited.append(True)

        try:
            yield wait
        finally:
            proc.kill()  # a no-op once it has ended
            proc.wait()


def start_train(work: Path, cmd: list[str], **env) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env=child_env(work, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def kill_at_fault(work: Path, cmd: list[str], point: str, timeout: float = 240) -> str:
    """Run the trainer until it waits at fault point `point` (aleph._faults), SIGKILL it
    there; returns its console output."""
    marker = work.parent / f"reached-{point}"
    proc = start_train(work, cmd, ALEPH_FAULT=point, ALEPH_FAULT_FILE=str(marker))
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"trainer never reached {point} ({proc.wait()}):\n{proc.stdout.read()[-3000:]}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    out = proc.communicate()[0]
    assert proc.returncode == -signal.SIGKILL, out
    return out


def wait_for_log(run_dir: Path, text: str, proc: subprocess.Popen, timeout: float = 180) -> Path:
    """Wait until a launch log in run_dir contains `text`; fail early if proc exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in sorted((run_dir / "launches").glob("*.log")) if (run_dir / "launches").is_dir() else []:
            if text in log.read_text():
                return log
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"trainer exited ({proc.returncode}) before logging {text!r}:\n{out[-3000:]}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"timed out waiting for {text!r} in {run_dir}/launches")


def final_weights(run_dir: Path) -> dict:
    import safetensors.torch

    return safetensors.torch.load_file(str(run_dir / "weights" / "final" / "model.safetensors"))


def tb_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series under tb/, read back with TensorBoard's own EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tiny_trainer():
    """(config, model, optimizer, schedule) of a 1-layer a2 model, seeded: for tests of the
    step, the optimiser and the checkpoint that need no data."""
    import torch

    from aleph.model import ModelConfig, build_model
    from aleph.train.config import resolve
    from aleph.train.optim import make_optimizer, make_scheduler

    cfg = resolve("smoke", arm="a2_dense")
    torch.manual_seed(0)
    model = build_model(ModelConfig(arm="a2_dense", vocab_size=50, max_len=8, d_model=16,
                                    n_layers=1, n_heads=2, ffn_dense=32))
    opt = make_optimizer(model, cfg)
    return cfg, model, opt, make_scheduler(opt, cfg, 10)
