"""Cross-process build lock: one builder per store directory.

`fcntl.flock` on `<store>/build.lock`: the kernel releases it when its holder dies
(kill -9 included), so a crashed builder never leaves a stale lock behind. A second
builder polls until the lock frees or its timeout passes, then fails naming the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from aleph._io import open_write_nofollow
from aleph.errors import StoreError
from aleph.targets.format import LOCK_FILE

DEFAULT_LOCK_TIMEOUT_S = 3600.0  # a full 49 GB build takes minutes; waiting beats failing
_POLL_S = 0.1


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "unknown"


@contextlib.contextmanager
def build_lock(store_dir: Path, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the exclusive build lock of `store_dir` (waiting up to `timeout_s`)."""
    path = Path(store_dir) / LOCK_FILE
    try:
        fd = open_write_nofollow(path, mode=0o644)
    except OSError as e:
        raise StoreError(f"{path}: cannot create the build lock ({e.strerror}); "
                         "the store directory must be writable") from None
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"{store_dir}: another process ({_holder(fd)}) is building this store; "
                        f"gave up after waiting {timeout_s:g} s (raise the lock timeout, or "
                        "re-run when it finishes: its result will be a cache hit)"
                    ) from None
                time.sleep(_POLL_S)
        # who holds it, for the message of a waiting builder (information only)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock
