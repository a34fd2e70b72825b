"""Writing rows into a preallocated data file with bounded dirty page cache.

Shared by both build implementations, so they produce the same bytes and hashes.
Page cache is charged to the container's memory cgroup, so after every `flush_bytes`
slice the written range is fdatasync'ed (dirty -> clean) and dropped with
POSIX_FADV_DONTNEED (clean -> free): the builder never holds more than one slice of
dirty pages, whatever the store size. The writing, hashing and flushing are
`aleph._io.DurableWriter`'s (the resume state and the token store use it too).
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from dataclasses import dataclass, field

import numpy as np

from aleph._io import DurableWriter, check_free_space
from aleph.errors import StoreError
from aleph.targets.format import DTYPES

DEFAULT_FLUSH_BYTES = 64 << 20
NONFINITE_MODES = ("warn", "fail")
_MAX_LISTED = 10  # row numbers listed per chunk in reports


@dataclass
class ChunkResult:
    """What writing one chunk produced: its hash and its non-finite rows."""

    sha256: str
    nonfinite_count: int = 0
    nonfinite_rows: list[int] = field(default_factory=list)  # first few, chunk-relative


def preallocate(path: str, nbytes: int) -> int:
    """A new file at `path` with exactly `nbytes` reserved (disk-full fails here, not
    mid-build); its read-write fd. A leftover regular file of an earlier build is replaced.
    Free space is checked first (QuotaError naming the file, bytes needed vs free)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    leftover = st is not None and stat.S_ISREG(st.st_mode)  # a link or FIFO stays: refused
    held = st.st_blocks * 512 if leftover else 0  # removed below: its blocks count as free
    check_free_space(path, nbytes - min(held, nbytes), "the target store's data file")
    if leftover:
        os.unlink(path)
    return DurableWriter.create(path, nbytes, error=StoreError).fd


def _nonfinite_rows(raw: np.ndarray, mask: int, block_bytes: int = 4 << 20) -> np.ndarray:
    """Row indices (within `raw`) holding a NaN or Inf (all exponent bits set), scanned
    `block_bytes` at a time so the temporaries stay a few MB, not a slice's size."""
    step = max(1, block_bytes // max(1, raw.shape[1] * raw.dtype.itemsize))
    found = []
    for r0 in range(0, raw.shape[0], step):
        bits = np.bitwise_and(raw[r0:r0 + step], raw.dtype.type(mask))  # (b, D)
        hits = bits == mask  # (b, D) bool
        if hits.any():  # the common case costs one pass and no per-row reduction
            found.append(np.flatnonzero(hits.any(axis=1)) + r0)
    return np.concatenate(found) if found else np.empty(0, dtype=np.int64)


def write_chunk(fd: int, path: str, offset: int, raw: np.ndarray, dtype: str,
                flush_bytes: int = DEFAULT_FLUSH_BYTES) -> ChunkResult:
    """Write `raw` (rows, D) at byte `offset`, flushing and dropping every slice; the sha256
    of exactly the bytes written and the non-finite rows found."""
    mask = DTYPES[dtype][3]
    step = max(1, flush_bytes // (raw.shape[1] * raw.dtype.itemsize))
    w = DurableWriter(fd, path, offset, flush_bytes=flush_bytes, error=StoreError)
    bad, count = [], 0
    for r0 in range(0, raw.shape[0], step):
        part = np.ascontiguousarray(raw[r0:r0 + step])  # (r, D); no copy when contiguous
        rows = _nonfinite_rows(part, mask)
        count += len(rows)
        bad.extend(int(r) + r0 for r in rows[: _MAX_LISTED - len(bad)])
        w.write(part)
        w.flush()  # at most one slice of dirty pages
    return ChunkResult(w.sha256.hexdigest(), count, bad)


def hash_range(fd: int, path: str, offset: int, nbytes: int,
               block: int = DEFAULT_FLUSH_BYTES) -> str:
    """sha256 of `nbytes` of an open file from `offset`, dropping the pages it read."""
    h, end = hashlib.sha256(), offset + nbytes
    buf = bytearray(min(block, max(nbytes, 1)))
    pos = offset
    while pos < end:
        n = os.preadv(fd, [memoryview(buf)[: min(len(buf), end - pos)]], pos)
        if n == 0:
            raise StoreError(f"{path}: file ends at byte {pos:,}, expected {end:,}")
        h.update(memoryview(buf)[:n])
        pos += n
    os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_DONTNEED)
    return h.hexdigest()


def report_nonfinite(path: str, row_start: int, result: ChunkResult, mode: str) -> dict | None:
    """Describe a chunk's NaN/Inf rows; raise in "fail" mode, print in "warn" mode."""
    if not result.nonfinite_count:
        return None
    first = ", ".join(str(r) for r in result.nonfinite_rows)
    msg = (f"{path}: {result.nonfinite_count} row(s) contain NaN/Inf; first chunk rows [{first}] "
           f"(store rows from {row_start + result.nonfinite_rows[0]:,})")
    if mode == "fail":
        raise StoreError(msg + "; refused because non-finite rows are set to fail")
    print(f"aleph targets: warning: {msg}", file=sys.stderr)
    return {"path": path, "count": result.nonfinite_count,
            "first_rows": [row_start + r for r in result.nonfinite_rows]}
