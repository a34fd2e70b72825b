"""The teachers of E1's targets and the cost of running them (no transformers import here).

- `DEFAULT_TEACHERS`: the five of the lineage's trainer (geolip-captionbert-8192,
  `trainers/trainer_alignment_base.py`), by hub name.
- `parse_teachers`: `NAME[@REVISION]` or a local model directory, comma separated.
- `forward_flops(config, tokens)`: forward FLOPs of one caption of `tokens` tokens through
  an encoder described by its `config.json` (BERT, RoBERTa, ALBERT, DistilBERT and
  ModernBERT field names): 2 FLOPs per multiply-add of the attention projections (4 d^2),
  the feed-forward (2 d ff, 3 d ff for ModernBERT's gated one) and the attention itself
  (2 L d for scores plus 2 L d for the weighted values, per token), per layer. Embedding
  look-ups, norms and softmax are left out (under 1% at these sizes).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from aleph.errors import ConfigError

DEFAULT_TEACHERS = ("bert-base-uncased", "answerdotai/ModernBERT-base", "roberta-base",
                    "albert-base-v2", "distilbert-base-uncased")
A40_BF16_TFLOPS = 149.7  # NVIDIA A40 datasheet: dense bf16 tensor-core peak
ASSUMED_MFU = 0.35  # assumption: share of that peak an encoder forward sustains


@dataclass(frozen=True)
class ExtractOptions:
    """The options of `aleph targets extract` (defaults: the CLI's)."""

    max_length: int = 512  # the lineage's tokenize_len
    batch_size: int = 256
    chunk_rows: int = 500_000  # E1 ships 66 chunks of about 483k rows
    column: str = "caption"
    assume_tflops: float = round(A40_BF16_TFLOPS * ASSUMED_MFU, 1)
    shard: str | None = None  # "I/N": chunks c with c % N == I
    estimate_only: bool = False
    consensus_out: str | None = None  # run the consensus into this directory afterwards


@dataclass(frozen=True)
class TeacherSpec:
    """One teacher: a hub name (revision None = the default branch, resolved and recorded)
    or a local directory."""

    name: str
    revision: str | None = None
    local: bool = False

    @property
    def slug(self) -> str:
        """The teacher's output directory name."""
        base = os.path.basename(os.path.normpath(self.name)) if self.local else self.name
        return re.sub(r"[^A-Za-z0-9._-]+", "--", base)


def parse_teachers(text: str) -> list[TeacherSpec]:
    specs = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if os.path.isdir(item):
            specs.append(TeacherSpec(os.path.abspath(item), None, True))
            continue
        name, _, rev = item.partition("@")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?", name):
            raise ConfigError(f"--teachers: {item!r} is neither a local directory nor a hub "
                              "name (owner/name or name, optionally @revision)")
        specs.append(TeacherSpec(name, rev or None, False))
    if not specs:
        raise ConfigError("--teachers: no teacher given")
    slugs = [s.slug for s in specs]
    if len(set(slugs)) != len(slugs):
        raise ConfigError(f"--teachers: two teachers share an output name: {slugs}")
    return specs


def _field(config: dict, *names: str) -> int:
    for n in names:
        if isinstance(config.get(n), int):
            return config[n]
    raise ConfigError(f"model config has none of {names} (not a BERT-family encoder config)")


def forward_flops(config: dict, tokens: int) -> float:
    """Forward FLOPs of one sequence of `tokens` tokens (module docstring)."""
    layers = _field(config, "num_hidden_layers", "n_layers")
    d = _field(config, "hidden_size", "dim")
    ff = _field(config, "intermediate_size", "hidden_dim")
    ffn_mats = 3 if config.get("model_type") == "modernbert" else 2  # gated: Wi is d x 2ff
    per_token = 2 * (4 * d * d + ffn_mats * d * ff) + 4 * tokens * d
    return float(layers * per_token * tokens)


def gpu_hours(flops: float, tflops: float) -> float:
    return flops / (tflops * 1e12) / 3600
