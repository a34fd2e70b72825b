"""The next step's batch, gathered in a background thread while the current step runs.

The host-side gather (token store and target memmap, random rows) would leave the
accelerator idle between steps; one worker gathers step k+1 while step k computes (numpy's
gathers and torch's kernels release the GIL), into pinned memory on CUDA so the copies are
asynchronous. A batch is a pure function of its position (DataOrder) and the worker draws
from no random stream, so one gathered ahead and never used is simply dropped: resume stays
exact.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from aleph.env.hostinfo import meminfo_bytes
from aleph.errors import StoreError
from aleph.train.distributed import World
from aleph.train.order import DataOrder

LENGTH_MULTIPLE = 16  # compiled batches are padded to a multiple of this (at most max_len)


def bucket_width(width: int, max_len: int) -> int:
    """The compiled batch width for a batch whose longest row is `width` tokens: the next
    multiple of 16, at most max_len (few graph shapes, less padding than max_len always;
    measured by bench/bench_lengths.py)."""
    return min(-(-width // LENGTH_MULTIPLE) * LENGTH_MULTIPLE, max_len)


def fixed_length(ids: torch.Tensor, mask: torch.Tensor, length: int,
                 pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad a (B, L') batch to (B, length) with pad_id / False (L' <= length): under
    compile, bucket widths bound the shapes dynamo sees (every new L' could recompile)."""
    width = ids.shape[1]
    if width > length:
        raise ValueError(f"batch length {width} exceeds max_len {length}")
    if width == length:
        return ids, mask
    extra = length - width
    return (torch.nn.functional.pad(ids, (0, extra), value=pad_id),
            torch.nn.functional.pad(mask, (0, extra), value=False))

Batch = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]
"""(ids (b, L) long, mask (b, L) bool or None when no slot is padding, target (b, D))."""


class BatchSource:
    """This rank's batch at a data position, on the host (pinned on CUDA) or on the device."""

    def __init__(self, tokens, targets, order: DataOrder, world: World, device: torch.device,
                 fixed_len: bool) -> None:
        self.tokens, self.targets, self.order = tokens, targets, order
        self.world, self.device = world, device
        self.fixed_len = fixed_len  # compiled model: bucketed lengths (bucket_width)
        self.pin = device.type == "cuda"
        self.mapped = MappedFiles(tokens, targets)

    def host(self, epoch: int, batch: int) -> Batch:
        """Rows of global batch `batch` of `epoch` for this rank; L is the longest row (its
        bucket_width when fixed_len). Eager, a batch without padding gets no mask, so SDPA
        may pick its flash kernel (read here, in the worker: no device sync); compiled, the
        mask stays (a second graph per bucket width would crowd dynamo's cache of 8)."""
        self.mapped.check(epoch, batch)
        idx = self.order.indices(epoch, batch, self.world)  # (B / W,)
        ids, mask = self.tokens.gather(idx)  # (b, L') each
        if self.fixed_len:
            width = bucket_width(ids.shape[1], self.tokens.max_len)
            ids, mask = fixed_length(ids, mask, width, self.tokens.pad_id)
        elif bool(mask.all()):
            mask = None
        target = self.targets.gather(idx, pin=self.pin)  # (b, D)
        if self.pin:
            ids = ids.pin_memory()
            mask = None if mask is None else mask.pin_memory()
        return ids, mask, target

    def to_device(self, batch: Batch) -> Batch:
        return tuple(None if t is None else t.to(self.device, non_blocking=True) for t in batch)


class MappedFiles:
    """The memory-mapped store files and the sizes they must keep: reading a page that a
    truncation removed is a SIGBUS (the process dies with no message), so before each
    gather one stat per file turns a changed size into a StoreError naming the store. An
    unlinked or renamed-over file is fine (the mapping keeps the old inode); a truncation
    during the gather itself cannot be caught this way."""

    def __init__(self, tokens, targets) -> None:
        what = f"token store {tokens.path}"
        files = [(tokens.path / name, what, None) for name in sorted(tokens.manifest["files"])]
        if targets.implementation == "streaming":  # in_ram gathers from a private copy
            files.append((Path(targets.path), f"target store {targets.store_dir}",
                          targets.byte_length))
        self.files = []  # (path, what, inode, size)
        for path, what, size in files:
            st = path.stat()
            self.files.append((path, what, st.st_ino, st.st_size if size is None else size))

    def check(self, epoch: int, batch: int) -> None:
        for path, what, inode, size in self.files:
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            if st.st_ino == inode and st.st_size != size:
                raise StoreError(
                    f"{what}: {path.name} is {st.st_size:,} B, expected {size:,} B: truncated "
                    f"or rewritten during training (found before gathering batch {batch} of "
                    f"epoch {epoch}); the last resume state is intact: restore the store and "
                    "relaunch")


def _worker_device(device: torch.device) -> None:
    """The CUDA current device is per thread: without this, pinning on rank r's worker
    would open a CUDA context on GPU 0 (memory taken from another rank's GPU)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


class Prefetcher:
    """`take(epoch, batch, step)`: that position's device batch (the one gathered ahead when
    it matches, else gathered now), then, unless `step` is the last, the next one's gather."""

    def __init__(self, source: BatchSource, total_steps: int) -> None:
        self.source, self.total_steps = source, total_steps
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aleph-prefetch",
                                        initializer=_worker_device, initargs=(source.device,))
        self._ahead: tuple[tuple[int, int], Future] | None = None
        self.hits = 0  # batches that were ready from the worker (for tests and benchmarks)

    def take(self, epoch: int, batch: int, step: int) -> Batch:
        key = (epoch, batch)
        host = None
        if self._ahead is not None:
            ahead_key, future = self._ahead
            self._ahead = None
            got = future.result()  # re-raises a gather error here, on the main thread
            if ahead_key == key:
                host, self.hits = got, self.hits + 1
        if host is None:
            host = self.source.host(epoch, batch)
        out = self.source.to_device(host)
        if step + 1 < self.total_steps:
            nxt = self.source.order.after(epoch, batch)
            self._ahead = (nxt, self._pool.submit(self.source.host, *nxt))
        return out

    @property
    def ahead(self) -> tuple[int, int] | None:
        """The (epoch, batch) being gathered ahead, if any."""
        return self._ahead[0] if self._ahead is not None else None

    def close(self) -> None:
        """Wait for a gather in flight (it reads the stores) and stop the worker."""
        self._ahead = None
        self._pool.shutdown(wait=True, cancel_futures=True)


def warm_target_store(store, sources: list[str], headroom_bytes: int) -> str:
    """Read a streaming target store into the page cache in the background (the build drops
    its pages, so the first epoch would gather from disk) when it fits the quota planner's
    budget, or half of MemAvailable with no memory limit. Returns the line to log."""
    from aleph.targets import plan

    if store.implementation != "streaming":
        return "target store prefault: not needed (in_ram)"
    p = plan(sources, None, headroom_bytes)
    if p.quota_bytes is not None:
        budget, basis = p.quota_bytes - p.headroom_bytes, "the planner's budget (quota - headroom)"
    else:
        budget, basis = (meminfo_bytes("MemAvailable") or 0) // 2, "half of MemAvailable (no memory limit)"
    if store.byte_length > budget:
        return (f"target store prefault: skipped, {store.byte_length:,} B exceed {basis} "
                f"{budget:,} B")
    threading.Thread(target=_willneed, args=(store.path,), name="aleph-prefault",
                     daemon=True).start()
    return f"target store prefault: reading {store.byte_length:,} B ahead (within {basis})"


def _willneed(path) -> None:
    """A hint only: a store that cannot be opened here fails loudly in its first gather."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)
