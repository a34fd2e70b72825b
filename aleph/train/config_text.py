"""A config as text: files (JSON, YAML without aliases), `--set key=value` overrides coerced
to each field's declared type, and the fields' documentation for `aleph train --help`.
Generic over the config class (given by the caller): nothing here imports config.py."""

from __future__ import annotations

import difflib
import json
import re
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

from aleph._fields import accepts, type_text
from aleph._io import load_yaml, read_bounded, short_repr
from aleph.errors import ConfigError

CONFIG_MAX_BYTES = 1 << 20  # a config is a flat mapping of ~60 fields: a few KiB


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a flat JSON or YAML mapping of field names from a regular file of at most
    CONFIG_MAX_BYTES (YAML aliases refused); errors name the file."""
    path = Path(path)
    try:
        text = read_bounded(path, CONFIG_MAX_BYTES).decode("utf-8")
    except OSError as e:
        raise ConfigError(f"config file {path}: cannot read ({e.strerror})") from e
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path}: not UTF-8 text") from None
    kind = path.suffix.lstrip(".") or "json"
    try:
        data = load_yaml(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"config file {path}: not valid {kind} at line {e.lineno}, column "
                          f"{e.colno}: {e.msg}") from None
    except Exception as e:  # yaml.YAMLError: one line from its mark, not its multi-line dump
        raise ConfigError(f"config file {path}: not valid {kind}{_yaml_where(e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of field names, got {type(data).__name__}")
    return data


def _yaml_where(e: Exception) -> str:
    """' at line L, column C: <problem> (<context>)' of a PyYAML error, 1-based, one line."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or " ".join(str(e).split())
    context = getattr(e, "context", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{where}: {problem}" + (f" ({context})" if context else "")


# A decimal number as people write it. YAML 1.1 (PyYAML) reads "1e-3" and "5e-4" as
# *strings* (its float pattern wants a dot and a signed exponent), so numbers are taken
# from the text by the field's declared type, not by YAML's guess.
_NUMBER = re.compile(r"[+-]?(\d[\d_]*(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def coerce(tp: Any, value: Any, raw: str | None = None) -> Any:
    """`value` (parsed from YAML, or `raw` text of a --set) as the annotation `tp` declares it:
    floats in any decimal spelling ("1e-3"), strings as written ("2024"), tuples as
    "0.9,0.98"; anything else is left for the type check to report, naming the field."""
    if tp is None:  # an unknown field: reported by the caller
        return value
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        variadic = args[-1:] == (Ellipsis,)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip() or not variadic]
        if isinstance(value, list | tuple):
            return [coerce(args[0] if variadic else args[min(i, len(args) - 1)], v)
                    for i, v in enumerate(value)]
        return value
    if accepts(tp, float):
        text = value.strip() if isinstance(value, str) else ""
        return float(text.replace("_", "")) if _NUMBER.fullmatch(text) else value
    if accepts(tp, str) and raw is not None and not isinstance(value, str):
        return None if value is None and accepts(tp, type(None)) else raw.strip()
    return value


def parse_override(item: str, types: dict[str, Any] | None = None) -> tuple[str, Any]:
    """'key=value' -> (key, value); the value is parsed as YAML (so true, null, [a, b] work),
    then coerced to the field's declared type in `types` (so 1e-3 is a float, 2024 for a
    string field is the string "2024"; see coerce)."""
    import yaml

    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {short_repr(item)}: expected key=value")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, coerce((types or {}).get(key), value, raw)


def with_suggestion(key: str, known: set[str]) -> str:
    """`key`, with "(did you mean 'x'?)" when a known field is spelt close to it."""
    close = difflib.get_close_matches(key, sorted(known), n=1)
    return f"{key} (did you mean {close[0]!r}?)" if close else key


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its docstring (the string literal under the field in `cls` or the
    class it inherits it from), read from the source: what `aleph train --help` prints."""
    import ast
    import inspect

    docs = {}
    for klass in reversed([k for k in cls.__mro__ if "__dataclass_fields__" in vars(k)]):
        body = ast.parse(inspect.getsource(klass)).body[0].body
        for node, after in zip(body, body[1:], strict=False):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return {f.name: docs.get(f.name, "") for f in fields(cls)}


def fields_help(cls: type, presets: dict[str, dict[str, Any]]) -> str:
    """One entry per config field: name, type, default (the e1 values; the smoke preset's
    where it differs) and the first sentence of its docstring."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    smoke = presets["smoke"]
    out = ["config fields (set with --set KEY=VALUE or a --config file; default = the e1 "
           "preset's, [smoke: ...] where the smoke preset differs):"]
    for f in fields(cls):
        default = f.default
        alt = f" [smoke: {smoke[f.name]!r}]" if f.name in smoke and smoke[f.name] != default else ""
        first = re.split(r"(?<=\.)\s+(?=[A-Z])", docs[f.name], maxsplit=1)[0]  # not after "e.g."
        out.append(f"  {f.name} ({type_text(hints[f.name])}) = {default!r}{alt}")
        out.append(f"      {first}")
    return "\n".join(out)
