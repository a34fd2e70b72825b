"""`build_store`, `store_dir_for` and `ensure_store`: cache, lock, then one implementation.

Cache rule: a store directory whose complete manifest carries the same source
fingerprint (paths, sizes, mtime_ns of the chunks, from os.stat) is a cache hit:
it is opened after the quick check (manifest and file size), no chunk file is
opened and nothing is written. Anything else is a miss and builds under the lock.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from aleph._io import work_root
from aleph.errors import ConfigError, StoreError
from aleph.targets.build_inram import build_in_ram
from aleph.targets.build_streaming import build_streaming
from aleph.targets.lock import DEFAULT_LOCK_TIMEOUT_S, build_lock
from aleph.targets.plan import DEFAULT_HEADROOM_BYTES, plan
from aleph.targets.sources import describe_sources, source_fingerprint, source_stats
from aleph.targets.store import IMPLEMENTATIONS, TargetStore, load_manifest, open_store
from aleph.targets.writer import DEFAULT_FLUSH_BYTES, NONFINITE_MODES


def store_dir_for(sources: Sequence[str | os.PathLike], root: str | os.PathLike | None = None) -> Path:
    """`<root>/cache/targets/<key>`: key = first 16 hex of the source fingerprint."""
    root = Path(root) if root is not None else work_root()
    return root / "cache" / "targets" / source_fingerprint(source_stats(sources))[:16]


def cached_store(store_dir: str | os.PathLike, fingerprint: str,
                 implementation: str = "streaming") -> TargetStore | None:
    """The complete store in `store_dir` if it was built from `fingerprint`, else None."""
    try:
        manifest = load_manifest(store_dir)
    except StoreError:
        return None
    if manifest["source_fingerprint"] != fingerprint:
        return None
    return TargetStore(Path(store_dir), manifest, implementation)


def _checked_hit(hit: TargetStore | None, nonfinite: str) -> TargetStore | None:
    """A cache hit, refused in "fail" mode when its build recorded NaN/Inf rows (the mode
    applies to the store used, not only to a store built now)."""
    recorded = (hit.manifest.get("nonfinite") or {}) if hit is not None else {}
    if nonfinite == "fail" and recorded.get("rows"):
        first = (recorded.get("chunks") or [{}])[0]
        raise StoreError(f"{hit.store_dir}: the cached target store holds {recorded['rows']:,} row(s) with "
                         f"NaN/Inf (first in {first.get('path')}, store rows {first.get('first_rows')}); "
                         "refused because non-finite rows are set to fail")
    return hit


def build_store(sources: Sequence[str | os.PathLike], out_dir: str | os.PathLike,
                implementation: str = "streaming", *, nonfinite: str = "warn",
                lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
                flush_bytes: int = DEFAULT_FLUSH_BYTES) -> TargetStore:
    """Build the store of `sources` (ordered chunk files) in `out_dir`, or reuse it.

    nonfinite: "warn" reports NaN/Inf rows (count and rows, also in the manifest),
    "fail" refuses them. A concurrent builder of the same `out_dir` is waited for up
    to `lock_timeout_s`. An interrupted streaming build is resumed.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ConfigError(f"implementation {implementation!r}: expected one of {IMPLEMENTATIONS}")
    if nonfinite not in NONFINITE_MODES:
        raise ConfigError(f"nonfinite {nonfinite!r}: expected one of {NONFINITE_MODES}")
    if flush_bytes <= 0:
        raise ConfigError(f"flush_bytes {flush_bytes}: expected a positive byte count")
    out_dir = Path(out_dir)
    fingerprint = source_fingerprint(source_stats(sources))
    hit = _checked_hit(cached_store(out_dir, fingerprint, implementation), nonfinite)
    if hit is not None:
        return hit
    infos = describe_sources(sources)
    stats = [{"path": i.path, "size": i.file_size, "mtime_ns": i.mtime_ns} for i in infos]
    if source_fingerprint(stats) != fingerprint:
        raise StoreError("chunk files changed while their headers were read; try again")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"{out_dir}: cannot create the store directory ({e.strerror}); "
                         "expected a writable directory path") from None
    with build_lock(out_dir, lock_timeout_s):
        # built while we waited
        hit = _checked_hit(cached_store(out_dir, fingerprint, implementation), nonfinite)
        if hit is not None:
            return hit
        if implementation == "streaming":
            build_streaming(out_dir, infos, fingerprint, nonfinite, flush_bytes)
            return open_store(out_dir, "streaming")
        _, tensor = build_in_ram(out_dir, infos, fingerprint, nonfinite, flush_bytes)
        return TargetStore(out_dir, load_manifest(out_dir), "in_ram", tensor)


def ensure_store(sources: Sequence[str | os.PathLike], implementation: str | None = None,
                 root: str | os.PathLike | None = None, quota_bytes: int | None = None,
                 headroom_bytes: int = DEFAULT_HEADROOM_BYTES, force: bool = False,
                 **build_kw) -> TargetStore:
    """What the trainer calls: cache hit if possible, else plan against the quota and build.

    `implementation=None` takes the plan's choice; an explicit one must fit the plan
    (QuotaError otherwise, before any chunk data is read), unless `force` (the caller
    has logged that it overrides the plan, e.g. to replay the seed's in-RAM build).
    """
    store_dir = store_dir_for(sources, root)
    fingerprint = source_fingerprint(source_stats(sources))
    hit = _checked_hit(cached_store(store_dir, fingerprint, implementation or "streaming"),
                       build_kw.get("nonfinite", "warn"))
    if hit is not None:
        return hit
    p = plan(sources, quota_bytes, headroom_bytes)
    chosen = implementation or p.choice
    if chosen is None:
        p.require("streaming")  # raises with the plan's reason
    if not (force and implementation):
        p.require(chosen)
    return build_store(sources, store_dir, chosen, **build_kw)
