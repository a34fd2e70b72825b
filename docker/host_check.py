#!/usr/bin/env python3
"""Can this host run the E1 containers? Prints what is missing; exits 1 if anything is.

Run on the Docker host (not in the image), with the system python3 (3.10 on Ubuntu
22.04; standard library only):
    python3 docker/host_check.py [--work-dir DIR] [--headroom-gib N]
Checks: NVIDIA driver new enough for the image's CUDA 12.4.1, the NVIDIA container
toolkit Docker uses for GPU requests, Docker Engine with Compose v2, free disk on the
work volume for the target store, host RAM and CPUs against the container envelope.
`evaluate()` takes the facts as a parameter, so tests feed fabricated hosts.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

# CUDA 12.4 Update 1 needs Linux driver >= 550.54.15 (CUDA Toolkit release notes,
# "CUDA Toolkit and Corresponding Driver Versions"). Newer CUDA 12.x drivers also work.
MIN_DRIVER = (550, 54, 15)
STORE_BYTES = 49_007_026_176  # 31,905,616 rows x 768 x 2 B (fp16): the target store
MEM_LIMIT = 110_999_998_464  # compose.yaml mem_limit, the seed container's quota
HOST_RESERVE = 4 << 30  # the host's own processes and Docker beside a full-quota container
# compose.yaml's cfs quota / period (17.85 CPUs). Unlike `cpus:`, a cfs quota is accepted
# on any host; with fewer CPUs it never binds, which is worth a note, not a refusal.
CPU_QUOTA_US, CPU_PERIOD_US = 1_785_000, 100_000
DEFAULT_HEADROOM_GIB = 64  # token store, checkpoints, runs, image layers beside the store
# Docker's "nvidia" device driver (compose GPU reservations) execs this hook.
TOOLKIT_HOOK = "nvidia-container-runtime-hook"


@dataclass
class HostFacts:
    driver: str | None  # nvidia-smi driver_version; None when nvidia-smi is absent
    gpu_count: int
    toolkit_hook: str | None  # path of TOOLKIT_HOOK, None when not on PATH
    docker: str | None  # Docker Engine server version; None when unreachable
    compose: str | None  # `docker compose version --short`; None when the plugin is absent
    work_dir: str | None
    free_bytes: int | None
    mem_total_bytes: int | None
    cpu_count: int | None


def parse_version(text: str) -> tuple[int, ...] | None:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)*)\s*", text or "")
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def evaluate(f: HostFacts, headroom_bytes: int = DEFAULT_HEADROOM_GIB << 30) -> list[str]:
    """One message per missing or insufficient piece; empty when the host is ready."""
    problems = []
    drv = parse_version(f.driver) if f.driver else None
    need_drv = ".".join(map(str, MIN_DRIVER))
    if f.driver is None:
        problems.append(f"NVIDIA driver: nvidia-smi not found or failing; need >= {need_drv}")
    elif drv is None or drv < MIN_DRIVER:
        problems.append(f"NVIDIA driver: found {f.driver}, CUDA 12.4.1 needs >= {need_drv}")
    if f.driver is not None and f.gpu_count < 1:
        problems.append("GPUs: nvidia-smi lists no GPU")
    if f.toolkit_hook is None:
        problems.append(
            f"NVIDIA container toolkit: {TOOLKIT_HOOK} not on PATH (install "
            "nvidia-container-toolkit, then `nvidia-ctk runtime configure --runtime=docker`)"
        )
    if f.docker is None:
        problems.append(
            "Docker Engine: `docker info` failed (not installed, not running, or no permission)"
        )
    if f.compose is None:
        problems.append("Docker Compose v2: `docker compose version` failed (the compose plugin is "
                        "absent); need 2.x")
    elif not f.compose.lstrip("v").startswith("2"):
        problems.append(f"Docker Compose v2: `docker compose version` gave {f.compose!r}; need 2.x")
    need_disk = STORE_BYTES + headroom_bytes
    if f.free_bytes is None:
        where = (f"{f.work_dir!r} not found" if f.work_dir is not None
                 else "none given and no Docker data root to default to")
        problems.append(f"work volume: {where}; pass --work-dir")
    elif f.free_bytes < need_disk:
        problems.append(
            f"work volume {f.work_dir}: {f.free_bytes:,} B free, need {need_disk:,} B "
            f"(target store {STORE_BYTES:,} B + headroom {headroom_bytes:,} B)"
        )
    need_ram = MEM_LIMIT + HOST_RESERVE
    if f.mem_total_bytes is None:
        problems.append("host RAM: /proc/meminfo unreadable")
    elif f.mem_total_bytes < need_ram:
        problems.append(
            f"host RAM: {f.mem_total_bytes:,} B, need {need_ram:,} B (container quota "
            f"{MEM_LIMIT:,} B + {HOST_RESERVE:,} B for the host); below that the host OOM "
            "killer, not the container quota, decides"
        )
    return problems


def notes(f: HostFacts) -> list[str]:
    """What differs from the seed's envelope without stopping anything."""
    cores = CPU_QUOTA_US / CPU_PERIOD_US
    if f.cpu_count is not None and f.cpu_count < cores:
        return [f"CPUs: {f.cpu_count} visible, fewer than the envelope's {cores:g}-CPU quota "
                f"(cfs {CPU_QUOTA_US:,} / {CPU_PERIOD_US:,}): the containers start, and the "
                f"quota never binds (an arm gets at most {f.cpu_count} CPUs)"]
    return []


def _shown(value, absent: str = "absent") -> str:
    return absent if value is None else str(value)


def summary(f: HostFacts) -> str:
    """The facts line: words, never Python's None, for what is absent or unknown."""
    gpus = f"{f.gpu_count} GPU" + ("" if f.gpu_count == 1 else "s")
    driver = f"driver {f.driver} ({gpus})" if f.driver is not None else "driver absent (no nvidia-smi)"
    ram = f"{f.mem_total_bytes:,} B" if f.mem_total_bytes is not None else "unknown"
    if f.work_dir is None:
        work = "work dir none (no --work-dir, no Docker data root)"
    elif f.free_bytes is None:
        work = f"work {f.work_dir} (not found)"
    else:
        work = f"work {f.work_dir} ({f.free_bytes:,} B free)"
    return (f"{driver}, toolkit hook {_shown(f.toolkit_hook)}, docker "
            f"{_shown(f.docker, 'absent or unreachable')}, compose {_shown(f.compose)}, RAM {ram}, "
            f"CPUs {_shown(f.cpu_count, 'unknown')}, {work}")


def hints(f: HostFacts) -> list[str]:
    """Where a host without an NVIDIA GPU can still run the project."""
    if f.driver is not None and f.gpu_count > 0:
        return []
    return ["no NVIDIA GPU here, so not the GPU containers; this machine can still run the project:",
            "without Docker (README, 'On any Linux x86_64 machine without Docker'): "
            "./aleph-dev train-a2, then ./aleph-dev test",
            "or the container path on CPU (README, 'the CPU image'): docker compose -f compose.yaml "
            "-f compose.cpu.yaml up train-a2"]


def _run(args: list[str]) -> str | None:
    if shutil.which(args[0]) is None:
        return None
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def _mem_total(meminfo: str = "/proc/meminfo") -> int | None:
    try:
        with open(meminfo, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def gather(work_dir: str | None) -> HostFacts:
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    drivers = [line.strip() for line in (smi or "").splitlines() if line.strip()]
    docker = _run(["docker", "info", "--format", "{{.ServerVersion}}"])
    if work_dir is None and docker is not None:
        # Named volumes live under Docker's data root; that is the disk that must hold the store.
        work_dir = _run(["docker", "info", "--format", "{{.DockerRootDir}}"])
    free = None
    if work_dir and os.path.isdir(work_dir):
        free = shutil.disk_usage(work_dir).free
    return HostFacts(
        driver=drivers[0] if drivers else None,
        gpu_count=len(drivers),
        toolkit_hook=shutil.which(TOOLKIT_HOOK),
        docker=docker,
        compose=_run(["docker", "compose", "version", "--short"]),
        work_dir=work_dir,
        free_bytes=free,
        mem_total_bytes=_mem_total(),
        cpu_count=os.cpu_count(),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work-dir", help="directory on the work volume (default: Docker's data root)")
    ap.add_argument(
        "--headroom-gib",
        type=int,
        default=DEFAULT_HEADROOM_GIB,
        help="free space wanted beyond the 49 GB target store (default %(default)s)",
    )
    args = ap.parse_args(argv)
    facts = gather(args.work_dir)
    problems = evaluate(facts, args.headroom_gib << 30)
    print(summary(facts))
    for p in problems:
        print(f"MISSING: {p}")
    for n in notes(facts):
        print(f"NOTE: {n}")
    for h in hints(facts):
        print(f"HINT: {h}")
    print("host check: OK" if not problems else f"host check: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
