"""The sync index: the list of a pushed run's files (path -> sha256, size), written last.

A push counts only once its index is in place, and `pull` checks every file it fetches
against it. Index paths are checked before use: a hostile index cannot make `pull` write
outside the run directory it restores.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aleph._io import RUNS_DIR, parse_json_bytes, plain_relative, short_repr
from aleph.errors import AlephError

SCHEMA = "aleph-sync/1"
INDEX_MAX = 8 << 20
"""Largest index read: ~50,000 files of ~150 B entries, a hundred times what a run syncs."""
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)?")  # utc_now()


class SyncError(AlephError):
    """A push or pull that cannot proceed: the destination, the file and what is wrong."""


@dataclass(frozen=True)
class Snapshot:
    """One complete state of a run at a destination: its index and the destination's name
    for it (`r<N>` for a directory, the commit sha for a hub repo)."""

    index: dict[str, Any]
    revision: str

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        return self.index["files"]

    @property
    def step(self) -> int | None:
        return self.index.get("step")


def check_rel(rel: str, what: str) -> str:
    """`rel` if it is a plain relative POSIX path (aleph._io.plain_relative)."""
    if not plain_relative(rel):
        raise SyncError(f"{what}: path {short_repr(rel, 200)} is not a plain relative path (no '..', no "
                        "absolute path, no control character)")
    return rel


def run_path(run_dir: Path) -> str:
    """The run's path relative to its work root, e.g. `runs/smoke/a2_dense-s1`: where it is
    kept at a destination and restored by `pull`."""
    run_dir = Path(run_dir).absolute()
    for parent in run_dir.parents:
        if parent.name == RUNS_DIR:
            return run_dir.relative_to(parent.parent).as_posix()
    raise SyncError(f"{run_dir}: not under a `{RUNS_DIR}` directory of a work root (expected "
                    f"<work root>/{RUNS_DIR}/<run>)")


def make_index(run: str, step: int | None, files: dict[str, dict[str, Any]], time: str) -> dict:
    return {"schema": SCHEMA, "run": run, "step": step, "time": time,
            "files": {k: files[k] for k in sorted(files)}}


def encode(index: dict) -> bytes:
    return (json.dumps(index, indent=1, sort_keys=True) + "\n").encode()


def parse(data: bytes, where: str) -> dict[str, Any]:
    """Decode and validate an index; errors name `where` and the field at fault."""
    try:
        index = parse_json_bytes(data)
    except ValueError as e:  # invalid JSON, not UTF-8, nested too deeply
        raise SyncError(f"{where}: not a sync index (invalid JSON: {e})") from None
    if not isinstance(index, dict) or index.get("schema") != SCHEMA:
        got = index.get("schema") if isinstance(index, dict) else type(index).__name__
        raise SyncError(f"{where}: schema {got!r}, expected {SCHEMA!r}")
    check_rel(str(index.get("run", "")), f"{where} field 'run'")
    if not str(index["run"]).startswith(RUNS_DIR + "/"):
        raise SyncError(f"{where}: field 'run' {index['run']!r}, expected {RUNS_DIR}/<run>")
    step, when = index.get("step"), index.get("time")
    if step is not None and not (type(step) is int and step >= 0):  # echoed by pull: checked
        raise SyncError(f"{where}: field 'step' is {short_repr(step, 80)}, expected None or an "
                        "integer >= 0")
    if not (isinstance(when, str) and _TIME.fullmatch(when)):
        raise SyncError(f"{where}: field 'time' is {short_repr(when, 80)}, expected an ISO-8601 time")
    files = index.get("files")
    if not isinstance(files, dict):
        raise SyncError(f"{where}: field 'files' missing (expected a mapping path -> sha256, size)")
    for rel, rec in files.items():
        check_rel(rel, f"{where} field 'files'")
        if not (isinstance(rec, dict) and isinstance(rec.get("sha256"), str)
                and _SHA256.fullmatch(rec["sha256"]) and type(rec.get("size")) is int
                and rec["size"] >= 0):
            raise SyncError(f"{where}: files[{rel!r}] = {rec!r}, expected {{sha256: 64 hex "
                            "digits, size: bytes}")
    return index
