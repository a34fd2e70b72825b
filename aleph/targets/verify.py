"""`verify_store`: three levels, each catching what the one before cannot.

- quick (default): the manifest's schema and arithmetic (`format.check_manifest`) and the
  data file's exact size: a missing, truncated or padded data file, a damaged or hand-edited
  manifest, an unfinished build. Reads no data.
- full (`--full`): also re-hashes each chunk's row range of the data file against the
  manifest: any byte changed after the build. Reads the store once.
- sources (`--sources`): also re-reads every source chunk at its recorded path and compares
  its rows with the store's range: a source edited after the build, even with size and mtime
  kept (which the stat-keyed cache would reuse stale), missing, or reshaped. Reads the store
  and every source once (49 GB each for E1).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from aleph.errors import StoreError
from aleph.targets.format import DTYPES
from aleph.targets.sources import inspect_chunk, open_chunk
from aleph.targets.store import load_manifest
from aleph.targets.writer import DEFAULT_FLUSH_BYTES, hash_range


def verify_store(store_dir: str | os.PathLike, full: bool = False, sources: bool = False) -> dict:
    """Check a store at the quick, full or sources level (module docstring); return a summary
    dict, or raise StoreError naming every chunk range that is wrong. `sources` implies full."""
    manifest = load_manifest(store_dir)
    data = Path(store_dir) / manifest["data_file"]
    row_bytes = manifest["dim"] * DTYPES[manifest["dtype"]][1]
    full = full or sources
    bad, stale = [], []
    if full:
        try:
            fd = os.open(data, os.O_RDONLY)
        except OSError as e:
            raise StoreError(f"{data}: cannot open the data file to re-hash it ({e.strerror})") from None
        try:
            for c in manifest["chunks"]:
                where = (f"chunk {c['index']} (store rows {c['row_start']:,}..{c['row_stop']:,}, "
                         f"from {c['path']})")
                got = hash_range(fd, str(data), c["row_start"] * row_bytes, c["rows"] * row_bytes)
                if got != c.get("sha256"):
                    bad.append(f"{where}: sha256 {got[:16]}..., manifest {str(c.get('sha256'))[:16]}...")
                if sources and (problem := _source_problem(c, manifest, got)):
                    stale.append(f"{where}: {problem}")
        finally:
            os.close(fd)
    if bad:
        raise StoreError(f"{data}: {len(bad)} chunk range(s) differ from the manifest "
                         "(the store was modified after it was built): " + "; ".join(bad))
    if stale:
        raise StoreError(f"{data}: {len(stale)} chunk range(s) differ from their source chunk "
                         "(the source changed after the build; rebuild the store into a fresh "
                         "directory): " + "; ".join(stale))
    level = "sources" if sources else "full" if full else "quick"
    return {"store": str(store_dir), "rows": manifest["rows"], "dim": manifest["dim"],
            "dtype": manifest["dtype"], "byte_length": manifest["byte_length"],
            "chunks": len(manifest["chunks"]), "full": full, "level": level, "ok": True}


def _source_problem(chunk: dict, manifest: dict, store_sha: str) -> str | None:
    """None when the source chunk's rows hash to the store's range `store_sha`; else why not."""
    try:
        info = inspect_chunk(chunk["path"])
    except StoreError as e:
        return f"source unusable: {e}"
    shape = (info.rows, info.dim, info.dtype)
    want = (chunk["rows"], manifest["dim"], manifest["dtype"])
    if shape != want:
        return (f"source now holds {info.rows:,} x {info.dim} {info.dtype}, the store's range "
                f"{want[0]:,} x {want[1]} {want[2]}")
    got = _hash_source(info)
    if got != store_sha:
        return f"source rows sha256 {got[:16]}..., store range sha256 {store_sha[:16]}..."
    return None


def _hash_source(info) -> str:
    """sha256 of a chunk's rows as a build writes them (row-major raw bytes), in slices."""
    h = hashlib.sha256()
    with open_chunk(info) as raw:  # (rows, D) mapped
        step = max(1, DEFAULT_FLUSH_BYTES // (raw.shape[1] * raw.dtype.itemsize))
        for r0 in range(0, raw.shape[0], step):
            h.update(memoryview(np.ascontiguousarray(raw[r0:r0 + step])).cast("B"))
    return h.hexdigest()
