"""Live facts of the running environment: interpreter, torch build, driver and GPUs.

Every probe degrades to None / [] on a machine without torch, CUDA or nvidia-smi; none
raises. `nvidia-smi` is reached through a `runner` parameter so tests feed fabricated
output instead of patching the real world.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from collections.abc import Callable
from importlib import metadata

# runner(args) -> stdout text, or None when the tool is absent or fails.
Runner = Callable[[list[str]], "str | None"]

_SMI_TIMEOUT_S = 10  # a wedged driver can hang nvidia-smi; never hang the check with it


def run_tool(args: list[str]) -> str | None:
    """Run a host tool; None when it is not installed, fails, or times out."""
    if shutil.which(args[0]) is None:
        return None
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def runtime_facts() -> dict:
    """python, compiler, torch, cuda, cudnn (int), triton, as this interpreter sees them;
    torch is imported (about 1 s): CUDA and cuDNN are the versions torch loads (its nvidia
    wheels), not the base image's system copies."""
    facts = {"python": platform.python_version(), "compiler": platform.python_compiler(),
             "torch": None, "cuda": None, "cudnn": None,
             # From metadata: importing triton costs seconds and tells nothing more.
             "triton": _dist_version("triton")}
    try:
        import torch
    except Exception:  # absent, or a broken build (e.g. libcublas missing): report None
        return facts
    facts["torch"], facts["cuda"] = torch.__version__, torch.version.cuda
    try:
        facts["cudnn"] = torch.backends.cudnn.version()
    except Exception:  # cuDNN library missing or unloadable: stays None
        pass
    return facts


def gpu_facts(runner: Runner = run_tool) -> dict:
    """{"driver": str | None, "gpus": [{name, memory_mib, uuid}]} from nvidia-smi."""
    out = runner(["nvidia-smi", "--query-gpu=name,memory.total,uuid,driver_version",
                  "--format=csv,noheader,nounits"])
    gpus, driver = [], None
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        name, mem, uuid, drv = parts
        gpus.append({"name": name, "memory_mib": int(mem) if mem.isdigit() else None, "uuid": uuid})
        driver = driver or drv
    return {"driver": driver, "gpus": gpus}


def gpu_topology(runner: Runner = run_tool) -> str | None:
    """`nvidia-smi topo -m` matrix text (peer links such as PXB), or None when unavailable."""
    out = runner(["nvidia-smi", "topo", "-m"])
    return out.rstrip() if out else None
