"""The encoder's configuration: one frozen dataclass holding every size, checked on creation."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from aleph.errors import ConfigError

ARMS = ("a1_anchored", "a2_dense", "a3_random")
"""The public E1 arms. a1: anchored bank with learned anchors; a2: dense FFN (control);
a3: the a1 bank with anchors frozen at their random init."""

BANK_ARMS = ("a1_anchored", "a3_random")

# Named in the seed as an arm gated off for a1-a3; its code is not public.
_UNAVAILABLE_ARMS = {"splat": "not available (it is not public; the seed lists it gated off)"}

INIT_SCHEMES = ("e1_orthogonal", "normal_0.02")
"""How the encoder's weights start (ModelConfig.init).

- "e1_orthogonal" (the default): the anchored bank as the public "E1-form" bank of the
  AlephLM line's successor code (AbstractEyes/alephllm, geolip/alephllm/model/bank.py at
  5077e66): trunk w_in and w_out `nn.init.orthogonal_`, each expert's w_in[k] (a D x ff
  slice) orthogonal on its own, expert w_out zero, gates `gate_init`. The E1 encoder's own
  file and its dense control are not public; our choice for the rest: a2's two FFN matrices
  are orthogonal as a1's trunk is, so a1 and a2 differ in the FFN's structure only, never
  in how it starts; the attention qkv/out matrices and the output projection are
  orthogonal as the successor's attention and head projections are; their biases start at
  zero; the token and position embeddings stay normal(0, 0.02) (BERT's; the successor's
  tables belong to a byte/BPE language model, and E1's are not public).
- "normal_0.02": every matrix and embedding normal(0, 0.02), BERT-style, biases zero,
  expert w_out zero, gates `gate_init`: the init of this project before the field existed,
  drawn in the same order from the same RNG stream.
Both schemes draw the anchors the same way: normalised Gaussian rows, with a frozen copy
("home") that anchor drift is measured against.
"""

INIT_BEFORE_FIELD = "normal_0.02"
"""The init of every model and run config written before the `init` field existed."""


@dataclass(frozen=True)
class ModelConfig:
    """Every size of the AlephLM-0 encoder. Defaults are the E1 shape."""

    arm: str
    """Which feed-forward every block uses: one of ARMS."""
    vocab_size: int
    """Rows of the token embedding; at least the tokenizer's vocabulary (30522 for bert-base-uncased)."""
    max_len: int = 128
    """Token length of every row: the position embeddings, and the padding/truncation of the
    token store (128 as in the E1 pilot)."""
    d_model: int = 512
    """Width of the encoder's residual stream (E1: 512)."""
    n_layers: int = 12
    """Encoder blocks (E1: 12)."""
    n_heads: int = 8
    """Attention heads; must divide d_model (E1: 8)."""
    ffn_dense: int = 2048
    """Hidden width of the dense FFN of a2 (E1: 2048)."""
    ffn_expert: int = 512
    """Hidden width of the trunk and of each dispatched expert of the anchored bank (a1/a3; E1: 512)."""
    n_anchors: int = 3
    """K: dispatched experts = anchors of the signed address per bank (a1/a3; E1: 3)."""
    address_tau: float = 0.1
    """Temperature of the signed aleph address score u = cos(x, anchor) / tau (E1: 0.1)."""
    gate_init: float = -3.0
    """Initial value of each expert's gate logit g_k (sigmoid(-3) ~ 0.047)."""
    init: str = "e1_orthogonal"
    """Weight init scheme, one of INIT_SCHEMES: "e1_orthogonal" (orthogonal matrices, the
    public E1-form bank's init, our choice for a2's FFN and the attention; see INIT_SCHEMES)
    or "normal_0.02" (BERT-style normal(0, 0.02) everywhere, this project's former init)."""
    out_dim: int = 768
    """Width of the projected, L2-normalised sentence embedding (= target dim)."""
    dropout: float = 0.0
    """Dropout on embeddings, attention probabilities and block outputs. Training's default is
    0.1: E1's value is not public, 0.1 (BERT's) is our choice. Multi-process runs follow the
    one-process loss trajectory exactly only at 0 (each rank draws its own dropout masks)."""
    checkpointing: bool = False
    """Per-block activation checkpointing in training (torch.utils.checkpoint, non-reentrant;
    exclusive with torch.compile on torch 2.4, law 2)."""
    pad_id: int = 0
    """Token id of [PAD]; its embedding row is unused by pooling and attention."""

    def __post_init__(self) -> None:
        if self.arm not in ARMS:
            extra = _UNAVAILABLE_ARMS.get(self.arm)
            why = f"arm {self.arm!r} is {extra}" if extra else f"unknown arm {self.arm!r}"
            raise ConfigError(f"ModelConfig.arm: {why}; the arms that exist are {', '.join(ARMS)}")
        for name in ("vocab_size", "max_len", "d_model", "n_layers", "n_heads",
                     "ffn_dense", "ffn_expert", "n_anchors", "out_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ModelConfig.{name}: expected a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"ModelConfig.n_heads: {self.n_heads} does not divide d_model {self.d_model}")
        if not (isinstance(self.address_tau, int | float) and self.address_tau > 0):
            raise ConfigError(f"ModelConfig.address_tau: expected > 0, got {self.address_tau!r}")
        if not isinstance(self.gate_init, int | float) or isinstance(self.gate_init, bool):
            raise ConfigError(f"ModelConfig.gate_init: expected a number, got {self.gate_init!r}")
        if self.init not in INIT_SCHEMES:
            raise ConfigError(f"ModelConfig.init: got {self.init!r}, expected one of "
                              f"{', '.join(INIT_SCHEMES)}")
        if not (isinstance(self.dropout, int | float) and 0.0 <= self.dropout < 1.0):
            raise ConfigError(f"ModelConfig.dropout: expected 0 <= dropout < 1, got {self.dropout!r}")
        if not isinstance(self.checkpointing, bool):
            raise ConfigError(
                f"ModelConfig.checkpointing: expected true/false, got {self.checkpointing!r}")
        if not isinstance(self.pad_id, int) or not 0 <= self.pad_id < self.vocab_size:
            raise ConfigError(
                f"ModelConfig.pad_id: expected 0 <= pad_id < vocab_size {self.vocab_size}, "
                f"got {self.pad_id!r}")

    @property
    def is_bank(self) -> bool:
        """True for the arms whose FFN is the anchored bank (a1, a3)."""
        return self.arm in BANK_ARMS

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "model config") -> ModelConfig:
        """Build from a dict; an unknown key is a ConfigError naming it and `source`.

        A dict without `init` was written before that field existed: its weights started
        as INIT_BEFORE_FIELD, and that is what the rebuilt config says.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown field(s) {unknown}; known: {sorted(known)}")
        missing = sorted(k for k in ("arm", "vocab_size") if k not in data)
        if missing:
            raise ConfigError(f"{source}: missing required field(s) {missing}")
        return cls(**{"init": INIT_BEFORE_FIELD, **data})
