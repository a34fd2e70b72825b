"""The last steps every build shares: layout, manifest, and the atomic switch-over.

Switch-over order (each step durable before the next), so a kill anywhere leaves
either the previous complete store or no manifest, never a manifest over wrong bytes:
1. fsync the data; 2. remove an old manifest (the old store stops being complete);
3. rename `targets.bin.partial` -> `targets.bin`; 4. write `manifest.json` atomically;
5. remove `build.json`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from aleph._faults import fault_point
from aleph._io import atomic_write_json, fsync_dir
from aleph.targets.format import (
    DATA_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_FILE,
    PARTIAL_FILE,
    PROGRESS_FILE,
)
from aleph.targets.sources import ChunkInfo


def layout(infos: list[ChunkInfo]) -> list[dict]:
    """Per-chunk row ranges, in source order: the part of the manifest known up front."""
    out, row = [], 0
    for i, info in enumerate(infos):
        out.append({"index": i, "path": info.path, "file_size": info.file_size,
                    "mtime_ns": info.mtime_ns, "rows": info.rows,
                    "row_start": row, "row_stop": row + info.rows})
        row += info.rows
    return out


def make_manifest(infos: list[ChunkInfo], fingerprint: str, hashes: list[str],
                  nonfinite: list[dict], built_by: str) -> dict:
    chunks = layout(infos)
    for c, h in zip(chunks, hashes, strict=True):
        c["sha256"] = h
    rows, dim = chunks[-1]["row_stop"], infos[0].dim
    return {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "data_file": DATA_FILE,
        "rows": rows, "dim": dim, "dtype": infos[0].dtype,
        "byte_length": sum(i.nbytes for i in infos), "byte_order": "little",
        "source_fingerprint": fingerprint, "chunks": chunks,
        "nonfinite": {"rows": sum(n["count"] for n in nonfinite), "chunks": nonfinite},
        "built_by": built_by, "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def finalize(store_dir: Path, fd: int, manifest: dict) -> None:
    """Make the finished partial file the store (see the module docstring for the order)."""
    os.fsync(fd)
    os.close(fd)
    old = store_dir / MANIFEST_FILE
    if old.exists():
        old.unlink()
        fsync_dir(store_dir)
    fault_point("finalize-unlinked")
    os.replace(store_dir / PARTIAL_FILE, store_dir / DATA_FILE)
    fsync_dir(store_dir)
    fault_point("finalize-renamed")
    atomic_write_json(old, manifest)
    progress = store_dir / PROGRESS_FILE
    if progress.exists():
        progress.unlink()
        fsync_dir(store_dir)
