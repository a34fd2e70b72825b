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
        quota, period = self.cpu_quota_us, self.cpu_period_us
        return None if quota is None or not period else quota / period

    def as_dict(self) -> dict:
        """The envelope fields of an env capture and of a launch's manifest entry."""
        return {"cgroup_version": self.version, "memory_limit_bytes": self.memory_limit_bytes,
                "cpu_quota_us": self.cpu_quota_us, "cpu_period_us": self.cpu_period_us,
                "cpu_cores": self.cpu_cores, "cpuset": self.cpuset}


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


def _self_cgroup(root: Path, self_cgroup: str | None) -> str | None:
    """/proc/self/cgroup (only for the real root: a fabricated tree comes with its own text)."""
    if self_cgroup is not None:
        return self_cgroup
    return _read(Path("/proc/self/cgroup")) if root == DEFAULT_ROOT else None


def _own_v2_dir(root: Path, self_cgroup: str | None = None) -> Path:
    """The process's own cgroup v2 directory under `root` (root itself in a container)."""
    rel = None
    for line in (_self_cgroup(root, self_cgroup) or "").splitlines():
        if line.startswith("0::"):
            rel = line[3:].lstrip("/")
    if rel:
        cand = root / rel
        if (cand / "memory.max").exists() or (cand / "cpu.max").exists():
            return cand
    return root


def _own_v1_dir(root: Path, controller: str, mount: str, self_cgroup: str | None = None) -> Path:
    """The process's own cgroup v1 directory of `controller` under `root/mount`: in a
    container (own cgroup namespace, or Docker's bind) the mount itself, as /proc/self/cgroup
    names a path not under it; on a host or job runner the directory below the whole
    hierarchy's mount, e.g. memory/process_api/<id>."""
    base = root / mount
    for line in (_self_cgroup(root, self_cgroup) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and controller in parts[1].split(","):
            rel = parts[2].strip().lstrip("/")
            if rel and (base / rel).is_dir():
                return base / rel
    return base


def _v1_memory_limit(d: Path) -> int | None:
    """The effective v1 limit of `d`: its own or an ancestor's, whichever is lower."""
    mem = _read(d / "memory.limit_in_bytes")
    limits = [_int(mem, d / "memory.limit_in_bytes") if mem else None,
              _field(_read(d / "memory.stat"), "hierarchical_memory_limit")]
    limit = min((n for n in limits if n is not None), default=_V1_UNLIMITED)
    return limit if limit < _V1_UNLIMITED else None


def read_envelope(root: str | os.PathLike = DEFAULT_ROOT, self_cgroup: str | None = None) -> Envelope:
    """Memory limit, CPU quota and cpuset of the process's own cgroup (`self_cgroup`: the
    text of /proc/self/cgroup, read live for the real root; else the mount's top), v2 or v1."""
    root = Path(root)
    if (root / "cgroup.controllers").exists():
        d = _own_v2_dir(root, self_cgroup)
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
    cpu_mount = "cpu,cpuacct" if (root / "cpu,cpuacct").exists() else "cpu"
    if (root / "memory").exists() or (root / cpu_mount).exists():
        memory = _v1_memory_limit(_own_v1_dir(root, "memory", "memory", self_cgroup))
        cpu_dir = _own_v1_dir(root, "cpu", cpu_mount, self_cgroup)
        q, p = _read(cpu_dir / "cpu.cfs_quota_us"), _read(cpu_dir / "cpu.cfs_period_us")
        quota = _int(q, cpu_dir / "cpu.cfs_quota_us") if q else None
        quota = quota if quota is not None and quota > 0 else None  # -1: no quota
        period = _int(p, cpu_dir / "cpu.cfs_period_us") if (p and quota is not None) else None
        cpuset_dir = _own_v1_dir(root, "cpuset", "cpuset", self_cgroup)
        cpuset = _read(cpuset_dir / "cpuset.effective_cpus") or _read(cpuset_dir / "cpuset.cpus")
        return Envelope(1, memory, quota, period, cpuset)
    return Envelope(None, None, None, None, None)


@dataclass(frozen=True)
class MemoryState:
    """The memory cgroup of a process, as the kernel accounts it now.

    `path` is the cgroup directory, so a later process can read the same counters again
    (e.g. whether `oom_kill` rose after a launch vanished). None = not readable.
    """

    version: int
    path: str
    usage_bytes: int | None
    limit_bytes: int | None  # effective: the lowest limit of the cgroup and its ancestors
    peak_bytes: int | None  # v1 memory.max_usage_in_bytes; v2 memory.peak (kernel >= 5.19)
    oom_kill: int | None  # v2 memory.events oom_kill; v1 memory.oom_control oom_kill
    inactive_file_bytes: int | None = None  # page cache the kernel reclaims before any OOM kill

    @property
    def working_set_bytes(self) -> int | None:
        """Usage less inactive page cache: what counts toward an OOM kill (as `docker stats`)."""
        usage = self.usage_bytes
        return None if usage is None else max(usage - (self.inactive_file_bytes or 0), 0)

    def as_dict(self) -> dict:
        return {"version": self.version, "path": self.path, "usage_bytes": self.usage_bytes,
                "working_set_bytes": self.working_set_bytes, "limit_bytes": self.limit_bytes,
                "peak_bytes": self.peak_bytes, "oom_kill": self.oom_kill}


def _field(text: str | None, key: str) -> int | None:
    """`key N` lines (memory.events, memory.oom_control): N, or None when absent."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def _opt_int(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text and text.isdigit() else None


def memory_at(path: str | os.PathLike, version: int) -> MemoryState | None:
    """The counters of the memory cgroup directory `path` (v1 or v2); None if it is gone."""
    d = Path(path)
    if not d.is_dir():
        return None
    if version == 2:
        limits = []
        for node in (d, *d.parents):  # the lowest limit up to the mount
            if not (node / "cgroup.controllers").exists():
                break
            limits.append(_opt_int(node / "memory.max"))  # None for "max"
        limit = min((n for n in limits if n is not None), default=None)
        return MemoryState(2, str(d), _opt_int(d / "memory.current"), limit,
                           _opt_int(d / "memory.peak"),
                           _field(_read(d / "memory.events"), "oom_kill"),
                           _field(_read(d / "memory.stat"), "inactive_file"))
    stat = _read(d / "memory.stat")
    inactive = _field(stat, "total_inactive_file")  # hierarchical; inactive_file: this level
    return MemoryState(1, str(d), _opt_int(d / "memory.usage_in_bytes"), _v1_memory_limit(d),
                       _opt_int(d / "memory.max_usage_in_bytes"),
                       _field(_read(d / "memory.oom_control"), "oom_kill"),
                       inactive if inactive is not None else _field(stat, "inactive_file"))


def read_memory(root: str | os.PathLike = DEFAULT_ROOT,
                self_cgroup: str | None = None) -> MemoryState | None:
    """This process's memory cgroup (usage, limit, peak, OOM-kill counter); None without one."""
    root = Path(root)
    if (root / "cgroup.controllers").exists():
        return memory_at(_own_v2_dir(root, self_cgroup), 2)
    if (root / "memory").exists():
        return memory_at(_own_v1_dir(root, "memory", "memory", self_cgroup), 1)
    return None


def format_bytes(n: int) -> str:
    """`110999998464` -> `110,999,998,464 B (103.38 GiB)`."""
    return f"{n:,} B ({n / 2**30:.2f} GiB)"
