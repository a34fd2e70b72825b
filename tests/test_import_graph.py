"""The package's import graph: dependencies flow one way (docs/ARCHITECTURE.md).

Read from the source with ast (every import, deferred ones inside functions included), so
a new `from aleph.train import ...` in report, a cycle between two subpackages, or a
cycle between two modules (inside a subpackage too) fails here instead of surfacing as an
import-order bug later.
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


def module_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: modules of aleph it imports}, every module below `package` (a package's
    __init__ is the package's module). `import a.b.c` is an arrow to a.b.c (the longest
    name that is a module); `from P import n` (absolute or relative) to P, and to P.n too
    when that is a submodule: the names are read through P's namespace. Deferred imports
    inside functions count. The import of a parent package that every import of a
    submodule implies is not an arrow (else each package would cycle with its modules)."""
    files = {}
    for path in package.rglob("*.py"):
        parts = ("aleph", *path.relative_to(package).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = alias.name
                    while target and target not in files:
                        target = target.rpartition(".")[0]
                    out.add(target)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                out |= {base} | {f"{base}.{a.name}" for a in node.names}
        graph[name] = (out & set(files)) - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_import_cycles_are_found_in_every_form_of_import(tmp_path):
    # the reader itself, on a package of its own: relative, absolute, deferred, via __init__
    pkg = tmp_path / "aleph"
    (pkg / "p").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "p" / "__init__.py").write_text("from aleph.p.a import f\n")
    (pkg / "p" / "a.py").write_text("from . import b\n\ndef f():\n    pass\n")
    (pkg / "p" / "b.py").write_text("def g():\n    import aleph.p.c\n")
    (pkg / "p" / "c.py").write_text("from .a import f\n")
    (pkg / "p" / "d.py").write_text("from aleph.p import a\n")
    graph = module_graph(pkg)
    assert graph["aleph.p.a"] == {"aleph.p", "aleph.p.b"}  # `from . import b`: through p
    assert graph["aleph.p.b"] == {"aleph.p.c"} and graph["aleph.p.c"] == {"aleph.p.a"}
    assert graph["aleph.p.d"] == {"aleph.p", "aleph.p.a"}  # imported by none: in no cycle
    assert import_cycles(graph) == [["aleph.p", "aleph.p.a", "aleph.p.b", "aleph.p.c"]]


def test_no_module_imports_itself_back():
    """No cycle between modules, inside a subpackage either (a module imported while the
    one it imports is half initialised fails, or not, by import order)."""
    assert import_cycles(module_graph()) == []
