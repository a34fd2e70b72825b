"""Host and container facts from /proc and /sys, each reader rooted for tests.

What a container sees of the host (all vCPUs, all RAM) is not what it may use; these
readers report the visible figures, `aleph.env.cgroup` reports the limits. A fact
that cannot be read is None, never a guess.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

_CONTAINER_ID = re.compile(r"(?:/containers/|docker[-/]|/libpod-|crio-)([0-9a-f]{64})")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def cpu_model(proc: Path = Path("/proc")) -> str | None:
    """First `model name` in cpuinfo (x86); None elsewhere."""
    for line in (_read(proc / "cpuinfo") or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return " ".join(value.split())
    return None


def visible_vcpus(proc: Path = Path("/proc")) -> int | None:
    """Logical CPUs the kernel shows (cpuinfo `processor` entries), not the quota."""
    text = _read(proc / "cpuinfo")
    return None if text is None else sum(
        line.split(":")[0].strip() == "processor" for line in text.splitlines())


def _kib_entry(path: Path, key: str) -> int | None:
    """`key:  N kB` of a /proc file in bytes (the kernel's kB are KiB); None where absent."""
    for line in (_read(path) or "").splitlines():
        if line.startswith(f"{key}:"):  # a malformed entry reads as absent, never raises
            n = line.split()[1:2]
            return int(n[0]) * 1024 if n and n[0].isdigit() else None
    return None


def meminfo_bytes(key: str, proc: Path = Path("/proc")) -> int | None:
    """One meminfo entry (`MemTotal`, `MemAvailable`, ...) in bytes, or None."""
    return _kib_entry(proc / "meminfo", key)


def status_bytes(key: str, proc: Path = Path("/proc")) -> int | None:
    """One entry of this process's status (`VmRSS`, `VmHWM`, `VmSize`) in bytes, or None."""
    return _kib_entry(proc / "self" / "status", key)


def container_id(proc: Path = Path("/proc")) -> str | None:
    """The 64-hex container id from mountinfo (Docker's /etc/hostname bind) or cgroup paths."""
    for name in ("self/mountinfo", "self/cgroup"):
        if m := _CONTAINER_ID.search(_read(proc / name) or ""):
            return m.group(1)
    return None


def parse_cpulist(text: str) -> set[int]:
    """`0-23,48-71` -> {0..23, 48..71}."""
    cpus: set[int] = set()
    for lo, _, hi in (part.partition("-") for part in text.strip().split(",") if part):
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpulist(cpus: set[int] | list[int]) -> str:
    """{0..23, 48..71} -> `0-23,48-71`."""
    ranges: list[list[int]] = []  # [first, last] of each run of consecutive CPUs
    for c in sorted(cpus):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None


def numa_nodes(cpus: set[int], sys_root: Path = Path("/sys")) -> list[int] | None:
    """NUMA nodes holding any of `cpus`; None when the topology is not exposed."""
    base = sys_root / "devices" / "system" / "node"
    if not base.is_dir():
        return None
    nodes = sorted(int(d.name[4:]) for d in base.glob("node[0-9]*"))
    return [n for n in nodes
            if (listed := _read(base / f"node{n}" / "cpulist")) and parse_cpulist(listed) & cpus]


def kernel_release(proc: Path = Path("/proc")) -> str | None:
    text = _read(proc / "sys" / "kernel" / "osrelease")
    return text.strip() if text else None


def os_release(etc: Path = Path("/etc")) -> str | None:
    for line in (_read(etc / "os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return None


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(path: Path, proc: Path = Path("/proc")) -> dict | None:
    """{mount_point, fstype, source} of the longest mount prefix of `path`."""
    best = None
    for line in (_read(proc / "self" / "mountinfo") or "").splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        mp = _unescape(left.split()[4])
        fstype, source = (right.split() + ["", ""])[:2]
        inside = str(path) == mp or str(path).startswith(mp.rstrip("/") + "/")
        if inside and (best is None or len(mp) > len(best["mount_point"])):
            best = {"mount_point": mp, "fstype": fstype, "source": _unescape(source)}
    return best


def storage(path: str | os.PathLike, proc: Path = Path("/proc")) -> dict:
    """Size and filesystem of the volume holding `path` (its nearest existing parent)."""
    p = Path(path).absolute()
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    mount = mount_of(probe.resolve(), proc) or dict.fromkeys(("mount_point", "fstype", "source"))
    return {"path": str(p), "exists": p.exists(), "total_bytes": usage.total,
            "free_bytes": usage.free, **mount}


def pick_device(name: str, what: str, index: int | None = None):
    """`name` as a torch.device: 'auto' (CUDA when torch sees a device, else the CPU), 'cpu' or
    'cuda' (device `index` when given). ConfigError naming `what` (the field or option) when
    CUDA is asked for and torch sees none. Used by `aleph train` and `aleph eval`."""
    import torch

    from aleph.errors import ConfigError

    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"{what}: 'cuda' asked for, but torch sees no CUDA device")
    return torch.device("cuda", index) if index is not None else torch.device("cuda")
