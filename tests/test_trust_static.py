"""No loader in `aleph/` may let a model or tokenizer directory run its own code.

Read from the source with ast: every `*.from_pretrained(...)` call, every call on a name
starting with `Auto` (AutoModel.from_config, AutoTokenizer.register, ...) and every
`pipeline(...)` must pass `trust_remote_code=False` literally. Without it, transformers
asks "[y/N]" on stdin (4.x) or refuses only where a default says so; with `y` on stdin a
teacher directory's Python ran (issue 32).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "aleph"


def _name(func: ast.expr) -> str:
    """`AutoModel.from_pretrained` -> 'AutoModel.from_pretrained'; '' when not a dotted name."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


def _needs_trust_kwarg(call: ast.Call) -> bool:
    name = _name(call.func)
    parts = name.split(".")
    return (parts[-1] == "from_pretrained" or parts[-1] == "pipeline"
            or any(p.startswith("Auto") for p in parts))


def _passes_false(call: ast.Call) -> bool:
    return any(k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant)
               and k.value.value is False for k in call.keywords)


def unguarded_loads(source: str, filename: str = "<src>") -> list[str]:
    """'file:line name' of every loader call in `source` lacking trust_remote_code=False."""
    return [f"{filename}:{node.lineno} {_name(node.func)}"
            for node in ast.walk(ast.parse(source, filename))
            if isinstance(node, ast.Call) and _needs_trust_kwarg(node)
            and not _passes_false(node)]


def test_every_loader_in_the_package_passes_trust_remote_code_false():
    found, checked = [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        checked += source.count("from_pretrained(")
        found += unguarded_loads(source, str(path.relative_to(PACKAGE.parent)))
    assert found == [], "add trust_remote_code=False to: " + ", ".join(found)
    assert checked >= 4  # extract's model and tokenizers, aleph.data.tokenizer's tokenizer


def test_the_check_sees_every_shape_of_loader_call():
    src = """
from transformers import AutoModel, AutoTokenizer, pipeline
import transformers
AutoModel.from_pretrained(p)
transformers.AutoTokenizer.from_pretrained(p, trust_remote_code=True)
BertModel.from_pretrained(p, trust_remote_code=flag)
AutoConfig.from_dict(d)
pipeline("feature-extraction", model=p)
AutoTokenizer.from_pretrained(p, trust_remote_code=False)
tok.save_pretrained(out)
"""
    assert [f.split(" ", 1)[1] for f in unguarded_loads(src)] == [
        "AutoModel.from_pretrained", "transformers.AutoTokenizer.from_pretrained",
        "BertModel.from_pretrained", "AutoConfig.from_dict", "pipeline"]
