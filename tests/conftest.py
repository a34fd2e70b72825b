"""Shared pytest setup: small thread counts, a private work root, GPU skipping."""

from __future__ import annotations

import os

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
