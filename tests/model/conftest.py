"""Fixtures of the model tests: tiny configs and the smoke data set (built once per session)."""

from __future__ import annotations

import pytest

from aleph.model import ModelConfig


def tiny_config(arm: str, **over) -> ModelConfig:
    """A 2-layer, 64-wide encoder with the E1 bank structure (K=3, ffn_dense = 4 x ffn_expert)."""
    base = dict(arm=arm, vocab_size=200, max_len=32, d_model=64, n_layers=2, n_heads=4,
                ffn_dense=256, ffn_expert=64, out_dim=768)
    base.update(over)
    return ModelConfig(**base)


@pytest.fixture(scope="session")
def smoke(tmp_path_factory):
    from aleph.data import ensure_smoke_data

    return ensure_smoke_data(tmp_path_factory.mktemp("smoke") / "smoke")


@pytest.fixture(scope="session")
def tiny():
    """`tiny(arm, **overrides)` -> a tiny ModelConfig (see tiny_config)."""
    return tiny_config
