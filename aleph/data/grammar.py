"""The smoke grammar: captions generated from meanings, and the meaning of each caption.

A meaning is one concept per slot (object, colour, action, place) plus an optional
companion object. Every concept has several surface words (synonyms) and captions use
several templates, so one meaning has many paraphrases. The stand-in teacher
(`aleph.data.smoke_teacher`) and the STS gold scores depend on the meaning only.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

# concept -> surface words (synonyms); the first word is the concept's name.
OBJECTS = {
    "dog": ["dog", "puppy", "hound"], "cat": ["cat", "kitten", "kitty"],
    "car": ["car", "automobile", "sedan"], "bicycle": ["bicycle", "bike", "cycle"],
    "man": ["man", "guy", "gentleman"], "woman": ["woman", "lady"],
    "child": ["child", "kid", "youngster"], "boat": ["boat", "ship", "vessel"],
    "horse": ["horse", "stallion", "pony"], "bird": ["bird", "sparrow", "songbird"],
    "train": ["train", "locomotive"], "chair": ["chair", "seat", "stool"],
}
COLOURS = {
    "red": ["red", "crimson", "scarlet"], "blue": ["blue", "azure", "navy"],
    "green": ["green", "emerald"], "yellow": ["yellow", "golden"],
    "black": ["black", "dark", "ebony"], "white": ["white", "pale", "snowy"],
    "brown": ["brown", "tan"], "orange": ["orange", "amber"],
}
ACTIONS = {
    "running": ["running", "sprinting", "dashing"], "sitting": ["sitting", "resting", "perched"],
    "jumping": ["jumping", "leaping", "hopping"], "sleeping": ["sleeping", "napping", "dozing"],
    "waiting": ["waiting", "standing", "lingering"], "moving": ["moving", "travelling", "heading"],
    "playing": ["playing", "frolicking"], "posing": ["posing", "displayed", "shown"],
}
PLACES = {
    "beach": ["beach", "shore", "seaside"], "park": ["park", "playground"],
    "street": ["street", "road", "avenue"], "forest": ["forest", "woods", "woodland"],
    "kitchen": ["kitchen", "cookhouse"], "field": ["field", "meadow", "pasture"],
    "city": ["city", "town", "downtown"], "lake": ["lake", "pond", "lagoon"],
}
SLOTS = {"object": OBJECTS, "colour": COLOURS, "action": ACTIONS, "place": PLACES}

TEMPLATES = (
    "a {colour} {object} {action} on the {place}{extra}",
    "the {colour} {object} is {action} near the {place}{extra}",
    "photo of a {colour} {object} {action} in the {place}{extra}",
    "{place} scene: a {colour} {object} {action}{extra}",
    "there is a {colour} {object} {action} by the {place}{extra}",
    "close up of the {colour} {object} {action} at the {place}{extra}",
)
WITH = (" with a {companion}", " next to a {companion}", " beside a {companion}")


@dataclass(frozen=True)
class Meaning:
    """What a caption says; paraphrases share it."""

    object: str
    colour: str
    action: str
    place: str
    companion: str | None = None

    def concepts(self) -> dict[str, str]:
        """{slot: concept} in field order, the companion only when there is one."""
        return {slot: c for slot, c in asdict(self).items() if c is not None}


def sample_meaning(rng: random.Random, p_companion: float = 0.3) -> Meaning:
    """A uniformly random meaning; a companion object (different from the subject) sometimes."""
    parts = {slot: rng.choice(sorted(table)) for slot, table in SLOTS.items()}
    companion = None
    if rng.random() < p_companion:
        companion = rng.choice(sorted(set(OBJECTS) - {parts["object"]}))
    return Meaning(companion=companion, **parts)


def render(meaning: Meaning, rng: random.Random) -> tuple[str, int]:
    """One surface form of `meaning` (random synonyms and template) and its template index."""
    t = rng.randrange(len(TEMPLATES))
    words = {slot: rng.choice(SLOTS[slot][getattr(meaning, slot)]) for slot in SLOTS}
    with_ = ""
    if meaning.companion is not None:
        with_ = rng.choice(WITH).format(companion=rng.choice(OBJECTS[meaning.companion]))
    return TEMPLATES[t].format(**words, extra=with_), t
