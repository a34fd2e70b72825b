"""srun-native DDP: one Slurm task per rank, no torchrun.

Under `srun` with more than one task in the step, the ranks come from Slurm's variables
(SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS) and the rendezvous store is a TCPStore
on the step's first host. Its port is the one the kernel gives rank 0 (port 0), published
in a file under the shared work root, so two jobs on one node can never both get it
(`base + jobid % N` collides: catalyst PR #716). Every node must see the work root at the
same path, as the run directory and its lock already require.
"""

from __future__ import annotations

import os
import re
import socket
import time
from datetime import timedelta
from pathlib import Path

from aleph._io import atomic_write_text, work_root
from aleph.errors import ConfigError

RDZV_DIR = "cache/rendezvous"
"""Under the work root: `<job>.<step>.<restart>.port`, written by rank 0, removed at shutdown."""


def srun_ranks() -> tuple[int, int, int] | None:
    """(rank, local rank, world size) of an srun step of two or more tasks, else None.

    Keyed on SLURM_STEP_NUM_TASKS, which srun sets for its own step only: the batch
    script of a job with --ntasks=4 is not a world of four."""
    steps = os.environ.get("SLURM_STEP_NUM_TASKS")
    if steps is None or os.environ.get("WORLD_SIZE"):  # torchrun under srun: its own world
        return None
    values = {}
    for name in ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID"):
        raw = os.environ.get(name, "")
        if not raw.isdigit():
            raise ConfigError(f"environment variable {name}={raw!r}: expected an integer "
                              "(set by srun for each task)")
        values[name] = int(raw)
    size = values["SLURM_STEP_NUM_TASKS"]
    return None if size < 2 else (values["SLURM_PROCID"], values["SLURM_LOCALID"], size)


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: 'gpu[03-05,9],cpu1' -> 'gpu03' (zero padding kept)."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m or not m.group(1):
        raise ConfigError(f"environment variable SLURM_STEP_NODELIST={nodelist!r}: expected a "
                          "Slurm host list such as node[1-2]")
    prefix, ranges = m.group(1), m.group(2)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def rendezvous_store(rank: int, size: int, timeout_s: float):
    """The TCPStore of this step: rank 0 hosts it on a kernel-chosen port and publishes the
    port; the others wait for the file (at most timeout_s) and connect to the first host."""
    from torch.distributed import TCPStore

    job = os.environ.get("SLURM_JOB_ID", "nojob")
    key = f"{job}.{os.environ.get('SLURM_STEP_ID', '0')}.{os.environ.get('SLURM_RESTART_COUNT', '0')}"
    path = work_root() / RDZV_DIR / f"{key}.port"
    wait = timedelta(seconds=timeout_s)
    if rank == 0:
        store = TCPStore("0.0.0.0", 0, size, is_master=True, timeout=wait, wait_for_workers=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, f"{store.port}\n")
        return store, path
    host = first_host(os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", ""))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            port = int(path.read_text().strip())
            break
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise ConfigError(f"{path}: rank 0 did not publish its rendezvous port within "
                                  f"collective_timeout_s={timeout_s:g}; every node must see the work "
                                  f"root {work_root()} at the same path") from None
            time.sleep(0.2)
    try:
        socket.getaddrinfo(host, port)
    except OSError as e:
        raise ConfigError(f"the step's first host {host!r} (SLURM_STEP_NODELIST) does not "
                          f"resolve on this node: {e}") from None
    return TCPStore(host, port, size, is_master=False, timeout=wait), None


def release(path: Path | None) -> None:
    """Remove the port file this rank 0 wrote (nothing else)."""
    if path is not None:
        path.unlink(missing_ok=True)
