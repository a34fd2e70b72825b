"""How much memory a pass may still allocate here, and the refusal of one that needs more.

`memory_budget(device)` is, on the CPU, the least of: the host's MemAvailable, the memory
cgroup's limit less its usage (`aleph.env.cgroup.read_memory`), and RLIMIT_AS less the
address space already mapped (VmSize); on a CUDA device, the device's free memory. Each
figure that cannot be read is left out; with none, the budget is unknown (None) and nothing
is refused. `require_memory` turns a need above the budget into one line, before anything
is allocated.
"""

from __future__ import annotations

import resource

from aleph.env.cgroup import format_bytes, read_memory
from aleph.env.hostinfo import meminfo_bytes, status_bytes
from aleph.errors import QuotaError


def memory_budget(device: str = "cpu") -> tuple[int | None, str]:
    """(bytes this process may still allocate on `device`, which limit set it)."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free, f"free memory of {device}"
    figures = []
    avail = meminfo_bytes("MemAvailable")
    if avail is not None:
        figures.append((avail, "the host's MemAvailable"))
    mem = read_memory()
    if mem is not None and mem.limit_bytes is not None and mem.usage_bytes is not None:
        figures.append((max(mem.limit_bytes - mem.usage_bytes, 0),
                        "the memory cgroup's limit less its usage"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    size = status_bytes("VmSize")
    if soft != resource.RLIM_INFINITY and size is not None:
        figures.append((max(soft - size, 0), "RLIMIT_AS less the address space in use"))
    if not figures:
        return None, "no memory figure readable"
    return min(figures)


def require_memory(need: int, what: str, device: str = "cpu") -> None:
    """QuotaError (one line: what, the need, the budget and its source) when `need` bytes
    do not fit `memory_budget(device)`."""
    budget, basis = memory_budget(device)
    if budget is not None and need > budget:
        raise QuotaError(f"{what} needs about {format_bytes(need)} of memory, "
                         f"{format_bytes(budget)} is available ({basis}); refused before "
                         "allocating it")
