"""trainer.pt of a resume state: optimiser, scheduler and RNG states, tensors and plain values
only, loaded through torch's weights-only unpickler so nothing in it can run."""

from __future__ import annotations

import os
import re
import reprlib
import stat
from pathlib import Path

import torch

from aleph.errors import StoreError


def _refuse(file: Path, why: str) -> StoreError:
    return StoreError(f"{file}: refused as a resume state: {why}; a resume state holds only "
                      "tensors and plain values, and nothing else in it is ever run or "
                      "built (delete this checkpoint directory to resume from the one before)")


_SHORT = reprlib.Repr()
_SHORT.maxstring = 160


def _unpickle_error(e: Exception) -> str:
    """What torch's weights-only refusal names (`Unsupported global: GLOBAL posix.system`),
    without its advice to load with weights_only=False."""
    text = str(e)
    said = re.search(r"WeightsUnpickler error: (.*?)(?: was not an allowed global|\n|$)", text)
    line = said.group(1) if said else (text.strip().splitlines() or [type(e).__name__])[0]
    return _SHORT.repr(line.strip())[1:-1]


def load_trainer_state(path: Path) -> dict:
    """trainer.pt of a complete state through torch's weights-only unpickler.

    Only tensors, plain containers and numbers load; anything else (a pickled callable,
    another class, a numpy array) is refused with one line naming the file: a pulled run's
    checksums are written by whoever wrote the run, so they prove nothing about what the
    file would execute.
    """
    file = Path(path) / "trainer.pt"
    st = os.lstat(file)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(file, "not a regular file")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError for a forbidden global; RuntimeError for a bad zip
        raise _refuse(file, _unpickle_error(e)) from None
    problem = _state_problem(state)
    if problem:
        raise _refuse(file, problem)
    return state


def _state_problem(state) -> str | None:
    """What is wrong with the shape of a loaded trainer state, or None."""
    if not isinstance(state, dict) or not {"optimizer", "scheduler", "rng"} <= set(state):
        return "expected a dict with optimizer, scheduler and rng"
    if not isinstance(state["rng"], list) or not state["rng"]:
        return "rng: expected a list of per-rank RNG states"
    for rank, rng in enumerate(state["rng"]):
        if not isinstance(rng, dict) or not {"python", "numpy", "torch"} <= set(rng):
            return f"rng[{rank}]: expected python, numpy and torch generator states"
        saved = rng["numpy"]
        if not (isinstance(saved, dict) and isinstance(saved.get("keys"), torch.Tensor)
                and tuple(saved["keys"].shape) == (624,)):
            return f"rng[{rank}].numpy: expected the MT19937 state (624 keys)"
        if not isinstance(rng["torch"], torch.Tensor):
            return f"rng[{rank}].torch: expected a ByteTensor"
        if "cuda" in rng and not isinstance(rng["cuda"], torch.Tensor):
            return f"rng[{rank}].cuda: expected one ByteTensor (the rank's own device)"
    return None


