"""trainer.pt of a resume state: optimiser, scheduler and RNG states, tensors and plain values
only, loaded through torch's weights-only unpickler so nothing in it can run."""

from __future__ import annotations

import os
import re
import reprlib
import stat
from pathlib import Path

import numpy as np
import torch

from aleph.errors import StoreError
from aleph.train.legacy import numpy_globals


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


def load_trainer_state(path: Path) -> tuple[dict, bool]:
    """trainer.pt of a complete state through torch's weights-only unpickler: (state, legacy).

    Only tensors, plain containers and numbers load; a state of the earlier format
    (`legacy`) may also hold numpy's uint32 array, through an allow-list of exactly its
    reconstructors, set for this one load. Anything else (a pickled callable, another
    class) is refused with one line naming the file: a pulled run's checksums are written
    by whoever wrote the run, so they prove nothing about what the file would execute.
    """
    from torch import _weights_only_unpickler as unpickler

    file = Path(path) / "trainer.pt"
    st = os.lstat(file)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(file, "not a regular file")
    try:
        state, legacy = torch.load(file, map_location="cpu", weights_only=True), False
    except Exception as e:  # UnpicklingError for a forbidden global; RuntimeError for a bad zip
        if "GLOBAL numpy." not in str(e):
            raise _refuse(file, _unpickle_error(e)) from None
        saved = list(unpickler._marked_safe_globals_list)
        torch.serialization.add_safe_globals(numpy_globals())
        try:
            state, legacy = torch.load(file, map_location="cpu", weights_only=True), True
        except Exception as e2:
            raise _refuse(file, _unpickle_error(e2)) from None
        finally:
            unpickler._marked_safe_globals_list[:] = saved
    problem = _state_problem(state)
    if problem:
        raise _refuse(file, problem)
    return state, legacy


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
        ok = (isinstance(saved, dict) and isinstance(saved.get("keys"), torch.Tensor)) or (
            isinstance(saved, tuple) and len(saved) == 5 and isinstance(saved[1], np.ndarray)
            and saved[1].dtype == np.uint32 and saved[1].shape == (624,))
        if not ok:
            return f"rng[{rank}].numpy: expected the MT19937 state (624 keys)"
        if not isinstance(rng["torch"], torch.Tensor):
            return f"rng[{rank}].torch: expected a ByteTensor"
    return None


