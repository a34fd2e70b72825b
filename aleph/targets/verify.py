"""`verify_store`: quick (manifest and file size) or full (re-hash every chunk range)."""

from __future__ import annotations

import os
from pathlib import Path

from aleph.errors import StoreError
from aleph.targets.format import DTYPES
from aleph.targets.store import load_manifest
from aleph.targets.writer import hash_range


def verify_store(store_dir: str | os.PathLike, full: bool = False) -> dict:
    """Check a store; return a summary dict, or raise StoreError naming what is wrong.

    Quick: the manifest's schema and arithmetic, and the data file's exact size.
    Full: also re-hash each chunk's byte range and compare with the manifest's sha256.
    """
    manifest = load_manifest(store_dir)
    data = Path(store_dir) / manifest["data_file"]
    row_bytes = manifest["dim"] * DTYPES[manifest["dtype"]][1]
    bad = []
    if full:
        try:
            fd = os.open(data, os.O_RDONLY)
        except OSError as e:
            raise StoreError(f"{data}: cannot open the data file to re-hash it ({e.strerror})") from None
        try:
            for c in manifest["chunks"]:
                got = hash_range(fd, str(data), c["row_start"] * row_bytes, c["rows"] * row_bytes)
                if got != c.get("sha256"):
                    bad.append(f"chunk {c['index']} (store rows {c['row_start']:,}..{c['row_stop']:,}, "
                               f"from {c['path']}): sha256 {got[:16]}..., manifest {str(c.get('sha256'))[:16]}...")
        finally:
            os.close(fd)
    if bad:
        raise StoreError(f"{data}: {len(bad)} chunk range(s) differ from the manifest "
                         "(the store was modified after it was built):\n  " + "\n  ".join(bad))
    return {"store": str(store_dir), "rows": manifest["rows"], "dim": manifest["dim"],
            "dtype": manifest["dtype"], "byte_length": manifest["byte_length"],
            "chunks": len(manifest["chunks"]), "full": full, "ok": True}
