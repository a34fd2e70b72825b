"""Quota planning: predict each implementation's peak memory from headers alone.

Predicted peaks (bytes of anonymous memory plus dirty page cache, both charged to
the container's memory cgroup):
- in_ram: every chunk loaded plus their torch.cat result, alive together = 2 x store.
- streaming: the largest chunk (mapped chunks touch at most that much; a legacy .pt
  that cannot be mapped is loaded whole) + one flush slice of dirty page cache.
An implementation is allowed when its peak <= quota - headroom. The headroom is
the rest of the training process (CUDA context, model and optimizer host copies,
token store, loader workers, interpreter): 16 GiB by default, capped at a quarter of the
quota (our choice: the rest of a process that fits a small quota is small too, and a fixed
16 GiB would refuse even a 3 MB smoke store inside an 8 GiB CI cgroup). With the seed's
figures the cap (25.8 GiB) does not bind: the in-RAM peak is 98.0 GB against 111.0 - 17.2
= 93.8 GB: refused; streaming needs about 0.8 GB: accepted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from aleph.env.cgroup import DEFAULT_ROOT, format_bytes, read_envelope
from aleph.errors import ConfigError, QuotaError
from aleph.targets.sources import ChunkInfo, check_layout, inspect_chunk
from aleph.targets.writer import DEFAULT_FLUSH_BYTES

DEFAULT_HEADROOM_BYTES = 16 << 30
HEADROOM_QUOTA_FRACTION = 4  # the headroom is at most quota / 4
PREFERENCE = ("streaming", "in_ram")  # streaming whenever it fits


@dataclass(frozen=True)
class Plan:
    """Which implementation to build with, and why."""

    choice: str | None  # None: nothing fits
    reason: str
    quota_bytes: int | None  # None: no memory limit found
    headroom_bytes: int
    rows: int
    dim: int
    dtype: str
    chunks: int
    store_bytes: int
    peaks: dict[str, int] = field(default_factory=dict)  # implementation -> predicted peak
    allowed: dict[str, bool] = field(default_factory=dict)

    def require(self, implementation: str) -> None:
        """Raise QuotaError unless `implementation` is allowed by this plan."""
        if not self.allowed.get(implementation, False):
            raise QuotaError(f"target store implementation {implementation!r} refused: {self.reason}")

    def describe(self) -> str:
        """Human-readable table, as `aleph targets plan` prints it."""
        quota = "none found" if self.quota_bytes is None else format_bytes(self.quota_bytes)
        lines = [f"store: {self.rows:,} x {self.dim} {self.dtype} in {self.chunks} chunks = "
                 f"{format_bytes(self.store_bytes)}",
                 f"memory quota: {quota}; headroom {format_bytes(self.headroom_bytes)}"]
        for impl in PREFERENCE:
            verdict = "fits" if self.allowed[impl] else "REFUSED"
            lines.append(f"  {impl:<9} predicted peak {format_bytes(self.peaks[impl])}: {verdict}")
        lines.append(f"choice: {self.choice or 'none'} ({self.reason})")
        return "\n".join(lines)


def plan(sources: Sequence[str | os.PathLike | ChunkInfo], quota_bytes: int | None = None,
         headroom_bytes: int = DEFAULT_HEADROOM_BYTES, *, cgroup_root=DEFAULT_ROOT,
         flush_bytes: int = DEFAULT_FLUSH_BYTES) -> Plan:
    """Plan a build of `sources` (paths, or ChunkInfo records) against the memory quota
    (None: the cgroup's, v2 or v1), from the chunks' headers only."""
    if quota_bytes is not None and (isinstance(quota_bytes, bool) or quota_bytes <= 0):
        raise ConfigError(f"memory quota {quota_bytes!r} bytes: expected a positive byte count")
    if isinstance(headroom_bytes, bool) or headroom_bytes < 0:
        raise ConfigError(f"headroom {headroom_bytes!r} bytes: expected a byte count >= 0")
    is_info = bool(sources) and all(isinstance(s, ChunkInfo) for s in sources)
    infos = list(sources) if is_info else [inspect_chunk(p) for p in sources]
    check_layout(infos)
    if quota_bytes is None:
        quota_bytes = read_envelope(cgroup_root).memory_limit_bytes
    largest, store_bytes = max(i.nbytes for i in infos), sum(i.nbytes for i in infos)
    peaks = {"streaming": largest + min(flush_bytes, largest), "in_ram": 2 * store_bytes}
    capped = ""
    if quota_bytes is not None and headroom_bytes > quota_bytes // HEADROOM_QUOTA_FRACTION:
        capped = (f" (capped at 1/{HEADROOM_QUOTA_FRACTION} of the quota from "
                  f"{format_bytes(headroom_bytes)})")
        headroom_bytes = quota_bytes // HEADROOM_QUOTA_FRACTION
    budget = None if quota_bytes is None else quota_bytes - headroom_bytes
    allowed = {k: budget is None or v <= budget for k, v in peaks.items()}
    choice = next((k for k in PREFERENCE if allowed[k]), None)
    reason = ("no memory limit found; streaming preferred (bounded memory)" if budget is None
              else "; ".join(f"{k} predicted peak {format_bytes(v)} "
                             f"{'<=' if allowed[k] else 'exceeds'} quota {format_bytes(quota_bytes)}"
                             f" minus headroom {format_bytes(headroom_bytes)}{capped} = "
                             f"{format_bytes(budget)}" for k, v in peaks.items()))
    return Plan(choice, reason, quota_bytes, headroom_bytes, sum(i.rows for i in infos),
                infos[0].dim, infos[0].dtype, len(infos), store_bytes, peaks,
                allowed)
