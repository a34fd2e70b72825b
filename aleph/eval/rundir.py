"""Reading the files of a run directory (layout in docs/ARCHITECTURE.md), with clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aleph._io import read_json
from aleph.errors import DataError

CONFIG = "config.json"
MANIFEST = "manifest.json"
EVAL = "eval.json"
METRICS = "metrics.json"
FINAL_WEIGHTS = Path("weights") / "final"
TOKENIZER = "tokenizer"
TB = "tb"


def require_run_dir(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise DataError(f"{run_dir}: not a run directory (it does not exist)")
    return run_dir


def read_run_json(run_dir: str | Path, name: str, required: bool = True) -> dict[str, Any] | None:
    """Parse `run_dir/name` as a JSON object; missing optional files give None."""
    path = Path(run_dir) / name
    if not path.is_file():
        if required:
            raise DataError(f"{path}: missing (is {run_dir} a run directory written by `aleph train`?)")
        return None
    try:
        data = read_json(path)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from e
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def field(data: dict, dotted: str, source: str, default: Any = ..., kind: type | tuple = object):
    """data['a']['b'] for 'a.b'; a missing or mistyped field is an error naming `source`."""
    node: Any = data
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            if default is not ...:
                return default
            raise DataError(f"{source}: missing field {dotted!r}")
        node = node[key]
    if not isinstance(node, kind):
        raise DataError(f"{source}: field {dotted!r} has type {type(node).__name__}")
    return node


def run_label(run_dir: Path, manifest: dict | None) -> str:
    if manifest and isinstance(manifest.get("run_id"), str):
        return manifest["run_id"]
    return Path(run_dir).name


def manifest_code(manifest: dict) -> dict:
    """{revision, source_sha256}: from `code` (documented layout) or the top-level keys."""
    code = manifest.get("code")
    if isinstance(code, dict):
        return code
    return {"revision": manifest.get("code_revision"), "source_sha256": manifest.get("source_sha256")}


def manifest_targets(manifest: dict, source: str) -> dict:
    """The target store record: `targets` (documented layout) or `target_store`."""
    for key in ("targets", "target_store"):
        if isinstance(manifest.get(key), dict):
            return manifest[key]
    raise DataError(f"{source}: missing field 'targets' (the target store record)")
