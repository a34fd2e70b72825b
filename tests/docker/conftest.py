"""Build files of the repository for tests/docker (the tool fixtures live in tests/conftest.py).

Inside the image only the repository's own build files are missing; they skip there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _repo_file(name: str) -> Path:
    """A build file of the repository; the image bakes tests/ but not Dockerfile & co."""
    path = REPO / name
    if not path.exists():
        if os.environ.get("ALEPH_IN_IMAGE") == "1":
            pytest.skip(f"{name} is not baked into the image")
        pytest.fail(f"{name} missing from the repository")
    return path


@pytest.fixture(scope="session")
def repo_file():
    """`repo_file(name)`: the path, skipped in the image only, failed elsewhere if missing."""
    return _repo_file
