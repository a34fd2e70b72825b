"""Resume state: written to a temporary directory, fsynced, renamed, COMPLETE marker last.

A directory `checkpoints/step-NNNNNNNN/` counts only once `COMPLETE` exists in it, so a
crash (or SIGKILL) mid-save leaves the previous complete state as the resume point. At
least two complete states are kept. Contents:
- `model.safetensors` the uncompiled model's weights;
- `trainer.pt` optimiser and scheduler state dicts, RNG states of every rank;
- `meta.json` step, samples seen, data position (epoch, batch index within the epoch's
  permutation, which derives from (seed, epoch) so it is not stored), world size, config hash.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from aleph._io import atomic_write_json, atomic_write_text, fsync_dir, read_json
from aleph.errors import StoreError

CKPT_DIR = "checkpoints"
COMPLETE = "COMPLETE"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Position:
    """Where training stands: after `step` optimiser steps."""

    step: int
    epoch: int
    """Epoch of the next batch (0-based)."""
    batch_in_epoch: int
    """Index of the next global batch within epoch `epoch`'s permutation."""
    samples_seen: int
    train_seconds: float = 0.0
    """Wall seconds spent training over all launches up to this point."""


def rng_state() -> dict[str, Any]:
    """Every RNG this process draws from: python, numpy, torch CPU, and CUDA when present."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CKPT_DIR / f"step-{step:08d}"


def complete_steps(run_dir: Path) -> list[Path]:
    """Complete checkpoint directories, oldest first."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    dirs = [p for p in root.iterdir()
            if p.is_dir() and p.name.startswith("step-") and (p / COMPLETE).is_file()]
    return sorted(dirs, key=lambda p: p.name)


def latest(run_dir: Path) -> tuple[Path, dict] | None:
    """The newest complete checkpoint and its meta, or None for a fresh start."""
    done = complete_steps(run_dir)
    if not done:
        return None
    path = done[-1]
    return path, read_json(path / "meta.json")


def save(run_dir: Path, model: torch.nn.Module, optimizer, scheduler, pos: Position,
         rng_states: list[dict], config_sha256: str, keep: int) -> Path:
    """Write one complete resume state atomically; prune to the newest `keep`. Rank 0 only."""
    final = step_dir(run_dir, pos.step)
    tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    plain = getattr(model, "_orig_mod", model)
    weights = {k: v.detach().cpu().contiguous() for k, v in plain.state_dict().items()}
    safetensors.torch.save_file(weights, str(tmp / "model.safetensors"))
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": rng_states}, tmp / "trainer.pt")
    meta = {"format_version": FORMAT_VERSION, "world_size": len(rng_states),
            "config_sha256": config_sha256, **dataclasses.asdict(pos)}
    atomic_write_json(tmp / "meta.json", meta)
    for name in ("model.safetensors", "trainer.pt"):
        with open(tmp / name, "rb") as f:
            os.fsync(f.fileno())
    if final.exists():  # an incomplete leftover of an earlier, killed save of this step
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    atomic_write_text(final / COMPLETE, f"step {pos.step}\n")  # last: the state now counts
    _prune(run_dir, keep)
    return final


def _prune(run_dir: Path, keep: int) -> None:
    done = complete_steps(run_dir)
    for old in done[:-keep]:
        shutil.rmtree(old)


def remove_incomplete(run_dir: Path) -> list[str]:
    """Delete leftovers of killed saves (no COMPLETE marker). Call under the run lock."""
    root = Path(run_dir) / CKPT_DIR
    removed = []
    if root.is_dir():
        for p in sorted(root.iterdir()):
            if p.is_dir() and not (p / COMPLETE).is_file():
                shutil.rmtree(p)
                removed.append(p.name)
    return removed


def load(path: Path, model: torch.nn.Module, optimizer, scheduler) -> tuple[Position, list[dict], dict]:
    """Load a complete state into model/optimiser/scheduler; returns position, RNG states, meta."""
    meta = read_json(path / "meta.json")
    if meta.get("format_version") != FORMAT_VERSION:
        raise StoreError(f"{path}/meta.json: format_version {meta.get('format_version')!r}, "
                         f"this trainer reads {FORMAT_VERSION}")
    plain = getattr(model, "_orig_mod", model)
    state = safetensors.torch.load_file(str(path / "model.safetensors"))
    plain.load_state_dict(state, strict=True)
    # weights_only=False: the file holds RNG tuples and was written by this trainer, under the
    # run lock, in the run's own directory; it is not a downloaded artefact.
    trainer = torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(trainer["optimizer"])
    scheduler.load_state_dict(trainer["scheduler"])
    fields = ("step", "epoch", "batch_in_epoch", "samples_seen", "train_seconds")
    pos = Position(**{k: meta[k] for k in fields})
    return pos, trainer["rng"], meta
