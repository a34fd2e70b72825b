"""aleph.sync sits below train: it never imports the layers above it."""

from __future__ import annotations

import ast
from pathlib import Path

import aleph.sync

ABOVE = ("aleph.train", "aleph.eval", "aleph.report", "aleph.campaign", "aleph.cli")


def test_sync_imports_nothing_above_it():
    found = []
    for path in sorted(Path(aleph.sync.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}: {n}" for n in names if n.startswith(ABOVE)]
    assert found == []
