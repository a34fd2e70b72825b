"""Read the container's resource envelope from cgroup v2 or v1.

The visible host figures (e.g. 96 vCPU, ~503 GiB on the seed host) are not what a
container may use; the cgroup limits are. Every reader takes a `root` so tests can
point it at a fabricated tree. Absent limits are reported as None, never guessed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from aleph.errors import ConfigError

DEFAULT_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 reports "no limit" as a huge page-aligned number near 2**63.
_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class Envelope:
    """Container limits as the kernel enforces them."""

    version: int | None  # 2, 1, or None when no cgroup filesystem is found
    memory_limit_bytes: int | None  # None: no limit
    cpu_quota_us: int | None  # None: no quota
    cpu_period_us: int | None
    cpuset: str | None  # e.g. "0-23,48-71"; None when unreadable

    @property
    def cpu_cores(self) -> float | None:
        if self.cpu_quota_us is None or not self.cpu_period_us:
            return None
        return self.cpu_quota_us / self.cpu_period_us


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError):
        return None


def _int(text: str, path: Path) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{path}: {text!r} is not an integer (malformed cgroup file)") from None


def _own_v2_dir(root: Path) -> Path:
    """The process's own cgroup v2 directory under `root` (root itself in a container)."""
    rel = None
    text = _read(Path("/proc/self/cgroup")) if root == DEFAULT_ROOT else None
    if text:
        for line in text.splitlines():
            if line.startswith("0::"):
                rel = line[3:].lstrip("/")
    if rel:
        cand = root / rel
        if (cand / "memory.max").exists() or (cand / "cpu.max").exists():
            return cand
    return root


def read_envelope(root: str | os.PathLike = DEFAULT_ROOT) -> Envelope:
    """Read memory limit, CPU quota and cpuset from cgroup v2 (preferred) or v1."""
    root = Path(root)
    if (root / "cgroup.controllers").exists():
        d = _own_v2_dir(root)
        mem = _read(d / "memory.max")
        memory = None if mem in (None, "max") else _int(mem, d / "memory.max")
        quota = period = None
        cpu = _read(d / "cpu.max")
        if cpu:
            q, _, p = cpu.partition(" ")
            period = _int(p, d / "cpu.max") if p else 100000
            quota = None if q == "max" else _int(q, d / "cpu.max")
        cpuset = _read(d / "cpuset.cpus.effective") or _read(d / "cpuset.cpus")
        return Envelope(2, memory, quota, period if quota is not None else None, cpuset)
    mem_dir, cpu_dir = root / "memory", root / "cpu,cpuacct"
    if not cpu_dir.exists():
        cpu_dir = root / "cpu"
    if mem_dir.exists() or cpu_dir.exists():
        mem = _read(mem_dir / "memory.limit_in_bytes")
        mem_n = _int(mem, mem_dir / "memory.limit_in_bytes") if mem else None
        memory = mem_n if mem_n is not None and mem_n < _V1_UNLIMITED else None
        q = _read(cpu_dir / "cpu.cfs_quota_us")
        p = _read(cpu_dir / "cpu.cfs_period_us")
        q_n = _int(q, cpu_dir / "cpu.cfs_quota_us") if q else None
        quota = q_n if q_n is not None and q_n > 0 else None
        period = _int(p, cpu_dir / "cpu.cfs_period_us") if (p and quota is not None) else None
        cpuset = _read(root / "cpuset" / "cpuset.effective_cpus") or _read(
            root / "cpuset" / "cpuset.cpus"
        )
        return Envelope(1, memory, quota, period, cpuset)
    return Envelope(None, None, None, None, None)


def format_bytes(n: int) -> str:
    """`110999998464` -> `110,999,998,464 B (103.38 GiB)`."""
    return f"{n:,} B ({n / 2**30:.2f} GiB)"
