"""Rank/world abstraction over torch.distributed, so the trainer is written once.

A single process is a world of size 1 and every collective is the identity. Under
torchrun (RANK/WORLD_SIZE/LOCAL_RANK in the environment), or under srun with two or more
tasks in the step (srun-native: aleph.train.srun), the process group is created with NCCL on
CUDA and gloo on CPU. Rank 0 is the only writer of the run directory.

Semantics of the global batch: `batch_size` is the number of rows per optimiser step
over ALL ranks. Each rank encodes its contiguous slice of the step's global batch; the
embeddings are all-gathered (with gradient) so the InfoNCE negatives and the loss are
those of the global batch, identical on every rank. Gradients reaching a rank's own
slice are summed over ranks by the gather's backward (W copies of the same loss), and
DDP then averages over W ranks, so each parameter gets exactly d(global loss)/d(theta):
the same update as one process with the whole batch, within float tolerance.
"""

from __future__ import annotations

import os
import pickle
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from aleph.errors import ConfigError, PeerLost
from aleph.train import srun
from aleph.train.peers import Peers


@dataclass(frozen=True)
class World:
    """This process's place in the job."""

    rank: int = 0
    """Global rank; 0 is the only writer."""
    size: int = 1
    """Number of processes (world size)."""
    local_rank: int = 0
    """Rank on this node (picks the CUDA device)."""
    collective_device: str = "cpu"
    """Where small control tensors live for collectives: NCCL only moves CUDA tensors."""
    peers: Peers | None = field(default=None, compare=False, repr=False)
    """Heartbeats and the polling barrier (None in a world of one)."""
    port_file: Path | None = field(default=None, compare=False, repr=False)
    """srun-native rank 0's published rendezvous port (removed at shutdown)."""

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
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        return (f"{names} stopped answering: a collective on rank {self.rank} failed after "
                f"collective_timeout_s={self.peers.timeout_s:g} ({first})")

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


def init_world(device_kind: str, timeout_s: float,
               in_thread: Callable[[], Any] | None = None) -> World:
    """World from torchrun's environment (size 1 without it); joins the process group, whose
    collectives time out after `timeout_s` (config field collective_timeout_s), and starts
    this rank's heartbeat thread (inside the context `in_thread()`: the code tracer)."""
    by_srun = srun.srun_ranks()
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
    timeout, port_file = timedelta(seconds=timeout_s), None
    if by_srun is not None:
        store, port_file = srun.rendezvous_store(rank, size, timeout_s)
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=size,
                                timeout=timeout)
    else:
        dist.init_process_group(backend=backend, timeout=timeout)
    device = f"cuda:{local}" if device_kind == "cuda" else "cpu"
    world = World(rank=rank, size=size, local_rank=local, collective_device=device)
    try:
        # A prefix per launch: a store can outlive a restarted attempt's keys.
        prefix = f"aleph/{world.broadcast_object(secrets.token_hex(8))}/"
        peers = Peers(dist.distributed_c10d._get_default_store(), prefix, rank, size,
                      timeout_s, in_thread)
    except BaseException:
        dist.destroy_process_group()
        srun.release(port_file)
        raise
    return World(rank=rank, size=size, local_rank=local, collective_device=device, peers=peers,
                 port_file=port_file)


def check_divisible(batch_size: int, world: World) -> int:
    """Per-rank batch; the global batch must split evenly over the ranks."""
    if batch_size % world.size:
        raise ConfigError(f"config field 'batch_size': {batch_size} is the GLOBAL batch and must be "
                          f"divisible by the world size {world.size}")
    return batch_size // world.size
