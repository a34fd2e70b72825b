"""Typed, frozen config dataclasses checked from their own declarations (ModelConfig, TrainConfig).

Each field's type is its real annotation (`typing.get_type_hints`: bool, int, float, str,
`Literal[...]`, `X | None`, `tuple[X, ...]`, `tuple[X, Y]`); each value rule is declared at
its field with `rule(test, expected)` in the field's metadata (`checks`). `check_fields`
coerces (list -> tuple, int -> float where a float is declared), checks every type, then
every rule, and raises ConfigError in one line: "<label>: got <value>, expected <what>".
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable
from dataclasses import fields
from typing import Any, Literal, NamedTuple, Union

from aleph._io import short_repr
from aleph.errors import ConfigError


class Rule(NamedTuple):
    """A value rule: test(value, config) -> True when acceptable (other fields may be read);
    `expected` names what is expected in the error line: `{name}` placeholders read the
    config's fields (or a function of the config)."""

    test: Callable[[Any, Any], bool]
    expected: str | Callable[[Any], str]


rule = Rule
POSITIVE_INT = rule(lambda v, c: v > 0, "a positive integer")
POSITIVE = rule(lambda v, c: v > 0, "a positive number")
AT_LEAST_0 = rule(lambda v, c: v >= 0, "a number >= 0")
BELOW_1 = rule(lambda v, c: 0 <= v < 1, "a number in [0, 1)")


def check_fields(obj: Any, label: str) -> None:
    """Check the frozen dataclass `obj` against its declarations; `label` names a field in
    the error line (`label.format(name)`, e.g. "config field {!r}" or "ModelConfig.{}")."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        tp, value = hints[f.name], getattr(obj, f.name)
        value = _as_declared(tp, tuple(value) if isinstance(value, list) else value)
        object.__setattr__(obj, f.name, value)
        if not type_ok(tp, value):
            kind = "" if typing.get_origin(tp) is Literal else f" ({type(value).__name__})"
            raise ConfigError(f"{label.format(f.name)}: got {short_repr(value)}{kind}, "
                              f"expected {type_text(tp)}")
        numbers = value if isinstance(value, tuple) else (value,)
        if any(isinstance(x, float) and not math.isfinite(x) for x in numbers):
            raise ConfigError(f"{label.format(f.name)}: got {short_repr(value)}, "
                              "expected a finite number")
    for f in fields(obj):  # after every type: a rule may read other fields
        for r in f.metadata.get("checks", ()):
            if not r.test(getattr(obj, f.name), obj):
                what = r.expected(obj) if callable(r.expected) else r.expected.format_map(vars(obj))
                raise ConfigError(f"{label.format(f.name)}: got {short_repr(getattr(obj, f.name))}, "
                                  f"expected {what}")


def type_ok(tp: Any, value: Any) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is bool:
        return isinstance(value, bool)
    if origin in (Union, types.UnionType):
        return any(type_ok(a, value) for a in args)
    if isinstance(value, bool):  # bool is an int subclass: only where declared
        return False
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, int | float)
    if tp in (int, str):
        return isinstance(value, tp)
    if origin is Literal:
        return any(type(value) is type(a) and value == a for a in args)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(type_ok(args[0], x) for x in value)
        return len(value) == len(args) and all(type_ok(a, x) for a, x in zip(args, value, strict=True))
    raise TypeError(f"no check for the annotation {tp!r}")  # a new kind of field: add it here


def type_text(tp: Any) -> str:
    """The annotation as a reader would write it; a Literal as "one of a, b, c"."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(map(str, args))
    if origin in (Union, types.UnionType):
        return " | ".join(map(type_text, args))
    if origin is tuple:
        return f"tuple[{', '.join('...' if a is Ellipsis else type_text(a) for a in args)}]"
    return "None" if tp is type(None) else tp.__name__


def accepts(tp: Any, kind: type) -> bool:
    """Whether the annotation takes values of `kind` (float, str, None ...) at its top level."""
    args = typing.get_args(tp) if typing.get_origin(tp) in (Union, types.UnionType) else (tp,)
    return kind in args


def _as_declared(tp: Any, value: Any) -> Any:
    """An int where a float is declared becomes a float (`--set alloc_cap_fraction=1`, `lr: 1`
    in YAML): torch 2.4.1 APIs such as set_per_process_memory_fraction raise TypeError on an
    int, and the echoed config shows what was used."""
    if isinstance(value, int) and not isinstance(value, bool) and accepts(tp, float) \
            and not accepts(tp, int):
        return float(value)
    if typing.get_origin(tp) is tuple and isinstance(value, tuple):
        args = typing.get_args(tp)
        each = [args[0]] * len(value) if args[-1:] == (Ellipsis,) else list(args)
        if len(each) == len(value):
            return tuple(_as_declared(a, x) for a, x in zip(each, value, strict=True))
    return value
