"""The package's import graph: dependencies flow one way (docs/ARCHITECTURE.md).

Read from the source with ast (every import, deferred ones inside functions included), so
a new `from aleph.train import ...` in report, or a cycle between two subpackages, fails
here instead of surfacing as an import-order bug later.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "aleph"

# Floor of every top-level part of `aleph`: an import may go to a lower floor, or sideways
# on the same floor when no cycle results; never up.
FLOORS = {
    "__main__": 7, "cli": 7,
    "campaign": 6,
    "train": 5, "eval": 5, "report": 5,
    "sync": 4,
    "model": 3, "targets": 3, "data": 3, "record": 3,
    "env": 2,
    "_io": 1, "_faults": 1, "_hub": 1, "_signals": 1, "_fields": 1, "errors": 0, "__init__": 0,
}


def import_graph() -> dict[str, set[str]]:
    """{part: parts of aleph it imports}, over every module below aleph/."""
    edges: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        src = parts[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + ([f"aleph.{a.name}" for a in node.names]
                                         if node.module == "aleph" else [])
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("aleph.") and (dst := name.split(".")[1]) != src:
                    edges[src].add(dst)
    return edges


def test_every_part_of_the_package_has_a_floor():
    parts = {p.relative_to(PACKAGE).with_suffix("").parts[0] for p in PACKAGE.rglob("*.py")}
    assert parts - set(FLOORS) == set(), "give the new part a floor in FLOORS"


def test_no_import_runs_up_a_floor():
    up = sorted(f"{src} (floor {FLOORS[src]}) imports {dst} (floor {FLOORS[dst]})"
                for src, dsts in import_graph().items() for dst in dsts
                if dst in FLOORS and FLOORS[dst] > FLOORS[src])
    assert up == []


def test_the_parts_import_each_other_without_a_cycle():
    graph = import_graph()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path + [node, nxt]
            if nxt not in state and (cycle := visit(nxt, path + [node])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            assert visit(start, []) is None


def test_report_and_eval_do_not_reach_into_the_trainer_beyond_its_config():
    """report reads the run record (aleph.record) and the config schema, never the loop,
    session or checkpoints; eval reads run directories, not the trainer's code."""
    for sub in ("report", "eval"):
        for path in (PACKAGE / sub).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aleph.train"):
                    assert node.module == "aleph.train.config" and sub == "report", (
                        f"{path.relative_to(PACKAGE)} imports {node.module}")
