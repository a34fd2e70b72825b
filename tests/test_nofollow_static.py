"""No file under aleph/ is opened for writing through a symbolic link (issue 32): a static
check over every module's syntax tree (`ast`), so a new writer cannot slip past review.

What counts as opening a file for writing (by path, not by an fd already checked):
- `open(path, mode)` and `io.open(...)` whose mode holds w, a, x or + (a mode that is not
  a string literal counts as writing), and `<path>.open("w")` with such a literal mode (a
  method named open with other arguments is some other object's, e.g. `State.open`);
- `<path>.write_text(...)`, `<path>.write_bytes(...)`;
- `os.open(path, flags, ...)` whose flags name O_WRONLY, O_RDWR, O_APPEND, O_CREAT or O_TRUNC
  (flags held in a local variable: the names that variable is assigned from, in its function).

Such a call keeps the no-follow rule when:
- `os.open`'s flags name O_NOFOLLOW, or O_CREAT with O_EXCL (creating exclusively fails on
  a link instead of following it);
- `open`'s mode holds x (O_CREAT | O_EXCL);
- or the line (or a comment line just above) says `# nofollow-ok: <why>`, for a path the same code
  made itself a moment before with O_EXCL (a mkstemp name) and no one else can swap.
`os.fdopen(fd)` is not an open by path, and the atomic writers of aleph/_io.py write to a
mkstemp file of their own through its fd and rename it; `aleph._io.open_write_nofollow` is
the helper for the rest.

PENDING lists writers in packages another branch of issue 32 owns (targets, train,
campaign), by file and call, so they are seen: a new entry fails, and so does an entry whose
call is gone (remove it from the list then).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_APPEND", "O_CREAT", "O_TRUNC"}
WRITE_MODE = set("wax+")
EXEMPT = "# nofollow-ok:"

PENDING: set[tuple[str, str]] = set()  # none left: every writer follows the rule


def _names(node: ast.AST) -> set[str]:
    """Every name and attribute a flags expression mentions (os.O_RDWR -> O_RDWR)."""
    return {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(node)
            if isinstance(n, ast.Attribute | ast.Name)}


def _mode(call: ast.Call, position: int) -> str | None:
    """The mode argument's literal text; '?' when it is not a literal; None when absent."""
    node = next((k.value for k in call.keywords if k.arg == "mode"), None)
    if node is None and len(call.args) > position:
        node = call.args[position]
    if node is None:
        return None
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else "?"


def _assigned(tree: ast.AST) -> dict[ast.Call, dict[str, set[str]]]:
    """For each call, the names each local variable of its function is assigned from
    (`flags = os.O_RDWR | ...; os.open(p, flags)`: the call's flags are those names)."""
    out: dict[ast.Call, dict[str, set[str]]] = {}
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))]
    for scope in scopes:  # functions last: a call gets its innermost function's assignments
        values: dict[str, set[str]] = {}
        for n in ast.walk(scope):
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        values.setdefault(t.id, set()).update(_names(n.value))
        for n in ast.walk(scope):
            if isinstance(n, ast.Call):
                out[n] = values
    return out


def write_opens(source: str) -> list[tuple[int, str, bool]]:
    """(line, call, keeps the rule) of every write open in a module's source."""
    lines, tree = source.splitlines(), ast.parse(source)
    assigned = _assigned(tree)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn, kept = node.func, None
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
        owner = fn.value.id if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) else ""
        if name == "open" and owner == "os":
            flags = _names(node.args[1]) if len(node.args) > 1 else set()
            for n in list(flags):  # a local variable: the names it was assigned from
                flags |= assigned[node].get(n, set())
            if flags & WRITE_FLAGS:
                kept = "O_NOFOLLOW" in flags or {"O_CREAT", "O_EXCL"} <= flags
        elif name == "open" and (isinstance(fn, ast.Name) or owner == "io"):
            mode = _mode(node, 1)  # builtin/io open(path, mode)
            if mode is not None and (mode == "?" or set(mode) & WRITE_MODE):
                kept = "x" in mode
        elif name == "open" and owner not in ("os", "gzip", "tarfile", "lzma", "bz2", "zipfile"):
            mode = _mode(node, 0)  # <path>.open(mode): only a literal mode says it is a file
            if mode is not None and mode != "?" and set(mode) & WRITE_MODE:
                kept = "x" in mode
        elif name in ("write_text", "write_bytes"):
            kept = False
        elif name in ("memmap", "open_memmap"):  # numpy opens a path it is given itself
            mode = _mode(node, 2 if name == "memmap" else 1)
            if mode is None and name == "memmap":
                mode = "r+"  # numpy's default
            if mode is not None and (mode == "?" or set(mode) & WRITE_MODE):
                kept = False
        if kept is None:
            continue
        above = lines[node.lineno - 2] if node.lineno > 1 else ""
        marked = any(EXEMPT in ln and ln.split(EXEMPT, 1)[1].strip() != "" for ln in
                     (lines[node.lineno - 1], above if above.lstrip().startswith("#") else ""))
        out.append((node.lineno, ast.unparse(node), kept or marked))
    return out


def test_the_rule_itself_tells_the_cases_apart():
    src = "\n".join([
        "open(p, 'a')", "open(p, 'rb')", "open(p)", "open(p, mode)", "open(p, 'xb')",
        "p.open('w')", "p.open()", "p.write_text(s)",
        "os.open(p, os.O_RDONLY)", "os.open(p, os.O_WRONLY | os.O_CREAT)",
        "os.open(p, os.O_RDWR | os.O_NOFOLLOW)", "os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL)",
        "gzip.open(p, 'rb')", "os.fdopen(fd, 'w')",
        "open(tmp, 'w')  # nofollow-ok: our own mkstemp name", "open(tmp, 'w')  # nofollow-ok:",
        "State.open(d / 'state.json', spec)",
        "def f(p):\n    flags = os.O_RDWR | os.O_NOFOLLOW\n    return os.open(p, flags | x)",
        "def g(p):\n    flags = os.O_RDWR\n    return os.open(p, flags)",
        "np.lib.format.open_memmap(p, mode='w+')", "np.memmap(p, mode='r')", "np.memmap(p)",
    ])
    got = sorted((line, kept) for line, _, kept in write_opens(src))
    assert got == [(1, False), (4, False), (5, True), (6, False), (8, False), (10, False),
                   (11, True), (12, True), (15, True), (16, False), (20, True), (23, False),
                   (24, False), (26, False)]


def test_no_file_under_aleph_is_opened_for_writing_through_a_link():
    found, bad = set(), []
    for path in sorted((ROOT / "aleph").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for line, call, kept in write_opens(path.read_text(encoding="utf-8")):
            if kept:
                continue
            if (rel, call) in PENDING:
                found.add((rel, call))
            else:
                bad.append(f"{rel}:{line}: {call}")
    assert not bad, ("opened for writing without O_NOFOLLOW, O_EXCL or a `# nofollow-ok: why` "
                     "(use aleph._io.open_write_nofollow):\n" + "\n".join(bad))
    assert found == PENDING, f"no longer there: remove from PENDING: {sorted(PENDING - found)}"
