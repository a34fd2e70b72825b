"""docker/host_check.py on fabricated hosts, and for real on this machine."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "docker" / "host_check.py"
GIB = 1 << 30


@pytest.fixture(scope="module")
def hc():
    spec = importlib.util.spec_from_file_location("host_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["host_check"] = mod  # dataclasses resolve the module by name
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def ready(hc):
    """The seed host as a Docker host: everything in place."""
    return hc.HostFacts(
        driver="570.195.03",
        gpu_count=2,
        toolkit_hook="/usr/bin/nvidia-container-runtime-hook",
        docker="27.5.1",
        compose="2.29.7",
        work_dir="/srv/aleph",
        free_bytes=400 * 10**9,
        mem_total_bytes=540_644_167_680,
        cpu_count=96,
    )


def test_ready_host_passes(hc, ready):
    assert hc.evaluate(ready) == []


@pytest.mark.parametrize(
    "driver, ok",
    [
        ("550.54.15", True),
        ("550.54.14", False),
        ("535.183.01", False),
        ("580.65.06", True),
        ("garbage", False),
    ],
)
def test_driver_minimum_is_cuda_12_4_1(hc, ready, driver, ok):
    problems = hc.evaluate(dataclasses.replace(ready, driver=driver))
    assert (problems == []) is ok
    if not ok:
        assert problems == [f"NVIDIA driver: found {driver}, CUDA 12.4.1 needs >= 550.54.15"]


def test_disk_threshold_is_store_plus_headroom(hc, ready):
    need = 49_007_026_176 + 64 * GIB
    assert hc.evaluate(dataclasses.replace(ready, free_bytes=need)) == []
    (p,) = hc.evaluate(dataclasses.replace(ready, free_bytes=need - 1))
    assert f"{need - 1:,} B free, need {need:,} B" in p and "49,007,026,176" in p
    assert hc.evaluate(dataclasses.replace(ready, free_bytes=need - 1), headroom_bytes=0) == []


def test_ram_against_the_envelope_and_a_small_host_is_only_noted(hc, ready):
    small = dataclasses.replace(ready, mem_total_bytes=64 * GIB, cpu_count=16)
    (problem,) = hc.evaluate(small)
    assert problem.startswith("host RAM: 68,719,476,736 B, need 115,294,965,760 B")
    # A 16-thread workstation can run the arms: the cfs quota starts on any host.
    assert hc.evaluate(dataclasses.replace(ready, cpu_count=16)) == []
    (note,) = hc.notes(small)
    assert note.startswith("CPUs: 16 visible, fewer than the envelope's 17.85-CPU quota "
                           "(cfs 1,785,000 / 100,000)")
    assert hc.notes(dataclasses.replace(ready, cpu_count=18)) == []


def test_missing_tooling_is_each_named(hc, ready):
    bare = dataclasses.replace(
        ready,
        driver=None,
        gpu_count=0,
        toolkit_hook=None,
        docker=None,
        compose="1.29.2",
        free_bytes=None,
    )
    problems = hc.evaluate(bare)
    assert [p.split(":")[0] for p in problems] == [
        "NVIDIA driver",
        "NVIDIA container toolkit",
        "Docker Engine",
        "Docker Compose v2",
        "work volume",
    ]


def test_runs_for_real(tmp_path):
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--work-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    last = p.stdout.rstrip().splitlines()[-1]
    assert (p.returncode, last == "host check: OK") in ((0, True), (1, False)), p.stdout
    assert "None" not in p.stdout  # words for what is absent, on this very machine
    if shutil.which("nvidia-smi") is None:  # a CPU machine must be told it lacks the driver
        assert p.returncode == 1
        assert "MISSING: NVIDIA driver: nvidia-smi not found" in p.stdout
        assert "HINT: without Docker (README, 'On any Linux x86_64 machine without Docker')" in p.stdout


def test_script_parses_as_python_3_10():
    # It runs with the host's python3: 3.10 on Ubuntu 22.04, the cloud-init target.
    ast.parse(SCRIPT.read_text(), feature_version=(3, 10))


def test_facts_line_says_absent_not_none_and_points_a_gpu_less_host_elsewhere(hc, ready):
    bare = dataclasses.replace(ready, driver=None, gpu_count=0, toolkit_hook=None, docker=None,
                               compose=None, work_dir=None, free_bytes=None, mem_total_bytes=None)
    line = hc.summary(bare)
    assert "None" not in line
    assert line.startswith("driver absent (no nvidia-smi), toolkit hook absent, docker absent or "
                           "unreachable, compose absent, RAM unknown, CPUs 96, work dir none")
    problems = hc.evaluate(bare)
    assert not [p for p in problems if "None" in p]
    assert "Docker Compose v2: `docker compose version` failed (the compose plugin is absent); need 2.x" in problems
    hints = "\n".join(hc.hints(bare))
    assert "./aleph-dev train-a2, then ./aleph-dev test" in hints
    assert "docker compose -f compose.yaml -f compose.cpu.yaml up train-a2" in hints
    # a GPU host gets the plain facts and no detour
    assert hc.summary(ready) == ("driver 570.195.03 (2 GPUs), toolkit hook /usr/bin/nvidia-container-"
                                 "runtime-hook, docker 27.5.1, compose 2.29.7, RAM 540,644,167,680 B, "
                                 "CPUs 96, work /srv/aleph (400,000,000,000 B free)")
    assert hc.hints(ready) == []


def test_the_hints_name_commands_that_exist(hc, repo_file):
    text = "\n".join(hc.hints(hc.HostFacts(None, 0, None, None, None, None, None, None, None)))
    readme = repo_file("README.md").read_text()  # not baked into the image: skips there
    assert "./aleph-dev train-a2" in readme and "On any Linux x86_64 machine without Docker" in readme
    assert "compose.cpu.yaml up train-a2" in readme and repo_file("compose.cpu.yaml").is_file()
    assert "the CPU image" in readme and "the CPU image" in text
