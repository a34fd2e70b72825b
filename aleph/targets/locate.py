"""Where a target store is, given either path a user holds: the store or its chunks.

`train --set targets=`, `check-align`, `targets plan` and `targets build` take the chunk
directory; the built store lives under `<work root>/cache/targets/<key>` (`store_dir_for`).
`resolve_store` lets every reader of a store (`targets verify`, `targets info`, `eval
--probe-targets`, the e1 probes) take either: a chunk directory resolves to the store
`aleph targets build DIR` makes of it, or, when that is not built yet, the error names the
command and the path it will write. It never builds anything itself.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from aleph.errors import StoreError
from aleph.targets.build import cached_store, store_dir_for
from aleph.targets.format import MANIFEST_FILE
from aleph.targets.sources import SUFFIXES, chunk_files_in, source_fingerprint, source_stats


def _is_chunk_dir(path: Path) -> bool:
    """A directory without a store manifest that holds at least one chunk file."""
    if os.path.lexists(path / MANIFEST_FILE):  # any entry (a FIFO, a link): opening says what
        return False
    try:
        return any(n.endswith(SUFFIXES) for n in os.listdir(path))
    except OSError:
        return False


def resolve_store(given: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """The target store directory for `given`: itself when it is not a chunk directory
    (opening it then says what is wrong, if anything), else the complete store built from
    its chunks under `<root>/cache/targets/<key>` (root: the work root). A chunk directory
    whose store is missing, unfinished or stale is a StoreError naming the build command."""
    path = Path(given)
    if not path.is_dir() or not _is_chunk_dir(path):
        return path
    sources = chunk_files_in(path)  # the order `targets build DIR` and the trainer read
    fingerprint = source_fingerprint(source_stats(sources))
    store_dir = store_dir_for(sources, root)
    if cached_store(store_dir, fingerprint) is not None:
        return store_dir
    state = ("holds an unfinished build" if store_dir.is_dir() else "does not exist yet")
    raise StoreError(
        f"{path} is a chunk directory, not a target store; its store {store_dir} {state}: run "
        f"`aleph targets build {shlex.quote(str(path))}` to build it there, then pass either path")


def resolve_sources(items: list[str], root: str | os.PathLike | None = None) -> Path:
    """The built store of a run's `targets` (one store or chunk directory, or chunk files in
    row order): as `resolve_store` for one directory; for files, their store under
    `<root>/cache/targets/<key>` when complete, else a StoreError naming the build command."""
    if not items:
        raise StoreError("no target sources given")
    if len(items) == 1 and Path(items[0]).is_dir():
        return resolve_store(items[0], root)
    fingerprint = source_fingerprint(source_stats(items))
    store_dir = store_dir_for(items, root)
    if cached_store(store_dir, fingerprint) is not None:
        return store_dir
    raise StoreError(f"the store of {len(items)} chunk file(s) ({store_dir}) is not built: run "
                     f"`aleph targets build {' '.join(shlex.quote(str(i)) for i in items)}`")
