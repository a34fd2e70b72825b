"""Which functions of `aleph/` a launch executed, as hashes of their source.

- `Tracer`: a `sys.settrace` hook that only notes each code object called (no line events).
  It runs from `aleph train`'s start over the preflight and first steps, then only around
  the loop's rare events, so steady steps run untraced (cost: aleph/train/README.md).
- `scopes`: every function of a file (by `__qualname__`) and `<module>` (what runs at
  import). A scope's hash is the sha256 of its AST dump without docstrings and nested
  function bodies: comments and formatting are no change, and a change inside a nested
  function counts for that function. Lambdas and comprehensions belong to their function.
- `Tracer.record()`: {file: {scope: hash}} of what ran plus every package file's sha256,
  written as `launches/<id>.code.json`; `aleph.record.executed` judges changed hunks by it.

Granularity is the function: a changed line inside a function that ran counts as executed
even when its own branch was not taken.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from aleph._io import open_write_nofollow
from aleph.record.provenance import file_hashes, package_dir, package_files

MODULE = "<module>"
OFF_ENV = "ALEPH_EXECUTED_TRACE"
SCHEMA = "aleph-executed-code/1"
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


# --- scopes of one source file -----------------------------------------------------------

class Scopes:
    """The scopes of one file: their hashes (computed when first asked) and, per line, the
    scopes the line belongs to."""

    def __init__(self, nodes: dict[str, list], lines: dict[int, set[str]] | None = None,
                 fixed: dict[str, str] | None = None, names: set[str] | None = None) -> None:
        self._nodes = nodes  # scope -> its AST node(s) (a name defined twice has two)
        self._hashes: dict[str, str] = dict(fixed or {})
        self.lines = lines or {}  # 1-based line -> scope names
        self.names = set(names or ()) | set(nodes) | set(self._hashes)

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def hash(self, name: str) -> str | None:
        """The scope's hash; None when the file has no such scope."""
        if name not in self._hashes:
            nodes = self._nodes.get(name)
            if nodes is None:
                return None
            parts = [hashlib.sha256(_dump(n, n).encode()).hexdigest() for n in nodes]
            self._hashes[name] = parts[0] if len(parts) == 1 else hashlib.sha256(
                "".join(parts).encode()).hexdigest()
        return self._hashes[name]

    @property
    def hashes(self) -> dict[str, str]:
        """Every scope's hash (None for a name known only from a cache that lacks it)."""
        return {name: self.hash(name) for name in sorted(self.names)}

    def of_lines(self, numbers) -> set[str]:
        return set().union(*(self.lines.get(n, {MODULE}) for n in numbers))

    def resolve(self, qualname: str) -> str:
        """The scope of a code object's qualname (a lambda or comprehension -> its function)."""
        name = qualname
        while name and name not in self:
            if ".<locals>." not in name and "." not in name:
                return MODULE
            head, _, _ = name.rpartition(".")
            name = head[:-len(".<locals>")] if head.endswith(".<locals>") else head
        return name or MODULE


def _strip_docstring(body: list) -> list:
    first = body[0] if body else None
    is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return body[1:] if is_doc and isinstance(first.value.value, str) else body


_BODIES = (ast.Module, ast.ClassDef, *_FUNCS)


def _dump(node: ast.AST, root: ast.AST) -> str:
    """ast.dump of `node` without attributes (line numbers), docstrings, or the function
    definitions nested in `root` (each is its own scope); nothing is copied or changed."""
    parts = [type(node).__name__]
    for name, value in ast.iter_fields(node):
        if name == "body" and isinstance(node, _BODIES):
            value = _strip_docstring(value)
        if isinstance(value, list):
            items = [_dump(v, root) if isinstance(v, ast.AST) else repr(v) for v in value
                     if not (isinstance(v, _FUNCS) and v is not root)]
            parts.append(f"{name}=[{','.join(items)}]")
        elif isinstance(value, ast.AST):
            parts.append(f"{name}={_dump(value, root)}")
        else:
            parts.append(f"{name}={value!r}")
    return "(" + " ".join(parts) + ")"


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _statements(node: ast.AST):
    """The statements directly inside `node` (function and class definitions are statements,
    so expressions need not be walked; lambdas belong to the scope around them)."""
    for name in _BLOCKS:
        for child in getattr(node, name, None) or ():
            if isinstance(child, (ast.ExceptHandler, ast.match_case)):
                yield from _statements(child)
            else:
                yield child


def scopes(source: str | bytes) -> Scopes:
    """The scopes of a Python source; a file that does not parse is one `<module>` scope
    hashed by its bytes."""
    text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return Scopes({}, {}, {MODULE: hashlib.sha256(text.encode()).hexdigest()})
    nodes: dict[str, list] = {MODULE: [tree]}
    lines: dict[int, set[str]] = {}

    def walk(node: ast.AST, prefix: str, enclosing: str) -> None:
        for child in _statements(node):
            if isinstance(child, _FUNCS):
                name = prefix + child.name
                nodes.setdefault(name, []).append(child)
                first = min([d.lineno for d in child.decorator_list] + [child.lineno])
                body_start = child.body[0].lineno if child.body else child.lineno
                # Outer functions are walked first, so a nested function's lines end up its own.
                for n in range(first, (child.end_lineno or child.lineno) + 1):
                    # decorators and signature also run in the enclosing scope (at definition)
                    lines[n] = {name, enclosing} if n < body_start else {name}
                walk(child, name + ".<locals>.", name)
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".", enclosing)
            else:
                walk(child, prefix, enclosing)

    walk(tree, "", MODULE)
    return Scopes(nodes, lines)


# --- the tracer ------------------------------------------------------------------------------

def _ours(name: str, package: str | None) -> bool:
    """Whether an import names a module of this package (absolute, or relative inside it)."""
    if name.startswith("."):
        return bool(package) and (package == "aleph" or package.startswith("aleph."))
    return name == "aleph" or name.startswith("aleph.")


def _untraced(fn, kind: str):
    """`fn` (an import function) run with this thread's trace function suspended, unless it
    imports a module of aleph/. Third-party module bodies and the import machinery are not
    ours, and tracing them would cost more than the rest of the window; aleph's own module
    bodies stay traced (a function of ours they call counts as executed)."""
    def call(*args, **kwargs):
        tracer = sys.gettrace()
        if tracer is None:
            return fn(*args, **kwargs)
        if kind == "builtin":  # __import__(name, globals, locals, fromlist, level)
            name = args[0] if args else kwargs.get("name", "")
            glb = args[1] if len(args) > 1 else kwargs.get("globals")
            level = args[4] if len(args) > 4 else kwargs.get("level", 0)
            package = (glb or {}).get("__package__") if level else None
            ours = _ours("." * level + name if level else name, package)
        else:  # import_module(name, package=None)
            name = args[0] if args else kwargs.get("name", "")
            ours = _ours(name, args[1] if len(args) > 1 else kwargs.get("package"))
        if ours:
            return fn(*args, **kwargs)
        sys.settrace(None)
        try:
            return fn(*args, **kwargs)
        finally:
            sys.settrace(tracer)
    call.__wrapped__ = fn
    return call


_SAVED_IMPORTS: dict[str, Any] = {}


def _untraced_imports(on: bool) -> None:
    """Route `import` and `importlib.import_module` through `_untraced` (or restore them)."""
    import builtins
    import importlib

    if on and not _SAVED_IMPORTS:
        _SAVED_IMPORTS.update(builtin=builtins.__import__, module=importlib.import_module)
        builtins.__import__ = _untraced(builtins.__import__, "builtin")
        importlib.import_module = _untraced(importlib.import_module, "module")
    elif not on and _SAVED_IMPORTS:
        builtins.__import__ = _SAVED_IMPORTS.pop("builtin")
        importlib.import_module = _SAVED_IMPORTS.pop("module")


# Third-party modules a launch imports anyway: importing them before the tracer starts keeps
# their (large, not ours) import-time code out of the traced window.
PREIMPORT = ("numpy", "torch", "torch.utils.checkpoint", "safetensors.torch", "tokenizers",
             "transformers", "transformers.tokenization_utils_fast", "torch.utils.tensorboard")


def preimport() -> None:
    import importlib

    for name in PREIMPORT:
        with contextlib.suppress(Exception):  # a missing or broken one: the trainer reports it
            importlib.import_module(name)


class Tracer:
    """Notes the code objects called while on; `record()` turns them into scopes of aleph/."""

    def __init__(self, root: Path | None = None, cache: Path | None | bool = True) -> None:
        """`cache`: the scope hash cache directory (True: `scope_cache_dir()`; falsy: none)."""
        self.root = Path(root or package_dir())
        self.cache = scope_cache_dir() if cache is True else (cache or None)
        self.files = package_files(self.root)  # the snapshot the launch executes
        self._codes: dict[int, Any] = {}
        self._scopes: dict[str, Scopes] = {}  # per file, computed once
        self.window_open = False
        self.window: str | None = None  # what the traced window covered, once closed
        self.unavailable = ""  # why nothing could be recorded (another tracer active)
        self.seconds_on = 0.0
        self._since = 0.0

    def _trace(self, frame, event, arg):
        self._codes.setdefault(id(frame.f_code), frame.f_code)  # returns None: no line events

    def _note_stack(self) -> None:
        frame = sys._getframe(1)
        while frame is not None:
            self._codes.setdefault(id(frame.f_code), frame.f_code)
            frame = frame.f_back

    def _on(self) -> None:
        self._since = time.perf_counter()
        _untraced_imports(True)
        sys.settrace(self._trace)

    def _off(self) -> None:
        sys.settrace(None)
        _untraced_imports(False)
        self.seconds_on += time.perf_counter() - self._since

    def start(self) -> Tracer:
        """Open the window: note the frames already running, then trace every call."""
        if os.environ.get(OFF_ENV) == "off":  # to measure the tracer's cost (bench/)
            self.unavailable = f"switched off by {OFF_ENV}=off: the executed functions were not recorded"
            return self
        if sys.gettrace() is not None:
            self.unavailable = ("another tracer (a debugger or coverage) was active: the "
                                "executed functions were not recorded")
            return self
        self._note_stack()
        self.window_open = True
        self._on()
        return self

    def close_window(self, covered: str = "the whole launch") -> None:
        """End the traced window (after the first steps); `covered` says what it spanned."""
        if self.window_open:
            self._note_stack()
            self._off()
            self.window_open = False
            self.window = covered

    @contextlib.contextmanager
    def during(self):
        """Trace the calls of a block (a rare event after the window), in this thread."""
        if self.window_open or self.unavailable or sys.gettrace() is not None:
            yield
            return
        self._on()
        try:
            yield
        finally:
            self._off()

    @contextlib.contextmanager
    def in_this_thread(self):
        """Trace a block in another thread (sys.settrace is per thread), e.g. a heartbeat."""
        if self.unavailable or sys.gettrace() is not None:
            yield
            return
        self._note_stack()
        sys.settrace(self._trace)
        try:
            yield
        finally:
            sys.settrace(None)

    def executed(self) -> dict[str, set[str]]:
        """{file: {qualname}} of the package's code objects called, plus `<module>` of every
        package module imported (its top level ran at import)."""
        prefix = str(self.root) + "/"
        out: dict[str, set[str]] = {}
        for code in list(self._codes.values()):
            if code.co_filename.startswith(prefix):
                rel = code.co_filename[len(prefix):]
                out.setdefault(rel, set()).add(getattr(code, "co_qualname", code.co_name))
        for module in list(sys.modules.values()):
            path = getattr(module, "__file__", None)
            if isinstance(path, str) and path.startswith(prefix) and path.endswith(".py"):
                out.setdefault(path[len(prefix):], set()).add(MODULE)
        return out

    def _table(self, rel: str, sha: str, needed: set[str]) -> Scopes:
        """The scopes of a snapshot file, with the hashes of `needed` (qualnames that ran):
        from memory, else from the cache of scope hashes by file content
        (`scope_cache_dir()/<sha256>.json`; parsing the ~70 files a launch imports costs
        ~0.2-0.6 s, paid once per code version), else parsed."""
        table = self._scopes.get(rel)
        path = self.cache / f"{sha}.json" if self.cache is not None else None
        if table is None and path is not None:
            try:
                cached = json.loads(path.read_text(encoding="utf-8"))
                if cached.get("schema") == SCHEMA:
                    table = Scopes({}, {}, cached["scopes"], set(cached["names"]))
            except (OSError, ValueError, AttributeError, KeyError, TypeError):
                table = None
        known = len(table._hashes) if table is not None else -1
        resolved = {table.resolve(n) for n in needed} if table is not None else set()
        if table is None or any(table.hash(s) is None for s in resolved if s in table):
            parsed = scopes(self.files[rel])
            if table is not None:  # keep what the cache knew; hash the rest from the source
                parsed = Scopes(parsed._nodes, parsed.lines, table._hashes)
            table = parsed
        for s in {table.resolve(n) for n in needed}:
            table.hash(s)
        if path is not None and len(table._hashes) != known:  # new hashes: cache them
            _write_cache(path, {"schema": SCHEMA, "file": rel, "names": sorted(table.names),
                                "scopes": table._hashes})
        self._scopes[rel] = table
        return table

    def record(self) -> dict[str, Any]:
        """The launch's executed-code record (schema SCHEMA)."""
        executed: dict[str, dict[str, str]] = {}
        files = file_hashes(self.files)
        for rel, names in sorted(self.executed().items() if not self.unavailable else ()):
            if rel not in self.files:  # a file created after the snapshot
                continue
            table = self._table(rel, files[rel], names)
            resolved = {table.resolve(n) for n in names}
            executed[rel] = {s: table.hash(s) for s in sorted(resolved) if s in table}
        return {"schema": SCHEMA, "window": self.window, "unavailable": self.unavailable or None,
                "traced_seconds": round(self.seconds_on, 3),
                "functions": sum(len(v) for v in executed.values()),
                "executed": executed, "files": files}


CACHE_ENV = "ALEPH_CODE_CACHE"


def scope_cache_dir() -> Path | None:
    """Where scope hashes are cached by file content: $ALEPH_CODE_CACHE, else
    $XDG_CACHE_HOME/aleph/code-scopes, else ~/.cache/aleph/code-scopes; None without a home.
    Keyed by the sha256 of a file's bytes, so one cache serves every work root and checkout
    (and a missing or unwritable one only costs the parse)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        home = os.path.expanduser("~")
        if home.startswith("~"):  # no HOME and no passwd entry (some containers)
            return None
        base = os.path.join(home, ".cache")
    return Path(base) / "aleph" / "code-scopes"


def _write_cache(path: Path, data: dict) -> None:
    """Write a cache file by rename, without fsync: a torn or missing one is only recomputed."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = open_write_nofollow(tmp, truncate=True)  # a shared cache dir: no planted link
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, sort_keys=True))
        os.replace(tmp, path)
    except OSError:  # a read-only work root: the next launch parses again
        pass
