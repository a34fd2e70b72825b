"""Resume states `checkpoints/step-NNNNNNNN/`: written to a temporary directory, fsynced,
renamed, the COMPLETE marker (sha256 and size of each file) last; verified before a resume,
set aside as `.corrupt-<UTC>` when damaged; pruned to `keep_checkpoints` at every instant.
README.md "Resume and stop" has the contract. Files: `model.safetensors` (the uncompiled
model), `trainer.pt` (optimiser, scheduler, every rank's RNG states: tensors and plain
values only, `load_trainer_state`), `meta.json` (format_version, position,
world size, config hash). Names, the marker and the link rules: `aleph.record.layout`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import random
import re
import reprlib
import shutil
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from aleph._faults import fault_point
from aleph._io import (
    DISK_FULL_ERRNOS,
    DurableWriter,
    NotRegularFile,
    check_free_space,
    check_record,
    disk_full_message,
    fsync_dir,
    open_regular,
    parse_json_bytes,
    read_bounded,
)
from aleph.errors import QuotaError, StoreError
from aleph.model.io import plain_state_dict, state_mismatch
from aleph.record import layout
from aleph.record.layout import COMPLETE, CORRUPT_TAG, FORMAT_VERSION, RunLayout
from aleph.train.optim import device_flags, restore_device_flags

FILES = layout.STATE_FILES


@dataclass(frozen=True)
class Position:
    """Where training stands: after `step` optimiser steps."""

    step: int
    epoch: int  # of the next batch (0-based)
    batch_in_epoch: int  # the next global batch's index in epoch `epoch`'s permutation
    samples_seen: int
    train_seconds: float = 0.0  # wall seconds spent training over all launches


def stream_seed(seed: int, rank: int, step: int) -> int:
    """The seed of rank `rank`'s random streams from step `step` on (distinct per rank)."""
    return (seed * 1_000_003 + rank * 7919 + step) % (2**32)


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """Every RNG this process draws from: python, numpy, torch CPU, and on a CUDA `device`
    that device's generator only (a state of every visible GPU could not be restored where
    fewer are visible). Tensors and plain values only: it loads with weights_only=True."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)),
                       "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
             "torch": torch.get_rng_state()}
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
        state["cuda_device"] = device.index
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | None = None,
                  derived_seed: int | None = None) -> str:
    """Restore a rank's RNGs; returns how the CUDA generator was set ("" off CUDA). A CPU-saved
    state on CUDA seeds it with `derived_seed` (stream_seed of seed, rank, step): left at the
    config seed, every rank would draw the same dropout masks."""
    random.setstate(state["python"])
    saved = state["numpy"]  # as rng_state stores it, back to np.random's tuple
    np.random.set_state((saved["kind"], saved["keys"].numpy().astype(np.uint32), saved["pos"],
                         saved["has_gauss"], saved["cached"]))
    torch.set_rng_state(state["torch"])
    if device is None or device.type != "cuda":
        return ""
    saved = state.get("cuda")
    if saved is not None:
        torch.cuda.set_rng_state(saved, device)
        return "restored"
    if derived_seed is None:
        raise ValueError("set_rng_state: the state has no CUDA generator for "
                         f"{device} and no derived_seed was given")
    with torch.cuda.device(device):
        torch.cuda.manual_seed(derived_seed)
    return "derived"


def latest(run_dir: Path) -> tuple[Path, dict] | None:
    """The newest complete checkpoint and its meta, or None (not verified: see find_resume)."""
    done = RunLayout(run_dir).complete_states()
    return (done[-1], read_meta(done[-1])) if done else None


_META_MAX = 1 << 20
_META_FIELDS = {"step": int, "epoch": int, "batch_in_epoch": int, "samples_seen": int,
                "world_size": int, "config_sha256": str}


def read_meta(state: Path) -> dict:
    """A state's meta.json: read bounded, no link followed, its format version checked
    (StoreError), then every field's type and its step against the directory (ValueError
    naming the field: a pulled state's meta is a stranger's JSON)."""
    file = Path(state) / "meta.json"
    meta = layout.check_version(file, parse_json_bytes(read_bounded(file, _META_MAX, follow=False)))
    check_record(meta, _META_FIELDS)
    seconds = meta.get("train_seconds")
    if type(seconds) not in (int, float) or not 0 <= seconds < float("inf"):
        raise ValueError(f"field 'train_seconds' is {seconds!r}, expected seconds >= 0")
    if meta["step"] != layout.step_of(Path(state).name):
        raise ValueError(f"records step {meta['step']}, the directory is {Path(state).name}")
    return meta


def save(run_dir: Path, model: torch.nn.Module, optimizer, scheduler, pos: Position,
         rng_states: list[dict], config_sha256: str, keep: int) -> Path:
    """Write one complete resume state atomically, at most `keep` complete ones left (rank 0).
    Serialised in memory first: too little disk is a QuotaError naming the file and bytes
    before anything is written (or mid-write), and the previous states stay untouched."""
    final = RunLayout(run_dir).state_dir(pos.step)
    tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
    trainer = io.BytesIO()
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": rng_states}, trainer)
    meta = {"format_version": FORMAT_VERSION, "world_size": len(rng_states),
            "config_sha256": config_sha256, **dataclasses.asdict(pos)}
    blobs = {"model.safetensors": safetensors.torch.save(plain_state_dict(model)),
             "trainer.pt": trainer.getbuffer(),
             "meta.json": (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()}
    need = sum(len(b) for b in blobs.values())
    final.parent.mkdir(parents=True, exist_ok=True)
    check_free_space(final, need, f"the resume state of step {pos.step} ({', '.join(FILES)})")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    files, current = {}, final  # `current`: the file being written, by its final name
    try:
        for name, data in blobs.items():
            current = final / name
            with DurableWriter.create(tmp / name, label=current, needed=need) as w:
                w.write(data)
                files[name] = w.finish()
        current = final
        if final.exists():  # an incomplete leftover of an earlier, killed save of this step
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(final.parent)
        # Prune before the marker: a kill at any point leaves at most `keep` complete states.
        prune(run_dir, keep - 1)
        fault_point("before-complete", pos.step)
        current = final / COMPLETE
        layout.write_marker(final, pos.step, files)  # last: the state now counts
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            said = e.strerror or ""  # the writers already name the file and the bytes
            msg = said if str(current) in said else disk_full_message(current, e, need)
            raise QuotaError(f"{msg}; the previous resume state is intact: free space and "
                             "relaunch") from None
        raise
    fault_point("after-complete", pos.step)
    return final


def prune(run_dir: Path, keep: int) -> list[str]:
    """Delete the oldest complete states beyond the newest `keep`; returns their names."""
    done = RunLayout(run_dir).complete_states()
    old = done[:-keep] if keep > 0 else done
    for path in old:
        shutil.rmtree(path)
    return [p.name for p in old]


def remove_incomplete(run_dir: Path, log=None) -> list[str]:
    """Delete leftovers of killed saves (a real `step-NNNNNNNN` without COMPLETE, a
    `step-NNNNNNNN.tmp-<pid>`); returns their names. Call under the run lock. Anything else
    (a user's `best-by-hand/`, a link, a corrupt state set aside) is left alone and named."""
    run = RunLayout(run_dir)
    removed, alone = [], []
    if not run.checkpoints.is_dir():
        return removed
    for p in sorted(run.checkpoints.iterdir()):
        state = run.is_state_dir(p)
        ours = (state and not os.path.lexists(p / COMPLETE)) or (
            layout.is_unfinished_save(p.name) and not p.is_symlink() and p.is_dir())
        if ours:
            shutil.rmtree(p)
            removed.append(p.name)
        elif not state and CORRUPT_TAG not in p.name:
            alone.append(p.name)
    if alone and log is not None:
        log(f"{run.checkpoints.relative_to(run.dir)}/: left alone (not written by the trainer): "
            f"{', '.join(alone)}")
    return removed


# --- verification -------------------------------------------------------------------------

def verify_state(path: Path) -> str | None:
    """What is wrong with a complete state against its COMPLETE marker (naming the file), or
    None when intact; a marker of another format version raises (layout.read_marker)."""
    path = Path(path)
    try:
        files = layout.read_marker(path)
    except ValueError as e:
        return str(e)
    for name in FILES:
        problem = _check_file(path / name, files[name])
        if problem:
            return f"{name}: {problem}"
    try:
        read_meta(path)
    except (OSError, ValueError) as e:
        return f"meta.json: {e}"
    return None


def _check_file(path: Path, rec: dict) -> str | None:
    """What is wrong with one state file against its marker entry; read through one
    descriptor, never a link or a FIFO, at most the recorded size plus one byte."""
    try:
        with os.fdopen(open_regular(path, follow=False), "rb") as f:
            size, h = os.fstat(f.fileno()).st_size, hashlib.sha256()
            left = size + 1 if size == rec["size"] else 0  # +1: a file still growing differs
            while left > 0 and (block := f.read(min(1 << 20, left))):
                h.update(block)
                left -= len(block)
            digest = h.hexdigest()
    except FileNotFoundError:
        return f"missing (the {COMPLETE} marker lists it)"
    except NotRegularFile as e:
        return f"{e.kind}, expected a regular file"
    except OSError as e:
        return f"unreadable ({e.strerror or type(e).__name__})"
    if size != rec["size"]:
        return f"{size:,} B, the {COMPLETE} marker records {rec['size']:,} B (truncated or overwritten)"
    if digest != rec["sha256"]:
        return (f"sha256 {digest[:16]}..., the {COMPLETE} marker records {rec['sha256'][:16]}... "
                "(contents changed after the save)")
    return None


def set_aside(path: Path) -> Path:
    """Rename a corrupt state to `<name>.corrupt-<UTC>` (kept for inspection, not counted)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}{CORRUPT_TAG}{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}{CORRUPT_TAG}{stamp}-{n}")
    os.rename(path, target)
    fsync_dir(path.parent)
    return target


def find_resume(run_dir: Path, log) -> tuple[Path, dict] | None:
    """The newest intact complete state and its meta, or None; each corrupt one is set aside
    with a line naming the file, and a loud line when none is intact."""
    run_dir = Path(run_dir)
    aside = []
    for path in reversed(RunLayout(run_dir).complete_states()):
        rel = path.relative_to(run_dir)
        problem = verify_state(path)
        if problem is None:
            return path, read_meta(path)
        moved = set_aside(path)
        aside.append(moved.name)
        log(f"resume: {rel}/{problem}; set aside as {moved.relative_to(run_dir)} "
            "(kept for inspection, no longer a resume state); trying the previous state")
    if aside:
        log(f"resume: WARNING: FRESH START from step 0: none of the {len(aside)} complete resume "
            f"state(s) is intact (set aside: {', '.join(aside)}); the run's earlier training "
            "is not carried over")
    return None


def load(path: Path, model: torch.nn.Module, optimizer,
         scheduler) -> tuple[Position, list[dict], dict]:
    """Load a complete state into model/optimiser/scheduler; returns position, RNG states, meta."""
    meta = read_meta(path)
    trainer = load_trainer_state(path)  # before anything is changed in the model
    try:
        state = safetensors.torch.load_file(str(path / "model.safetensors"))
    except Exception as e:  # SafetensorError for a bad header, OSError, ...
        raise StoreError(f"{path / 'model.safetensors'}: not a readable safetensors file "
                         f"({_SHORT.repr(str(e))[1:-1]})") from None
    problem = state_mismatch(model.state_dict(), state, 3)  # e.g. another layout of the model
    if problem:
        raise StoreError(f"{path / 'model.safetensors'}: does not match the model this config "
                         f"builds: {problem}")
    model.load_state_dict(state, strict=True)
    built = device_flags(optimizer)
    for what, target in (("optimizer", optimizer), ("scheduler", scheduler)):
        try:  # plain values that pass the unpickler can still be of the wrong shape
            target.load_state_dict(trainer[what])
        except (TypeError, ValueError, KeyError, IndexError, RuntimeError, AttributeError) as e:
            raise _refuse(path / "trainer.pt", f"{what}: {_SHORT.repr(str(e))[1:-1]}") from None
    restore_device_flags(optimizer, built)  # the fused kernel follows the device, not the state
    pos = Position(**{f.name: meta[f.name] for f in dataclasses.fields(Position)})
    return pos, trainer["rng"], meta


# --- trainer.pt: tensors and plain values only, through torch's weights-only unpickler ---

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
    """trainer.pt of a complete state through torch's weights-only unpickler: anything but
    tensors, plain containers and numbers is refused in one line naming the file (a pulled
    run's checksums prove nothing about what the file would execute)."""
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
        before = rng_state()  # each CPU generator tries the saved state, then gets its own back
        try:
            set_rng_state(rng)
        except (TypeError, ValueError, KeyError, IndexError, RuntimeError) as e:
            return f"rng[{rank}]: not a generator state ({_SHORT.repr(str(e))[1:-1]})"
        finally:
            set_rng_state(before)
    return None


