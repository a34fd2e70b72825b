"""Writing rows into a preallocated data file with bounded dirty page cache.

Shared by both build implementations, so they produce the same bytes and hashes.
Page cache is charged to the container's memory cgroup, so after every `flush_bytes`
slice the written range is fdatasync'ed (dirty -> clean) and dropped with
POSIX_FADV_DONTNEED (clean -> free): the builder never holds more than one slice of
dirty pages, whatever the store size.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from aleph._io import DISK_FULL_ERRNOS, check_free_space, free_bytes, open_write_nofollow
from aleph.errors import StoreError
from aleph.targets.format import DTYPES

DEFAULT_FLUSH_BYTES = 64 << 20
NONFINITE_MODES = ("warn", "fail")
_MAX_LISTED = 10  # row numbers listed per chunk in reports
_DISK_FULL = DISK_FULL_ERRNOS


@dataclass
class ChunkResult:
    """What writing one chunk produced: its hash and its non-finite rows."""

    sha256: str
    nonfinite_count: int = 0
    nonfinite_rows: list[int] = field(default_factory=list)  # first few, chunk-relative


def disk_error(path: str, e: OSError, what: str, needed: int | None = None) -> StoreError:
    """One line naming the file; for a full disk also the bytes needed vs free."""
    if e.errno in _DISK_FULL:
        free = free_bytes(os.path.dirname(path) or ".")
        room = (f"needs {needed:,} B, " if needed is not None else "") + (
            f"{free:,} B free" if free is not None else "free space unknown")
        return StoreError(
            f"{path}: disk full or file size limit reached while {what} ({e.strerror}): "
            f"{room}; free space (the store needs its full size up front) and rebuild"
        )
    return StoreError(f"{path}: I/O error while {what} ({e.strerror})")


def preallocate(path: str, nbytes: int) -> int:
    """Create `path` with exactly `nbytes` reserved (disk-full fails here, not mid-build).

    The free space is checked first (QuotaError naming the file, bytes needed vs free), so
    a store that cannot fit is refused before anything is written.
    """
    try:  # a leftover file of an earlier build is truncated below: its blocks count as free
        held = os.stat(path).st_blocks * 512
    except OSError:
        held = 0
    check_free_space(path, nbytes - min(held, nbytes), "the target store's data file")
    fd = open_write_nofollow(path, truncate=True, mode=0o644)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        os.close(fd)
        os.unlink(path)
        raise disk_error(path, e, f"reserving {nbytes:,} bytes", nbytes) from None
    return fd


def _pwrite_all(fd: int, buf: memoryview, offset: int, path: str) -> None:
    while buf:
        try:
            n = os.pwrite(fd, buf, offset)
        except OSError as e:
            raise disk_error(path, e, f"writing at byte {offset:,}") from None
        buf, offset = buf[n:], offset + n


def _nonfinite_rows(raw: np.ndarray, mask: int, block_bytes: int = 4 << 20) -> np.ndarray:
    """Row indices (within `raw`) holding a NaN or Inf: all exponent bits set.

    Scans `block_bytes` at a time so the temporaries stay a few MB, not a slice's size.
    """
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
    """Write `raw` (rows, D) at byte `offset`, flushing and dropping every slice.

    Returns the sha256 of exactly the bytes written and the non-finite rows found.
    """
    mask = DTYPES[dtype][3]
    row_bytes = raw.shape[1] * raw.dtype.itemsize
    step = max(1, flush_bytes // row_bytes)
    h, bad, count = hashlib.sha256(), [], 0
    for r0 in range(0, raw.shape[0], step):
        part = np.ascontiguousarray(raw[r0:r0 + step])  # (r, D); no copy when contiguous
        rows = _nonfinite_rows(part, mask)
        count += len(rows)
        bad.extend(int(r) + r0 for r in rows[: _MAX_LISTED - len(bad)])
        view = memoryview(part).cast("B")
        _pwrite_all(fd, view, offset, path)
        h.update(view)
        try:
            os.fdatasync(fd)
        except OSError as e:
            raise disk_error(path, e, "flushing") from None
        os.posix_fadvise(fd, offset, len(view), os.POSIX_FADV_DONTNEED)
        offset += len(view)
    return ChunkResult(h.hexdigest(), count, bad)


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
