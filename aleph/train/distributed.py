"""Rank/world abstraction over torch.distributed, so the trainer is written once.

A single process is a world of size 1 and every collective is the identity. Under torchrun
(RANK/WORLD_SIZE/LOCAL_RANK), or srun with two or more tasks in the step (srun-native, below),
the process group uses NCCL on CUDA, gloo on CPU. Rank 0 is the only writer of the run
directory.

`batch_size` is the GLOBAL batch: each rank encodes its contiguous slice and the embeddings
are all-gathered with gradient, so the loss is the global batch's on every rank. The
gather's backward sums the W copies of that loss's gradient into each rank's slice and DDP
averages over W ranks: each parameter gets exactly d(global loss)/d(theta), the update of
one process with the whole batch, within float tolerance.

srun-native (docs/cluster.md): ranks from SLURM_PROCID/LOCALID/STEP_NUM_TASKS; the TCPStore
on the step's first host, on the port the kernel gives rank 0, published under the shared
work root (two jobs on one node never collide, as `base + jobid % N` does: catalyst #716).
"""

from __future__ import annotations

import os
import pickle
import re
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from aleph._io import atomic_write_text, work_root
from aleph.errors import ConfigError, PeerLost
from aleph.train.peers import Peers, first_line

RDZV_DIR = "cache/rendezvous"  # under the work root: <job>.<step>.<restart>.port, rank 0's


@dataclass(frozen=True)
class World:
    """This process's place in the job."""

    rank: int = 0  # global rank; 0 is the only writer
    size: int = 1
    local_rank: int = 0  # rank on this node (picks the CUDA device)
    collective_device: str = "cpu"  # of small control tensors: NCCL only moves CUDA tensors
    peers: Peers | None = field(default=None, compare=False, repr=False)  # None in a world of 1
    port_file: Path | None = field(default=None, compare=False, repr=False)  # srun rank 0's

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def barrier(self, what: str, log: Callable[[str], None]) -> None:
        """Every rank reaches this point; waits by polling (a long wait never trips the
        collective timeout), and raises PeerLost naming a rank that stopped beating."""
        if self.peers is not None:
            self.peers.barrier(what, log)

    def on_main(self, what: str, fn: Callable[[], Any], log: Callable[[str], None],
                share: Callable[[Any], Any] = lambda result: result) -> Any:
        """fn() on rank 0 while the others wait in the polling barrier: rank 0 gets fn's
        result, the others share(result); its exception is raised on every rank (so all
        stop alike). A stop (StopRequested, KeyboardInterrupt) on rank 0 is raised there at
        once, and the others leave the barrier with PeerLost unless their own stop came."""
        if not self.distributed:
            return fn()
        result, outcome, error = None, (True, None), None
        if self.is_main:
            try:
                result = fn()
                outcome = (True, share(result))
            except Exception as e:  # noqa: BLE001 - raised below, here and on the others
                outcome, error = (False, _portable(e)), e
            except BaseException:  # a stop: no broadcast that could wait on a rank that left
                self.peers.mark_gone()
                raise
        self.barrier(what, log)
        ok, value = self.broadcast_object(outcome)
        if not ok:
            raise error if error is not None else value  # rank 0: its own, unpickled
        return result if self.is_main else value

    def failure_note(self, e: BaseException) -> str | None:
        """One line for a failed collective (a c10d error, or gloo's/NCCL's RuntimeError):
        which ranks stopped beating, if any did; None for any other error."""
        if self.peers is None or isinstance(e, PeerLost) or not _collective_error(e):
            return None
        silent = self.peers.silent()
        if not silent:
            return None
        names = ", ".join(f"rank {r} (no heartbeat for {s:.0f} s)" for r, s in silent)
        return (f"{names} stopped answering: a collective on rank {self.rank} failed after "
                f"collective_timeout_s={self.peers.timeout_s:g} ({first_line(e)})")

    def broadcast_object(self, obj: Any = None) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.distributed:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def any_flag(self, *flags: bool) -> list[bool]:
        """Element-wise OR of boolean flags over ranks (so all ranks stop/save together)."""
        if not self.distributed:
            return list(flags)
        t = torch.tensor([float(f) for f in flags], device=self.collective_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [bool(v) for v in t.tolist()]

    def gather_with_grad(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's (b, D) into (W*b, D) in rank order, gradients flowing back."""
        if not self.distributed:
            return x
        import torch.distributed.nn.functional as dfn

        return torch.cat(dfn.all_gather(x), dim=0)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's (b, ...) into (W*b, ...) without gradient."""
        if not self.distributed:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)

    def shutdown(self) -> None:
        if self.peers is not None:
            self.peers.close()
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()
        if self.port_file is not None:
            self.port_file.unlink(missing_ok=True)


COLLECTIVE_ERRORS = ("gloo", "NCCL", "Timed out", "timed out", "Connection closed by peer",
                     "Connection reset by peer")
"""What a collective's RuntimeError says when its transport failed (gloo raises plain
RuntimeErrors; c10d's own are torch.distributed.DistError)."""


def _collective_error(e: BaseException) -> bool:
    if isinstance(e, dist.DistError):
        return True
    return type(e) is RuntimeError and any(m in str(e) for m in COLLECTIVE_ERRORS)


def _portable(e: Exception) -> Exception:
    """`e` if it survives pickling (broadcast_object pickles), else a RuntimeError of its text.

    The round trip is of this process's own exception, never of bytes from a file or peer
    outside the job: it only tells whether the other ranks could rebuild it."""
    try:
        pickle.loads(pickle.dumps(e))  # noqa: S301 - our own object (see above)
        return e
    except Exception:  # noqa: BLE001 - any failure to pickle or rebuild
        return RuntimeError(f"{type(e).__name__} on rank 0: {e}")


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r}: expected an integer") from None


def srun_ranks() -> tuple[int, int, int] | None:
    """(rank, local rank, world size) of an srun step of two or more tasks, else None. Keyed
    on SLURM_STEP_NUM_TASKS, which srun sets for its own step only (the batch script of a
    job with --ntasks=4 is not a world of four)."""
    if os.environ.get("SLURM_STEP_NUM_TASKS") is None or os.environ.get("WORLD_SIZE"):
        return None  # no srun step, or torchrun under srun: its own world
    values = []
    for name in ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID"):
        raw = os.environ.get(name, "")
        if not raw.isdigit():
            raise ConfigError(f"environment variable {name}={raw!r}: expected an integer "
                              "(set by srun for each task)")
        values.append(int(raw))
    size, rank, local = values
    return None if size < 2 else (rank, local, size)


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: 'gpu[03-05,9],cpu1' -> 'gpu03' (zero padding kept)."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m or not m.group(1):
        raise ConfigError(f"environment variable SLURM_STEP_NODELIST={nodelist!r}: expected a "
                          "Slurm host list such as node[1-2]")
    ranges = m.group(2)
    return m.group(1) + ("" if ranges is None else ranges.split(",")[0].split("-")[0])


def rendezvous_store(rank: int, size: int, timeout_s: float) -> tuple[dist.TCPStore, Path | None]:
    """The TCPStore of this srun step: rank 0 hosts it on a kernel-chosen port and publishes
    the port; the others wait for the file (at most timeout_s) and connect to the first host."""
    env = os.environ.get
    key = f"{env('SLURM_JOB_ID', 'nojob')}.{env('SLURM_STEP_ID', '0')}.{env('SLURM_RESTART_COUNT', '0')}"
    path = work_root() / RDZV_DIR / f"{key}.port"
    wait = timedelta(seconds=timeout_s)
    if rank == 0:
        store = dist.TCPStore("0.0.0.0", 0, size, is_master=True, timeout=wait,
                              wait_for_workers=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, f"{store.port}\n")
        return store, path
    host = first_host(env("SLURM_STEP_NODELIST") or env("SLURM_JOB_NODELIST", ""))
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
    return dist.TCPStore(host, port, size, is_master=False, timeout=wait), None


def init_world(device_kind: str, timeout_s: float,
               in_thread: Callable[[], Any] | None = None) -> World:
    """World from torchrun's environment (size 1 without it); joins the process group, whose
    collectives time out after `timeout_s` (config field collective_timeout_s), and starts
    this rank's heartbeat thread (inside the context `in_thread()`: the code tracer)."""
    by_srun = srun_ranks()
    if by_srun is not None:
        rank, local, size = by_srun
    else:
        size = _env_int("WORLD_SIZE") or 1
        if size == 1:
            return World()
        rank, local = _env_int("RANK"), _env_int("LOCAL_RANK")
        if rank is None or local is None:
            raise ConfigError("WORLD_SIZE is set but RANK/LOCAL_RANK are not: launch with torchrun")
    backend = "nccl" if device_kind == "cuda" else "gloo"
    if device_kind == "cuda":  # srun --gpus-per-task: each task sees its one GPU as cuda:0
        local = 0 if torch.cuda.device_count() == 1 else local
        torch.cuda.set_device(local)
    # Short: a hung rank is found in minutes. Rank 0's long one-off work (a 49 GB store
    # build) is waited for in World.on_main's polling barrier, never in a collective.
    store, port_file = rendezvous_store(rank, size, timeout_s) if by_srun else (None, None)
    by_store = {} if store is None else {"store": store, "rank": rank, "world_size": size}
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s), **by_store)
    device = f"cuda:{local}" if device_kind == "cuda" else "cpu"
    world = World(rank=rank, size=size, local_rank=local, collective_device=device,
                  port_file=port_file)
    try:
        # A prefix per launch: a store can outlive a restarted attempt's keys.
        prefix = f"aleph/{world.broadcast_object(secrets.token_hex(8))}/"
        return replace(world, peers=Peers(
            dist.distributed_c10d._get_default_store(), prefix, rank, size, timeout_s, in_thread))
    except BaseException:
        world.shutdown()  # no peers yet: leaves the process group, removes the port file
        raise


def check_divisible(batch_size: int, world: World) -> int:
    """Per-rank batch; the global batch must split evenly over the ranks."""
    if batch_size % world.size:
        raise ConfigError(f"config field 'batch_size': {batch_size} is the GLOBAL batch and must be "
                          f"divisible by the world size {world.size}")
    return batch_size // world.size
