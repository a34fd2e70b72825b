"""The Dockerfile: hadolint clean, and the build steps the E1 image depends on."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dockerfile(repo_file) -> str:
    return repo_file("Dockerfile").read_text()


def _hadolint(exe: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [exe, "--no-color", str(path)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("name", ["Dockerfile", "docker/Dockerfile.cpu"])
def test_hadolint_clean(hadolint_bin, repo_file, name):
    p = _hadolint(hadolint_bin, repo_file(name))
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("name", ["Dockerfile", "docker/Dockerfile.cpu"])
def test_no_frontend_is_fetched_from_a_registry(repo_file, name):
    # A `# syntax=` line makes every build look its frontend up on Docker Hub; without it
    # the daemon's built-in BuildKit builds (RUN --mount included), air-gapped sites too.
    text = repo_file(name).read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I)


def test_cpu_image_matches_the_gpu_image_layout(repo_file, dockerfile):
    cpu = repo_file("docker/Dockerfile.cpu").read_text()
    for same in ('ENTRYPOINT ["/usr/bin/tini", "--", "/opt/aleph/docker/entrypoint.sh"]',
                 "USER ${ALEPH_UID}:${ALEPH_UID}", "ARG ALEPH_UID=1000", "WORKDIR /opt/aleph",
                 "PYTHONPATH=/opt/aleph", "ALEPH_WORK=/workspace", "ALEPH_IN_IMAGE=1",
                 "install -m 0755 docker/aleph /usr/local/bin/aleph", "aleph env check --strict"):
        assert same in cpu and same in dockerfile, same
    assert "ALEPH_IMAGE_VARIANT=cpu" in cpu and "ALEPH_IMAGE_VARIANT" not in dockerfile
    # host.txt, hash-checked, before the code is copied (code edits do not reinstall).
    assert cpu.index("--require-hashes --no-deps --only-binary :all: -r lockfiles/host.txt") \
        < cpu.index("COPY aleph/ aleph/")
    # The CA bundle for a proxied build is a secret mount, never a COPY or an ENV.
    assert "--mount=type=secret,id=pip-ca" in cpu and "COPY" not in cpu.split("pip-ca")[0][-200:]
    (base,) = re.findall(r"^ARG ALEPH_CPU_BASE_IMAGE=(\S+)$", cpu, re.M)
    assert base.startswith("python:3.11.10-slim-bookworm@sha256:") and len(base.split(":")[-1]) == 64


def test_hadolint_really_lints(hadolint_bin, tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get install curl\n")
    p = _hadolint(hadolint_bin, bad)
    assert p.returncode != 0 and "DL3007" in p.stdout


def test_every_ignore_is_justified_on_its_line(dockerfile):
    for line in dockerfile.splitlines():
        if "hadolint ignore" in line:
            assert re.search(r"ignore=\S+ # \w+", line), line


def test_base_is_pinned_by_digest(dockerfile):
    (base,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.M)
    name, _, digest = base.partition("@")
    assert name == "nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04"
    assert digest == "sha256:622e78a1d02c0f90ed900e3985d6c975d8e2dc9ee5e61643aed587dcf9129f42"


def test_python_is_built_from_the_verified_tarball(dockerfile):
    assert "ARG PYTHON_VERSION=3.11.10" in dockerfile
    assert "07a4356e912900e61a15cb0949a06c4a05012e213ecd6b4e84d0f67aabbee372" in dockerfile
    # The check runs before the tarball is unpacked.
    assert dockerfile.index("sha256sum -c -") < dockerfile.index("tar -xJf")
    assert '("3.11.10", "GCC 11.4.0")' in dockerfile


def test_apt_comes_from_the_dated_snapshot(dockerfile):
    assert "ARG APT_SNAPSHOT=20260807T000000Z" in dockerfile
    assert "snapshot.ubuntu.com/ubuntu/${APT_SNAPSHOT}" in dockerfile
    assert "ARG SOURCE_DATE_EPOCH=1786060800" in dockerfile  # 2026-08-07T00:00:00Z


def test_dependencies_are_hash_locked_and_checked_before_the_code(dockerfile):
    pip = "--require-hashes --no-deps --only-binary :all:"
    assert dockerfile.count(pip) == 2
    order = [
        "relock.py --check-complete lockfiles/image-cu124.txt",
        "-r lockfiles/image.txt",
        "-r lockfiles/image-cu124.txt",
        "pip check",
        "COPY aleph/ aleph/",
        "aleph/REVISION",
        "aleph env check --strict",
    ]
    positions = [dockerfile.index(step) for step in order]
    assert positions == sorted(positions)
    assert "--mount=type=cache,target=/root/.cache/pip" in dockerfile


def test_revision_label_env_and_user(dockerfile):
    assert 'org.opencontainers.image.revision="${ALEPH_REVISION}"' in dockerfile
    assert "ALEPH_IN_IMAGE=1" in dockerfile and "PYTHONPATH=/opt/aleph" in dockerfile
    (user,) = re.findall(r"^USER (\S+)$", dockerfile, re.M)
    assert user == "${ALEPH_UID}:${ALEPH_UID}" and "ARG ALEPH_UID=1000" in dockerfile
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "/opt/aleph/docker/entrypoint.sh"]' in dockerfile


def test_dockerignore_is_an_allow_list(repo_file):
    lines = [x for x in repo_file(".dockerignore").read_text().splitlines() if x and x[0] != "#"]
    assert lines[0] == "*"
    allowed = {x[1:].rstrip("/") for x in lines if x.startswith("!")}
    assert allowed == {"aleph", "tests", "docker", "bench", "lockfiles", "pip_freeze.txt",
                       "pyproject.toml"}
    assert "aleph/REVISION" in lines and "bench/out/" in lines  # benchmark outputs stay out


def test_aleph_shim_runs_the_built_interpreter(dockerfile):
    shim = (REPO / "docker" / "aleph").read_text()
    assert shim.rstrip().splitlines()[-1] == 'exec /opt/python/bin/python3 -m aleph "$@"'
    assert "--prefix=/opt/python" in dockerfile
    assert "install -m 0755 docker/aleph /usr/local/bin/aleph" in dockerfile
    p = subprocess.run(["sh", "-n", str(REPO / "docker" / "aleph")], capture_output=True)
    assert p.returncode == 0


def test_the_cu124_completeness_check_exists(dockerfile):
    # The Dockerfile calls the lock tool's check by name; a rename must break here, not mid-build.
    p = subprocess.run(
        [sys.executable, str(REPO / "lockfiles" / "relock.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and "--check-complete" in p.stdout
