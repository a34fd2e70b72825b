"""The encoder's configuration: one frozen dataclass holding every size, checked on creation."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from aleph._fields import BELOW_1, POSITIVE, POSITIVE_INT, Rule, check_fields, rule
from aleph.errors import ConfigError

Arm = Literal["a1_anchored", "a2_dense", "a3_random"]
ARMS = get_args(Arm)
"""The public E1 arms. a1: anchored bank with learned anchors; a2: dense FFN (control);
a3: the a1 bank with anchors frozen at their random init."""

BANK_ARMS = ("a1_anchored", "a3_random")

# Named in the seed as an arm gated off for a1-a3; its code is not public.
_UNAVAILABLE_ARMS = {"splat": "not available (it is not public; the seed lists it gated off)"}

Init = Literal["e1_orthogonal", "normal_0.02"]
INIT_SCHEMES = get_args(Init)
"""How the encoder's weights start (ModelConfig.init); aleph/train/README.md,
"Initialisation", gives each scheme's source and our choices: "e1_orthogonal" (the
default; the public E1-form bank's orthogonal init, and ours for a2's FFN, the attention
and the projection) or "normal_0.02" (the former BERT-style init, drawn exactly as before).
Embeddings are normal(0, 0.02), biases and expert w_out zero, anchors normalised Gaussian
rows with a frozen "home" copy under either."""

# A shape field's facts as a run config reads them (aleph.train.config.knob): the shape
# defines what a run computes (basis) and cannot change between its launches.
_SHAPE_FACTS = {"resumable": False, "basis": True, "secret": False}


def shape(default: Any, *checks: Rule, **facts: Any):
    """A shape field: its default, its value rules, its facts (see _SHAPE_FACTS)."""
    return field(default=default, metadata={**_SHAPE_FACTS, **facts, "checks": checks})


@dataclass(frozen=True)
class ModelShape:
    """The encoder's shape: the fields a training run sets (TrainConfig inherits them)."""

    max_len: int = shape(128, POSITIVE_INT)
    """Token length of every row: the position embeddings, and the padding/truncation of the
    token store (128 as in the E1 pilot)."""
    d_model: int = shape(512, POSITIVE_INT)
    """Width of the encoder's residual stream (E1: 512)."""
    n_layers: int = shape(12, POSITIVE_INT)
    """Encoder blocks (E1: 12)."""
    n_heads: int = shape(8, rule(lambda v, c: v > 0 and c.d_model % v == 0,
                                 "a positive divisor of d_model={d_model}"))
    """Attention heads; must divide d_model (E1: 8)."""
    ffn_dense: int = shape(2048, POSITIVE_INT)
    """Hidden width of the dense FFN of a2 (E1: 2048)."""
    ffn_expert: int = shape(512, POSITIVE_INT)
    """Hidden width of the trunk and of each dispatched expert of the anchored bank (a1/a3; E1: 512)."""
    n_anchors: int = shape(3, POSITIVE_INT)
    """K: dispatched experts = anchors of the signed address per bank (a1/a3; E1: 3)."""
    address_tau: float = shape(0.1, POSITIVE)
    """Temperature of the signed aleph address score u = cos(x, anchor) / tau (E1: 0.1)."""
    gate_init: float = shape(-3.0)
    """Initial value of each expert's gate logit g_k (sigmoid(-3) ~ 0.047)."""
    init: Init = shape("e1_orthogonal")
    """Weight init scheme, one of INIT_SCHEMES: "e1_orthogonal" (orthogonal matrices, the
    public E1-form bank's init, our choice for a2's FFN and the attention; see INIT_SCHEMES)
    or "normal_0.02" (BERT-style normal(0, 0.02) everywhere, this project's former init)."""
    dropout: float = shape(0.0, BELOW_1)
    """Dropout on embeddings, attention probabilities and block outputs. Training's default is
    0.1: E1's value is not public, 0.1 (BERT's) is our choice. Multi-process runs follow the
    one-process loss trajectory exactly only at 0 (each rank draws its own dropout masks)."""
    checkpointing: bool = shape(False)
    """Per-block activation checkpointing in training (torch.utils.checkpoint, non-reentrant;
    exclusive with torch.compile on torch 2.4, law 2)."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig(ModelShape):
    """Every size of the AlephLM-0 encoder: the shape, the arm and what the data fixes.
    Defaults are the E1 shape; every field is checked on creation (aleph._fields)."""

    arm: Arm
    """Which feed-forward every block uses: one of ARMS."""
    vocab_size: int = field(metadata={"checks": (POSITIVE_INT,)})
    """Rows of the token embedding; at least the tokenizer's vocabulary (30522 for bert-base-uncased)."""
    out_dim: int = field(default=768, metadata={"checks": (POSITIVE_INT,)})
    """Width of the projected, L2-normalised sentence embedding (= target dim)."""
    pad_id: int = field(default=0, metadata={"checks": (
        rule(lambda v, c: 0 <= v < c.vocab_size, "0 <= pad_id < vocab_size {vocab_size}"),)})
    """Token id of [PAD]; its embedding row is unused by pooling and attention."""

    def __post_init__(self) -> None:
        if self.arm in _UNAVAILABLE_ARMS:
            raise ConfigError(f"ModelConfig.arm: arm {self.arm!r} is {_UNAVAILABLE_ARMS[self.arm]}; "
                              f"the arms that exist are {', '.join(ARMS)}")
        check_fields(self, "ModelConfig.{}")

    @property
    def is_bank(self) -> bool:
        """True for the arms whose FFN is the anchored bank (a1, a3)."""
        return self.arm in BANK_ARMS

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "model config") -> ModelConfig:
        """Build from a dict; an unknown key, or a missing arm, vocab_size or init (a
        model_config.json of an earlier format), is a ConfigError naming it and `source`."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        if unknown := sorted(set(data) - known):
            raise ConfigError(f"{source}: unknown field(s) {unknown}; known: {sorted(known)}")
        if missing := sorted(k for k in ("arm", "vocab_size", "init") if k not in data):
            raise ConfigError(f"{source}: missing required field(s) {missing}")
        return cls(**data)
