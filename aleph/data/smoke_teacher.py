"""The smoke data's stand-in teacher: a caption's target is a function of its meaning.

target = normalize(sum over the meaning's features f of weight_f * g_f), where every
feature (a slot concept, the object-colour binding, the template) has a fixed random
Gaussian vector g_f in R^768. Random 768-d vectors are nearly orthogonal, so the cosine
of two targets is close to the weighted overlap of their features: paraphrases (same
meaning, other synonyms/template) differ only by the small template term (cos ~0.99),
captions sharing nothing are near 0, partial overlaps fall in between. This is also how
`sts_pairs` scores gold similarity, so a model that learns the targets learns the STS task.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from aleph.data.grammar import Meaning

DIM = 768
WEIGHTS = {"object": 1.0, "action": 0.8, "place": 0.7, "colour": 0.6, "companion": 0.5,
           "binding": 0.3}
TEMPLATE_WEIGHT = 0.1  # surface form: paraphrases end near-identical, not identical


def features(meaning: Meaning) -> dict[str, float]:
    """The meaning as weighted features; a companion shares the object's feature space."""
    out: dict[str, float] = {}
    for slot, concept in meaning.concepts().items():
        key = f"object:{concept}" if slot == "companion" else f"{slot}:{concept}"
        out[key] = out.get(key, 0.0) + WEIGHTS[slot]
    out[f"binding:{meaning.object}+{meaning.colour}"] = WEIGHTS["binding"]
    return out


def overlap_cosine(a: Meaning, b: Meaning) -> float:
    """Cosine of two meanings with orthonormal features: the expected target cosine."""
    fa, fb = features(a), features(b)
    dot = sum(w * fb.get(k, 0.0) for k, w in fa.items())
    na = math.sqrt(sum(w * w for w in fa.values()))
    nb = math.sqrt(sum(w * w for w in fb.values()))
    return dot / (na * nb)


class Teacher:
    """Deterministic feature vectors (seeded by the feature's name), cached."""

    def __init__(self, dim: int = DIM) -> None:
        self.dim = dim
        self._cache: dict[str, np.ndarray] = {}

    def vector(self, key: str) -> np.ndarray:
        if key not in self._cache:
            seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
            rng = np.random.Generator(np.random.PCG64(seed))
            self._cache[key] = rng.standard_normal(self.dim) / math.sqrt(self.dim)  # (D,)
        return self._cache[key]

    def target(self, meaning: Meaning, template: int) -> np.ndarray:
        """The unit float64 target of one caption."""
        v = TEMPLATE_WEIGHT * self.vector(f"template:{template}")  # (D,)
        for key, weight in features(meaning).items():
            v = v + weight * self.vector(key)  # (D,)
        return v / np.linalg.norm(v)  # (D,)
