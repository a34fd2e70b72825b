"""Pinned package sets: parse `pip_freeze.txt` and `lockfiles/*.txt`, read the live set.

Names are normalised per PEP 503 (`Foo_Bar.baz` -> `foo-bar-baz`) on both sides, so a
lock written by one tool and a freeze written by another compare by identity, not spelling.
The reader is `importlib.metadata` (about 50 ms), not a `pip freeze` subprocess (seconds).
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from aleph._io import sha256_bytes
from aleph.errors import ConfigError

# The project itself runs from PYTHONPATH in the image; an editable install on a dev
# host must not count as drift.
SELF_NAMES = frozenset({"aleph"})
# `pip freeze` leaves these out by default (Python < 3.12); they are compared only
# when the expected set names them, so a freeze without them still matches a venv.
INSTALLER_NAMES = frozenset({"pip", "setuptools", "wheel", "distribute"})

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;]+)\s*(;.*)?$")


def normalise(name: str) -> str:
    """PEP 503 normal form of a distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _logical_lines(text: str):
    """Yield (first line number, text) with backslash continuations joined."""
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        yield start, buf + line
        buf = ""
    if buf:
        yield start, buf


def parse_pins(path: str | Path) -> dict[str, str]:
    """`{normalised name: version}` from a freeze or a hash-locked requirements file:
    `name==version` lines, `--hash=` options, comments and option lines. Anything else, or a
    name pinned twice, is a ConfigError naming file and line (else a package would silently
    drop out of the check)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: pin file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the pin file ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e}); expected 'name==version' lines") from None
    pins: dict[str, str] = {}
    for lineno, line in _logical_lines(text):
        line = re.sub(r"(^|\s)#.*$", "", line)  # comments
        line = re.sub(r"\s--hash[=\s]\S+", "", line).strip()
        if not line or line.startswith("-"):
            continue
        m = _PIN.match(line)
        if not m:
            raise ConfigError(f"{path}:{lineno}: expected 'name==version' (optionally with "
                              f"--hash), found {line!r}")
        name = normalise(m.group(1))
        if name in pins:
            raise ConfigError(f"{path}:{lineno}: {name} is pinned twice")
        pins[name] = m.group(3)
    return pins


def installed_packages(path: list[str] | None = None) -> dict[str, str]:
    """`{normalised name: version}` of the distributions importable from `path` (sys.path)."""
    found: dict[str, str] = {}
    for dist in metadata.distributions(path=path) if path else metadata.distributions():
        name, version = _name_version(dist)
        if name:  # a broken .dist-info without a name is skipped, as pip does
            found.setdefault(normalise(name), version)  # first on the path wins, as imports
    return {n: v for n, v in found.items() if n not in SELF_NAMES}


def _name_version(dist: metadata.Distribution) -> tuple[str | None, str | None]:
    """Name and Version from the metadata's header lines. `dist.metadata` runs the email
    parser over the whole file (long descriptions included): ~750k Python calls for the
    179 packages, which the executed-code tracer of a launch (aleph.record) would pay."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
    if text is None:
        return dist.metadata["Name"], dist.version
    name = version = None
    for line in text.splitlines():
        if not line.strip():
            break  # the end of the headers
        if name is None and line.startswith("Name:"):
            name = line[5:].strip()
        elif version is None and line.startswith("Version:"):
            version = line[8:].strip()
    return name, version


def freeze_lines(packages: dict[str, str]) -> list[str]:
    """Sorted `name==version` lines, the canonical form the freeze hash is taken over."""
    return [f"{n}=={packages[n]}" for n in sorted(packages)]


def freeze_sha256(packages: dict[str, str]) -> str:
    """sha256 of the sorted `name==version` lines, newline-terminated, UTF-8."""
    return sha256_bytes("".join(f"{line}\n" for line in freeze_lines(packages)).encode("utf-8"))


def comparable(installed: dict[str, str], expected: dict[str, str]) -> dict[str, str]:
    """Drop installer tools from `installed` unless `expected` pins them (see INSTALLER_NAMES)."""
    return {n: v for n, v in installed.items() if n not in INSTALLER_NAMES or n in expected}


def diff_packages(installed: dict[str, str],
                  expected: dict[str, str]) -> list[tuple[str, str | None, str | None]]:
    """Sorted `(name, expected, found)` for every package whose version differs or that is
    missing (found None) or extra (expected None)."""
    live = comparable(installed, expected)
    return [(n, expected.get(n), live.get(n)) for n in sorted(set(live) | set(expected))
            if expected.get(n) != live.get(n)]
