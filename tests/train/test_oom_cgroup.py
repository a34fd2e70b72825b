"""A launch killed by the kernel's memory-cgroup OOM killer, for real, is named by the next.

As root, a child memory cgroup is made under this test's own cgroup (v1
memory.limit_in_bytes, v2 memory.max) with a limit above what a smoke launch needs and
below what a launch with a very wide FFN needs (measured on CPU: ~0.8 GB vs ~1.8 GB peak
RSS). The wide launch runs inside it until the kernel kills it; the next launch, outside,
must mark it lost with its last heartbeat and "likely killed by the cgroup OOM killer".
Skipped, with the reason, where no memory cgroup can be made.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.train.conftest import REPO, child_env, run_train, train_cmd

pytestmark = pytest.mark.slow

LIMIT = 1200 << 20
WIDE = ("ffn_dense=65536", "d_model=128")  # ~67M parameter bytes x4 (AdamW) + activations
COMMON = ("max_steps=2", "heartbeat_seconds=0.5", "store_headroom_gib=0")


def _own(controller: str) -> tuple[int, Path] | None:
    """(cgroup version, this process's own cgroup directory for `controller`)."""
    root = Path("/sys/fs/cgroup")
    text = Path("/proc/self/cgroup").read_text()
    if (root / "cgroup.controllers").exists():
        rel = next((ln[3:] for ln in text.splitlines() if ln.startswith("0::")), "/")
        return 2, root / rel.lstrip("/")
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and controller in parts[1].split(","):
            d = root / controller / parts[2].lstrip("/")
            return 1, d if d.is_dir() else root / controller
    return None


def _child_memory_cgroup(name: str, limit: int = LIMIT) -> tuple[int, Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a memory cgroup")
    own = _own("memory")
    if own is None:
        pytest.skip("no memory cgroup controller on this machine")
    version, parent = own
    child = parent / name
    try:
        child.mkdir(exist_ok=True)
    except OSError as e:
        pytest.skip(f"cannot create a child memory cgroup under {parent}: {e.strerror}")
    try:
        if version == 1:
            (child / "memory.limit_in_bytes").write_text(str(limit))
            (child / "memory.swappiness").write_text("0")  # be killed, not swapped
            memsw = child / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text(str(limit))
        else:
            if not (child / "memory.max").exists():
                child.rmdir()
                pytest.skip(f"the memory controller is not enabled for children of {parent}")
            (child / "memory.max").write_text(str(limit))
            swap = child / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
    except OSError as e:
        child.rmdir()
        pytest.skip(f"cannot set a memory limit in {child}: {e.strerror}")
    return version, child


def _in_cgroup(cg: Path, cmd: list[str], env: dict, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run `cmd` inside the cgroup: the shell joins it, then becomes the command."""
    return subprocess.run(["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cg), *cmd],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _remove(cg: Path) -> None:
    for _ in range(50):  # a killed process may take a moment to leave the cgroup
        try:
            cg.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def test_a_launch_the_cgroup_oom_killer_killed_is_named_by_the_next_launch(train_work):
    version, cg = _child_memory_cgroup(f"aleph-oom-test-{os.getpid()}")
    run_dir = train_work / "runs" / "smoke" / "a2_dense-s8"
    try:
        p = _in_cgroup(cg, train_cmd("a2_dense", 8, *COMMON, *WIDE), child_env(train_work))
        assert p.returncode in (-9, 137), (
            f"the wide launch was not killed by the kernel (exit {p.returncode}) in a "
            f"{LIMIT:,} B cgroup:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        events = (cg / ("memory.oom_control" if version == 1 else "memory.events")).read_text()
        assert "oom_kill 1" in events, events

        again = run_train(train_work, train_cmd("a2_dense", 8, *COMMON))  # outside the cgroup
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        _remove(cg)
    line = next(ln for ln in again.stdout.splitlines() if "lost: " in ln)
    message = line.split("lost: ", 1)[1]
    assert message.startswith(f"likely killed by the cgroup OOM killer at {LIMIT:,} of {LIMIT:,} bytes "
                              f"(oom_kill counter of memory cgroup {cg} rose 0 -> 1"), line
    assert "; last heartbeat " in message and "cgroup working set" in message
    lost, _ = json.loads((run_dir / "manifest.json").read_text())["launches"]
    assert lost["status"] == "lost" and lost["note"] == message
    assert lost["lost"]["oom"]["counter_now"] == 1 and lost["lost"]["last_heartbeat"]["pid"] == lost["pid"]
    print(line)  # the message for the closing note (pytest -s)


# The seed's incident at 1/92 scale: the seed's targets were 49.0 GB in a 111.0 GB envelope
# (0.44 of it); the in-RAM build holds every chunk and their concatenation (2x) at once.
SCALED_LIMIT = 1200 << 20
CHUNKS, CHUNK_ROWS, DIM = 4, 86_000, 768  # 4 x 132 MB fp16 = 528 MB = 0.44 of the limit
HEADROOM = 500_000_000  # the interpreter, torch and the CLI beside the store


def _peak_rss_of(cg: Path, cmd: list[str], env: dict) -> tuple[subprocess.CompletedProcess, int]:
    """Run `cmd` in the cgroup under a wrapper whose only child it is; its peak RSS in bytes."""
    import sys

    wrap = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
            "print('PEAK_RSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024); "
            "sys.exit(p.returncode)")
    p = _in_cgroup(cg, [sys.executable, "-c", wrap, *cmd], env)
    peak = next((int(ln.split()[1]) for ln in p.stdout.splitlines() if ln.startswith("PEAK_RSS")), -1)
    return p, peak


def test_the_seeds_in_ram_concatenate_is_killed_in_a_scaled_envelope_and_streaming_fits(tmp_path):
    import sys

    import numpy as np

    version, cg = _child_memory_cgroup(f"aleph-seed-incident-{os.getpid()}", SCALED_LIMIT)
    try:
        src = tmp_path / "targets"
        src.mkdir()
        rng = np.random.default_rng(0)
        for k in range(CHUNKS):
            rows = rng.standard_normal((CHUNK_ROWS, DIM), dtype=np.float32).astype(np.float16)
            np.save(src / f"chunk-{k:03d}.npy", rows)
            del rows
        store_bytes = CHUNKS * CHUNK_ROWS * DIM * 2
        env = {**os.environ, "PYTHONPATH": str(REPO), "ALEPH_WORK": str(tmp_path / "work"),
               "OMP_NUM_THREADS": "1"}
        aleph = [sys.executable, "-m", "aleph", "targets"]

        # the planner, run inside the cgroup, reads its limit and chooses streaming
        plan = _in_cgroup(cg, [*aleph, "plan", str(src), "--headroom", str(HEADROOM)], env)
        assert plan.returncode == 0, plan.stdout + plan.stderr
        assert f"memory quota: {SCALED_LIMIT:,} B" in plan.stdout, plan.stdout
        assert "in_ram    predicted peak" in plan.stdout and "REFUSED" in plan.stdout
        assert plan.stdout.splitlines()[-1].startswith("choice: streaming"), plan.stdout

        # forced past the planner, the in-RAM build is killed by the kernel
        killed = _in_cgroup(cg, [*aleph, "build", str(src), "--implementation", "in_ram",
                                 "--no-plan", "--out", str(tmp_path / "in_ram")], env)
        assert killed.returncode in (-9, 137), killed.stdout + killed.stderr
        events = (cg / ("memory.oom_control" if version == 1 else "memory.events")).read_text()
        assert "oom_kill 1" in events, events
        # it died holding the loaded chunks (0.44 of the limit, which fit) and their
        # concatenation: before the store file it writes after the cat was even created
        assert not (tmp_path / "in_ram" / "targets.bin.partial").exists()
        assert not (tmp_path / "in_ram" / "targets.bin").exists()

        # the streaming build of the same sources completes, far under the limit
        built, peak = _peak_rss_of(cg, [*aleph, "build", str(src), "--implementation", "streaming",
                                        "--out", str(tmp_path / "streaming")], env)
        assert built.returncode == 0, built.stdout + built.stderr
        assert f"{CHUNKS * CHUNK_ROWS:,} x {DIM} float16" in built.stdout
        assert 0 < peak < 0.75 * SCALED_LIMIT, f"streaming build peak RSS {peak:,} B"
    finally:
        _remove(cg)
    print(f"seed incident at 1/92: store {store_bytes:,} B in a {SCALED_LIMIT:,} B cgroup: in_ram "
          f"killed by the OOM killer; streaming built with peak RSS {peak:,} B "
          f"({100 * peak / SCALED_LIMIT:.0f}% of the limit)")
