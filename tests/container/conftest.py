"""A real Docker engine, a locally made base image and the CPU image, for tests/container.

Nothing here is pulled from a registry (CI reaches none): the base image is Debian
bookworm made with debootstrap (with CPython 3.11, venv, tini, procps and CA certificates
already in it) and imported; the wheels of lockfiles/host.txt are taken from the venv's
pip cache (`pip download`, hash-checked) and imported as an image, so the CPU image builds
with no network. Both are tagged by the content they were made from, so a second run on
the same machine reuses them. The CPU image is built through the real Compose v2 binary
from the dev venv, from compose.yaml + compose.cpu.yaml + compose.ci.yaml.

When `docker info` fails and we are root with apt-get, Debian's docker.io is installed if
needed and `dockerd` is started in the background; that pid is stopped when the session
ends. Elsewhere (not root, no apt-get, inside the image) the tests skip with one line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
COMPOSE_FILES = (REPO / "compose.yaml", REPO / "compose.cpu.yaml", HERE / "compose.ci.yaml")
# What the base image carries so the CPU build needs no apt (docker/Dockerfile.cpu).
BASE_PACKAGES = ("python3", "python3-venv", "tini", "procps", "ca-certificates")
BASE_SUITE = "bookworm"
CPU_IMAGE = "aleph-e1:cpu-ci"


def _run(args, *, timeout=600, check=True, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {p.returncode}\n"
                             f"{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    return p


def _docker_ok() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


def _apt_install(*packages: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-qq"], env=env, timeout=600)
    _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages], env=env,
         timeout=900)


def _can_install() -> str | None:
    """None when we may install OS packages, else the one-line reason we cannot."""
    if os.environ.get("ALEPH_IN_IMAGE") == "1":
        return "container tests drive Docker from the host, not from inside the image"
    if os.geteuid() != 0:
        return "no Docker engine answers and not root: cannot install or start dockerd"
    if shutil.which("apt-get") is None:
        return "no Docker engine answers and no apt-get to install docker.io"
    return None


def _cannot(reason: str):
    """Skip with the reason; under CI (ALEPH_CONTAINER_REQUIRED=1, set by .ci/run) fail."""
    if os.environ.get("ALEPH_CONTAINER_REQUIRED") == "1" and os.environ.get("ALEPH_IN_IMAGE") != "1":
        pytest.fail(f"container tier required but impossible here: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def engine():
    """A Docker engine that answers `docker info`; ours is stopped at the end."""
    if os.environ.get("ALEPH_IN_IMAGE") == "1":
        pytest.skip(_can_install())
    if _docker_ok():
        yield None
        return
    reason = _can_install()
    if reason:
        _cannot(reason)
    if shutil.which("dockerd") is None:
        _apt_install("docker.io")
    log = open(tempfile.gettempdir() + "/aleph-ci-dockerd.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 90
    while not _docker_ok():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"dockerd did not come up (exit {proc.poll()}); see {log.name}")
        time.sleep(1)
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
    log.close()


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True,
                          timeout=60).returncode == 0


def _import_dir(directory: Path, tag: str) -> None:
    tar = subprocess.Popen(["tar", "-C", str(directory), "-c", "."], stdout=subprocess.PIPE)
    imp = subprocess.run(["docker", "import", "-", tag], stdin=tar.stdout, capture_output=True,
                         text=True, timeout=900)
    tar.stdout.close()
    assert tar.wait() == 0 and imp.returncode == 0, f"docker import {tag}: {imp.stderr}"


def _scratch_dir() -> Path:
    # Large scratch space on the disk (not a tmpfs /tmp): the wheels are ~3 GB.
    base = Path(os.environ.get("ALEPH_CI_SCRATCH", REPO / "work" / "ci-scratch"))
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=base))


@pytest.fixture(scope="session")
def base_image(engine) -> str:
    """Debian bookworm (minbase + BASE_PACKAGES) made here and imported, no registry."""
    key = hashlib.sha256(" ".join((BASE_SUITE, *BASE_PACKAGES)).encode()).hexdigest()[:12]
    tag = f"aleph-ci-base:{BASE_SUITE}-{key}"
    if image_exists(tag):
        return tag
    if shutil.which("debootstrap") is None:
        reason = _can_install()
        if reason:
            _cannot(f"debootstrap missing: {reason}")
        _apt_install("debootstrap")
    root = _scratch_dir() / "rootfs"
    try:
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
              BASE_SUITE, str(root)], timeout=1200)
        _import_dir(root, tag)
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)
    return tag


@pytest.fixture(scope="session")
def wheels_image(engine) -> str:
    """The wheels of lockfiles/host.txt as an image, from the venv's pip cache."""
    lock = REPO / "lockfiles" / "host.txt"
    tag = f"aleph-wheels:{hashlib.sha256(lock.read_bytes()).hexdigest()[:16]}"
    if image_exists(tag):
        return tag
    d = _scratch_dir()
    try:
        _run([sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check",
              "download", "-q", "--require-hashes", "--no-deps", "--only-binary", ":all:",
              "-r", str(lock), "-d", str(d)],
             env={**os.environ, "PIP_CONFIG_FILE": os.devnull}, timeout=1800)
        _import_dir(d, tag)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return tag


def _revision() -> str:
    if shutil.which("git"):
        p = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                           text=True, timeout=60)
        if p.returncode == 0:
            return p.stdout.strip()
    return "ci-without-git"


def _memlock_hard_bytes() -> int:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return -1 if hard == resource.RLIM_INFINITY else hard


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Stack:
    """One compose project of this session: its own name and its own work volume."""

    compose_bin: str
    project: str
    volume: str
    env: dict

    def compose(self, *args: str, timeout: int = 900, check: bool = True, extra_env=None):
        cmd = [self.compose_bin, "--project-directory", str(REPO), "-p", self.project]
        for f in COMPOSE_FILES:
            cmd += ["-f", str(f)]
        return _run([*cmd, *args], timeout=timeout, check=check,
                    env={**self.env, **(extra_env or {})})

    def container_id(self, service: str) -> str:
        out = self.compose("ps", "-a", "-q", service).stdout.split()
        assert len(out) == 1, f"expected one {service} container, found {out}"
        return out[0]

    def inspect(self, cid: str, fmt: str) -> str:
        return _run(["docker", "inspect", "-f", fmt, cid]).stdout.strip()

    def on_volume(self, script: str, timeout: int = 300) -> str:
        """Run `sh -c script` in the CPU image over the work volume, no network, read-only."""
        return _run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh",
                     "-v", f"{self.volume}:/workspace:ro", CPU_IMAGE, "-c", script],
                    timeout=timeout).stdout


@pytest.fixture(scope="session")
def stack(engine, base_image, wheels_image, compose_bin):
    """The CPU image built through Compose, and a project with its own volume; removed after."""
    suffix = uuid.uuid4().hex[:8]
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("ALEPH_", "COMPOSE_"))}
    env = {
        **base_env,
        "ALEPH_REVISION": _revision(),
        "ALEPH_CPU_BASE_IMAGE": base_image,
        "ALEPH_WHEELS_IMAGE": wheels_image,
        "ALEPH_CPU_IMAGE": CPU_IMAGE,
        "ALEPH_WORK_VOLUME": f"aleph-ci-work-{suffix}",
        "ALEPH_CI_MEMLOCK": str(_memlock_hard_bytes()),
        "ALEPH_TB_PORT": str(free_port()),
    }
    s = Stack(compose_bin, f"aleph-ci-{suffix}", env["ALEPH_WORK_VOLUME"], env)
    s.compose("build", "tests", timeout=1800)
    yield s
    s.compose("--profile", "*", "down", "-v", "--remove-orphans", check=False, timeout=300)
    _run(["docker", "volume", "rm", "-f", s.volume], check=False)
