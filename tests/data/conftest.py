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


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A stand-in hub on 127.0.0.1 serving E1's caption file (tests/data/test_fetch.py's
    payload at its commit); no token, no cache of the user's."""
    from aleph.data.fetch import CAPTIONS_FILE, CAPTIONS_REPO
    from tests.data.fake_dataset_hub import FakeDatasetHub
    from tests.data.test_fetch import COMMIT, _payload

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with FakeDatasetHub() as h:
        h.add(CAPTIONS_REPO, COMMIT, {CAPTIONS_FILE: _payload()})
        yield h
