"""The torch-2.4 laws of the E1 line, as code.

The seed records three torch-2.4 behaviours that change what a correct trainer looks
like; each has a law test in tests/env/test_laws.py that fails when torch moves, so a
maintainer revisits this file instead of inheriting a silently wrong rule:

1. `import torch` does not import `torch.utils.checkpoint` on 2.4 (2.8+ does): always
   import the submodule explicitly. `checkpoint_fn()` is the one place that does.
2. `checkpoint(torch.compile(f), x, use_reentrant=False)` fails on 2.4 at the first
   backward: dynamo refuses to be traced by the FX re-entry of the checkpoint recompute
   (`BackendCompilerFailed ... FX to symbolically trace a dynamo-optimized function`),
   seen on 2.4.1 CPU with and without dropout in `f`. The seed calls it 2.4's
   RNG-fork/fake-tensor collision; that RNG-state FakeTensor error (pytorch/pytorch#121966)
   is reported on CUDA and was not seen on CPU. So on torch < 2.5 a compiled model must not
   checkpoint its inner blocks: compile and per-block checkpointing are exclusive, and
   `check_compile_checkpointing` refuses the combination.
3. 2.4's checkpoint recompute cannot re-enter dynamo (fixed upstream by
   pytorch/pytorch#149784 and #153300): the structural reason behind law 2.
"""

from __future__ import annotations

import re

import torch
import torch.utils.checkpoint  # law 1: never rely on `import torch` providing this

from aleph.errors import ConfigError

#: The torch release the seed's laws were measured on.
PINNED_TORCH = "2.4.1"

#: First torch minor where compile inside non-reentrant checkpoint works (seen on 2.5.1).
COMPILE_CHECKPOINT_FIXED = (2, 5)

COMPILE_CHECKPOINT_REASON = (
    "on torch {version} checkpoint(torch.compile(block), use_reentrant=False) fails: the "
    "checkpoint recompute re-enters dynamo, which 2.4 cannot do (BackendCompilerFailed: FX "
    "to symbolically trace a dynamo-optimized function, with or without dropout). Set "
    "compile=false or checkpointing=false"
)


def compile_checkpoint_exclusive(version: str | None = None) -> bool:
    """True when this torch (or `version`, e.g. '2.4.1+cu124') cannot compile a model whose
    blocks are checkpointed."""
    version = version or torch.__version__
    if not (m := re.match(r"(\d+)\.(\d+)", version)):
        raise ValueError(f"cannot parse torch version {version!r}")
    return (int(m[1]), int(m[2])) < COMPILE_CHECKPOINT_FIXED


def check_compile_checkpointing(compile: bool, checkpointing: bool, version: str | None = None) -> None:
    """Raise ConfigError when both are asked for on a torch where they are exclusive."""
    if compile and checkpointing and compile_checkpoint_exclusive(version):
        reason = COMPILE_CHECKPOINT_REASON.format(version=version or torch.__version__)
        raise ConfigError(f"compile and checkpointing are exclusive: {reason}")


def checkpoint_fn():
    """The non-reentrant activation checkpoint, with the submodule imported explicitly."""
    return torch.utils.checkpoint.checkpoint
