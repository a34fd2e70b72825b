import pytest

from aleph.errors import ConfigError
from aleph.model import ARMS, ModelConfig


def test_arms_are_the_three_public_ones():
    assert ARMS == ("a1_anchored", "a2_dense", "a3_random")


def test_unknown_arm_lists_the_arms():
    with pytest.raises(ConfigError) as e:
        ModelConfig(arm="a4_magic", vocab_size=10)
    assert "a4_magic" in str(e.value)
    assert all(arm in str(e.value) for arm in ARMS)


def test_splat_is_named_as_not_available():
    with pytest.raises(ConfigError, match="splat.*not available"):
        ModelConfig(arm="splat", vocab_size=10)


@pytest.mark.parametrize("field,value", [
    ("n_heads", 7), ("d_model", 0), ("vocab_size", True), ("max_len", 2.5), ("address_tau", 0.0),
    ("dropout", 1.0), ("checkpointing", "yes"), ("pad_id", 10), ("n_anchors", -1),
])
def test_bad_field_is_named(field, value):
    with pytest.raises(ConfigError, match=f"ModelConfig.{field}"):
        ModelConfig(**{"arm": "a2_dense", "vocab_size": 10, field: value})


def test_defaults_are_the_e1_shape():
    cfg = ModelConfig(arm="a1_anchored", vocab_size=30522)
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.ffn_dense, cfg.ffn_expert) == (
        512, 12, 8, 2048, 512)
    assert (cfg.n_anchors, cfg.address_tau, cfg.gate_init, cfg.out_dim, cfg.max_len) == (
        3, 0.1, -3.0, 768, 128)


def test_dict_round_trip_and_unknown_key():
    cfg = ModelConfig(arm="a3_random", vocab_size=99, d_model=32, n_heads=4)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown field.*'widht'"):
        ModelConfig.from_dict({**cfg.to_dict(), "widht": 3}, source="x.json")
