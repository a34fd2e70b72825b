"""What a launch executed and on what: code identity, environment, resource envelope.

`source_sha256` hashes the code that actually executed, whatever the revision says: a
launch snapshots the package's files once (`package_files`) and derives the source hash and
the executed-code fingerprint (aleph.record.fingerprint) from that same snapshot.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

from aleph.env import hostinfo
from aleph.env.cgroup import read_envelope, read_memory


def package_dir() -> Path:
    import aleph

    return Path(aleph.__file__).resolve().parent


def package_files(root: Path | None = None) -> dict[str, bytes]:
    """{relative posix path: bytes} of every *.py of the package (a few hundred KB)."""
    root = root or package_dir()
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.py"))}


def source_sha256(files: dict[str, bytes] | None = None) -> str:
    """Content hash of the aleph package: sorted *.py paths and bytes (read now if not given)."""
    files = package_files() if files is None else files
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0")
        h.update(files[rel] + b"\0")
    return h.hexdigest()


def file_hashes(files: dict[str, bytes]) -> dict[str, str]:
    """{relative path: sha256 of its bytes}: which files two launches ran identically."""
    return {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())}


def code_revision() -> str:
    """aleph/REVISION (baked into the image), else the git revision (+'-dirty'), else 'unknown'."""
    baked = package_dir() / "REVISION"
    if baked.is_file():
        text = baked.read_text(encoding="utf-8").strip()
        if text:
            return text
    src = package_dir().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True,
                             text=True, timeout=10)
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "aleph"], cwd=src,
                               capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def code_record(files: dict[str, bytes] | None = None) -> dict[str, Any]:
    """{revision, dirty, source_sha256} of the code this process runs."""
    revision = code_revision()
    return {"revision": revision, "dirty": revision.endswith("-dirty"),
            "source_sha256": source_sha256(files)}


def environment_summary() -> dict[str, Any]:
    """`aleph env check`'s summary; a clear marker instead if it cannot be produced."""
    try:
        from aleph.env.check import environment_summary as summary
    except ImportError as e:
        return {"error": f"aleph.env.check unavailable: {e}"}
    return summary()


def envelope(environment: dict[str, Any] | None = None) -> dict[str, Any]:
    """The resource envelope the launch ran in: what the kernel enforces (cgroup memory
    limit, CPU quota, cpuset), where it ran (CPU affinity, NUMA nodes, memory cgroup), what
    the host shows, and the GPUs and driver (from `environment`, the env summary)."""
    env, cpus, mem = read_envelope(), hostinfo.affinity(), read_memory()
    environment = environment or {}
    return {
        **env.as_dict(),
        "memory_limit_bytes": mem.limit_bytes if mem is not None else env.memory_limit_bytes,
        "cpu_affinity": hostinfo.format_cpulist(cpus) if cpus else None,
        "numa_nodes": hostinfo.numa_nodes(cpus) if cpus else None,
        "memory_cgroup": mem.path if mem is not None else None,
        "host_vcpus_visible": hostinfo.visible_vcpus(),
        "host_ram_bytes_visible": hostinfo.meminfo_bytes("MemTotal"),
        "gpus": environment.get("gpus"),
        "driver": environment.get("driver"),
    }
