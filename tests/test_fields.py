"""aleph._fields: config types checked from the real annotations, rules declared at the field."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

import pytest

from aleph._fields import POSITIVE_INT, check_fields, rule
from aleph.errors import ConfigError


@dataclass(frozen=True)
class Small:
    limit: int | None = field(default=None, metadata={"checks": (
        rule(lambda v, c: v is None or v > 0, "a positive integer or null"),)})
    mode: Literal["fast", "slow"] = "fast"
    rate: float | None = None
    width: int = field(default=4, metadata={"checks": (POSITIVE_INT,)})
    parts: int = field(default=2, metadata={"checks": (
        rule(lambda v, c: c.width % v == 0, "a divisor of width={width}"),)})

    def __post_init__(self) -> None:
        check_fields(self, "config field {!r}")


def test_a_field_typed_int_or_none_takes_both_and_nothing_else():
    """The table of annotation strings this replaced had no "int | None": a KeyError."""
    assert Small().limit is None and Small(limit=3).limit == 3
    for bad, kind in ((3.5, "float"), (True, "bool"), ("3", "str")):
        with pytest.raises(ConfigError) as e:
            Small(limit=bad)
        assert str(e.value) == f"config field 'limit': got {bad!r} ({kind}), expected int | None"
    with pytest.raises(ConfigError, match=r"^config field 'limit': got 0, expected a positive "
                                          r"integer or null$"):
        Small(limit=0)


def test_literal_int_to_float_and_cross_field_rules():
    with pytest.raises(ConfigError, match=r"^config field 'mode': got 'medium', expected one of "
                                          r"fast, slow$"):
        Small(mode="medium")
    assert type(Small(rate=1).rate) is float  # an int where a float is declared
    with pytest.raises(ConfigError, match=r"^config field 'parts': got 3, expected a divisor "
                                          r"of width=4$"):
        Small(parts=3)
    with pytest.raises(ConfigError, match=r"^config field 'rate': got inf, expected a finite"):
        Small(rate=float("inf"))


def test_an_annotation_without_a_check_is_named():
    @dataclass(frozen=True)
    class Odd:
        table: dict[str, int] = field(default_factory=dict)

        def __post_init__(self) -> None:
            check_fields(self, "{}")

    with pytest.raises(TypeError, match=r"no check for the annotation dict\[str, int\]"):
        Odd()


def test_the_model_shape_rules_are_declared_once_for_both_configs():
    import typing

    from aleph.model.config import ModelConfig
    from aleph.train.config import TrainConfig, resolve

    model = {f.name: f for f in fields(ModelConfig)}
    shared = [f for f in fields(TrainConfig) if f.name in model and f.name != "arm"]
    assert len(shared) == 12  # max_len ... checkpointing: ModelShape's fields
    hints = typing.get_type_hints(TrainConfig), typing.get_type_hints(ModelConfig)
    assert hints[0]["arm"] is hints[1]["arm"]  # one Literal of the arms
    for f in shared:
        assert f.metadata["checks"] is model[f.name].metadata["checks"], f.name
    with pytest.raises(ConfigError, match=r"^config field 'n_heads': got 7, expected a positive "
                                          r"divisor of d_model=64$"):
        resolve("smoke", arm="a2_dense", overrides=["n_heads=7"])
    with pytest.raises(ConfigError, match=r"^ModelConfig.n_heads: got 7, expected a positive "
                                          r"divisor of d_model=512$"):
        ModelConfig(arm="a2_dense", vocab_size=10, n_heads=7)


def test_all_loss_weights_zero_is_one_rule_at_the_weight_fields():
    from aleph.train.config import loss_weights, resolve

    with pytest.raises(ConfigError, match=r"^config field 'w_nce': got 0.0, expected w_nce or "
                                          r"w_mse > 0 \(all are 0: nothing to train\)$"):
        resolve("smoke", arm="a2_dense", overrides=["w_nce=0", "w_mse=0"])
    with pytest.raises(ConfigError, match=r"^config field 'w_mse': got -1.0, expected a number >= 0$"):
        resolve("smoke", arm="a2_dense", overrides=["w_mse=-1"])
    cfg = resolve("smoke", arm="a2_dense", overrides=["w_nce=0"])
    assert loss_weights(cfg) == {"nce": 0.0, "mse": 1.0}
