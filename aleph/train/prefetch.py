"""The next step's batch, gathered in a background thread while the current step runs.

Token ids, masks and target rows are gathered on the host (a random-row gather from the
token store and the target memmap) and then copied to the device. Done between steps on
the main thread, that gather leaves the accelerator idle; here a single worker thread
gathers step k+1 while step k computes (numpy's gathers and torch's kernels release the
GIL), into page-locked memory on CUDA, so the non_blocking copies really are asynchronous.

Resume stays exact: a batch is a pure function of its position (epoch, batch index) via
DataOrder (order.py), and the worker draws from no random stream. A batch gathered ahead and never
used (a kill, a stop after step k) is simply dropped; the resumed launch gathers the batch
of its saved position, so no batch is used twice or skipped.
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

# --- batch length under torch.compile: a few widths, so dynamo compiles a few graphs

LENGTH_MULTIPLE = 16
"""Compiled batches are padded to a multiple of this (at most max_len)."""


def bucket_width(width: int, max_len: int) -> int:
    """The compiled batch width for a batch whose longest row is `width` tokens: the next
    multiple of 16, at most max_len (few graph shapes, less padding than max_len always;
    measured by bench/bench_lengths.py)."""
    return min(-(-width // LENGTH_MULTIPLE) * LENGTH_MULTIPLE, max_len)


def fixed_length(ids: torch.Tensor, mask: torch.Tensor, length: int,
                 pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad a (B, L') batch to (B, length) with pad_id / False (L' <= length).

    Used when the model is compiled, with length = bucket_width(L', max_len):
    `TokenStore.gather` trims each batch to its longest row, and every new L' could make
    dynamo recompile; a few bucket widths bound the shapes it sees. The padded slots are
    masked out exactly like the store's own padding.
    """
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
        """Rows of global batch `batch` of `epoch` for this rank; L is the batch's longest
        row, rounded up to a multiple of 16 (at most max_len) when fixed_len.

        Eager, a batch without padding gets no mask, so attention gets none and SDPA may
        pick its flash kernel (the host tensor is read here, in the worker: no device sync).
        Compiled, the mask stays: a second graph per bucket width would crowd dynamo's
        cache of 8, for batches that are rare once padded to a bucket.
        """
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
    """The store files the gathers read through a memory mapping, and the sizes they must keep.

    Reading a mapped page that a truncation removed is a SIGBUS: the process dies with no
    message (the launch is later marked 'lost', its log ends mid-run). So before each
    gather, one stat per file (microseconds, in the worker) compares the size with the one
    the store was verified at (the target store's manifest byte_length; the token store's
    arrays as opened) and turns a change into a StoreError naming the store. A file
    unlinked or replaced by a rename is not an error: the mapping keeps the old inode
    whole. A truncation during the gather itself cannot be caught this way.
    """

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
    """Hands out each step's device batch and starts gathering the next one at once.

    `take(epoch, batch, step)` returns the batch of that position: the one gathered ahead
    when it is for this position, else gathered now (the first step, or after a position
    jump). Then, unless `step` is the last, the next position's gather starts in the worker.
    """

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
    """Read a streaming target store into the page cache in the background when it fits.

    The store build drops its pages, so the first epoch would read the memmap cold (a
    random row gather from disk). It fits when the store is within the quota planner's
    budget (aleph.targets.plan: the memory quota minus the headroom) or, with no memory
    limit, within half of MemAvailable. POSIX_FADV_WILLNEED only schedules readahead; it
    runs in a daemon thread so nothing waits for it. Returns the line to log.
    """
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
