"""Fixtures of the data tests: the smoke data set, built once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smoke_root(tmp_path_factory):
    return tmp_path_factory.mktemp("smoke-data") / "smoke"


@pytest.fixture(scope="session")
def smoke(smoke_root):
    from aleph.data import ensure_smoke_data

    return ensure_smoke_data(smoke_root)


@pytest.fixture(scope="session")
def smoke_tokenizer(smoke):
    from aleph.data import load_tokenizer

    return load_tokenizer(smoke.tokenizer_dir)
