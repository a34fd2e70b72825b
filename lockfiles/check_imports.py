#!/usr/bin/env python3
"""Import every top-level module of every installed distribution, one subprocess each.

Usage: python lockfiles/check_imports.py [--freeze pip_freeze.txt]

Run it with the interpreter of the environment to check (the host .venv, or the image's).
With --freeze, every distribution named in that file must be installed and is checked;
without it, every installed distribution is. A module counts as importable when
`python -c "import <module>"` exits 0 within the timeout. Modules listed in SKIP are not
imported, each for the reason given; a distribution without any module is reported as
"shared libraries only" when it ships .so files and fails otherwise (never silently passed). Exit status 1 when any import fails.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

# module -> why it is not imported on its own. Every entry is a real limitation, not a
# failure being hidden: these modules are entry points that act on import.
SKIP = {
    "__editable__": "setuptools editable-install shim, not a module",
    "_distutils_hack": "setuptools import hook, installed by setuptools itself",
    "pythonwin": "Windows only",
}
TIMEOUT_S = 120


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def top_level_modules(dist: md.Distribution) -> list[str]:
    """Top-level importable names a distribution installs, from its RECORD."""
    names: set[str] = set()
    for f in dist.files or []:
        parts = f.parts
        if not parts or parts[0].endswith((".dist-info", ".data")) or parts[0] == "..":
            continue
        head = parts[0]
        if len(parts) == 1:
            if head.endswith(".py"):
                names.add(head[:-3])
            elif head.endswith(".so"):
                names.add(head.split(".")[0])
        elif f.name == "__init__.py":
            # The shallowest regular package on the path: below a namespace directory
            # (no __init__.py, e.g. google/) that is google.protobuf; below a regular
            # package it is that package (its inner directories import through it).
            inits = {g.parts[:-1] for g in dist.files if g.name == "__init__.py"}
            depth = next(i for i in range(1, len(parts)) if parts[:i] in inits)
            names.add(".".join(parts[:depth]))
    return sorted(n for n in names
                  if all(p.isidentifier() for p in n.split(".")) and n not in SKIP)


def wanted(freeze: Path | None) -> dict[str, md.Distribution]:
    installed = {norm(d.metadata["Name"]): d for d in md.distributions()}
    if freeze is None:
        return installed
    out = {}
    for lineno, line in enumerate(freeze.read_text().splitlines(), 1):
        name = line.split("==", 1)[0].strip()
        if not name:
            continue
        if norm(name) not in installed:
            sys.exit(f"{freeze}:{lineno}: {name} is not installed in {sys.prefix}")
        out[norm(name)] = installed[norm(name)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--freeze", type=Path, help="check exactly the distributions of this file")
    args = ap.parse_args()
    failures = 0
    for name, dist in sorted(wanted(args.freeze).items()):
        mods = top_level_modules(dist)
        if not mods and any(".so" in f.name for f in dist.files or []):
            # e.g. nvidia-nvjitlink-cu12 12.9: a namespace directory of .so files that
            # torch loads by path; there is nothing to import.
            print(f"--   {name}: shared libraries only, no module to import")
            continue
        if not mods:
            print(f"FAIL {name}: no importable top-level module found")
            failures += 1
            continue
        for mod in mods:
            r = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True,
                               text=True, timeout=TIMEOUT_S)
            if r.returncode == 0:
                print(f"ok   {name}: {mod}")
            else:
                last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
                print(f"FAIL {name}: import {mod}: {last}")
                failures += 1
    print(f"{failures} import failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
