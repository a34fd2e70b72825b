"""What of a run directory is synced, and the local record that spares re-hashing.

Synced: the top-level JSON files, launches/, tb/, complete weights directories (with
model_config.json, written last), the tokenizer, and the newest COMPLETE resume state whose
files match its marker. Not synced: run.lock, killed saves' leftovers, states set aside as
corrupt, dot files, and the local record itself.

Each file is read once through one descriptor, up to the size fstat gave: a file renamed
over meanwhile is read whole as it was, an appended one as a stable prefix. Mutable files
(top-level JSON, launches/, tb/) are read into memory; immutable ones (states, weights,
tokenizer) whose (size, mtime, inode) the local record knows are not read at all and are
sent from their path if needed, so pushing an unchanged run reads only the mutable files.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aleph._io import atomic_write_json, read_json
from aleph.record import layout
from aleph.record.layout import COMPLETE, RunLayout
from aleph.sync.safefs import copy

TOP_FILES = (layout.CONFIG, layout.MANIFEST, layout.METRICS, layout.EVAL)
MUTABLE_TREES = (layout.LAUNCHES, layout.TB)
WEIGHTS_DIR, WEIGHTS_DONE = layout.WEIGHTS, "model_config.json"
TOKENIZER_DIR = layout.TOKENIZER
IN_MEMORY_MAX = 64 << 20
"""Immutable files up to this size are read into memory too (one read, no second open)."""


@dataclass
class Item:
    """One file to sync: its path in the run, its sha256 and size as read, and its bytes
    when read into memory (None: send from `path`, which does not change once written)."""

    rel: str
    path: Path
    sha256: str
    size: int
    data: bytes | None


class HashCache:
    """sha256 of files keyed by (size, mtime_ns, inode), kept in <run>/sync-state.json with
    the last push to each destination. Local only; losing it costs a re-hash, never a
    wrong push."""

    def __init__(self, run_dir: Path) -> None:
        self.path = RunLayout(run_dir).sync_state
        try:
            state = read_json(self.path)
        except (OSError, ValueError):
            state = {}
        got = {k: state.get(k) if isinstance(state, dict) else None for k in ("files", "pushed")}
        self.files: dict[str, Any] = got["files"] if isinstance(got["files"], dict) else {}
        self.pushed: dict[str, Any] = got["pushed"] if isinstance(got["pushed"], dict) else {}

    def lookup(self, rel: str, st: os.stat_result) -> str | None:
        rec = self.files.get(rel)
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        return rec["sha256"] if isinstance(rec, dict) and rec.get("key") == key else None

    def store(self, rel: str, st: os.stat_result, sha256: str) -> None:
        self.files[rel] = {"key": [st.st_size, st.st_mtime_ns, st.st_ino], "sha256": sha256}

    def save(self, keep: set[str]) -> None:
        self.files = {k: v for k, v in self.files.items() if k in keep}
        atomic_write_json(self.path, {"files": self.files, "pushed": self.pushed})


def read_item(run_dir: Path, rel: str, cache: HashCache, mutable: bool) -> Item | None:
    """The file `rel` as it is now (None if it vanished meanwhile)."""
    path = Path(run_dir) / rel
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        known = cache.lookup(rel, st)
        if not mutable and (known or st.st_size > IN_MEMORY_MAX):  # known: not read at all
            sha = known or _hash_stream(f, st.st_size)
            cache.store(rel, st, sha)
            return Item(rel, path, sha, st.st_size, None)
        data = f.read(st.st_size)
    sha = hashlib.sha256(data).hexdigest()
    cache.store(rel, st, sha)
    return Item(rel, path, sha, len(data), data)


def _hash_stream(f, size: int) -> str:
    h = hashlib.sha256()
    copy(f.read, size, h.update)
    return h.hexdigest()


def _tree(run_dir: Path, top: str) -> list[str]:
    """Regular files under run_dir/top, relative POSIX paths, temporary (dot) files skipped."""
    out = []
    for dirpath, dirnames, filenames in os.walk(run_dir / top):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        out += [Path(dirpath, name).relative_to(run_dir).as_posix()
                for name in sorted(filenames) if not name.startswith(".")]
    return out


def _weights(run_dir: Path) -> list[str]:
    root = run_dir / WEIGHTS_DIR
    if not root.is_dir():
        return []
    done = sorted(d for d in root.iterdir() if d.is_dir() and (d / WEIGHTS_DONE).is_file())
    return [rel for d in done for rel in _tree(run_dir, d.relative_to(run_dir).as_posix())]


def resume_state(run_dir: Path, cache: HashCache) -> tuple[int, list[Item]] | None:
    """The newest complete resume state whose files match its marker: (step, its items);
    a marker of another format version is refused (StoreError, aleph.record.layout)."""
    run = RunLayout(run_dir)
    for state in reversed(run.complete_states()):
        try:
            marker = layout.read_marker(state)
        except ValueError:
            continue  # unreadable or damaged: not a state to push
        names, base = sorted(marker), state.relative_to(run.dir).as_posix()
        items = [read_item(run.dir, f"{base}/{n}", cache, False) for n in [*names, COMPLETE]]
        if all(i is not None for i in items) and all(
                (i.sha256, i.size) == (marker[n]["sha256"], marker[n]["size"])
                for n, i in zip(names, items, strict=False)):
            return layout.step_of(state.name), items
    return None


def collect(run_dir: Path, cache: HashCache) -> tuple[int | None, list[Item]]:
    """(step of the resume state included or None, every item to sync)."""
    run_dir = Path(run_dir)
    items = [read_item(run_dir, name, cache, True) for name in TOP_FILES]
    for top in MUTABLE_TREES:
        items += [read_item(run_dir, rel, cache, True) for rel in _tree(run_dir, top)]
    fixed = _weights(run_dir) + _tree(run_dir, TOKENIZER_DIR)
    items += [read_item(run_dir, rel, cache, False) for rel in fixed]
    step, state_items = resume_state(run_dir, cache) or (None, [])
    return step, [i for i in items + state_items if i is not None]
