"""Formats of earlier versions, read in one place; the rest of the trainer reads one format.

- a COMPLETE marker without checksums (the one line `step N`): accepted after a
  readability check (`check_legacy_state`), with a note in the log;
- a CUDA RNG state as the list of every visible device's state (get_rng_state_all):
  the rank's own device is entry `index` (`cuda_state_of_list`);
- a trainer.pt whose numpy RNG state is np.random.get_state()'s tuple with a uint32 array:
  loaded through an allow-list of exactly numpy's array reconstructors (`numpy_globals`),
  then written in the current format by the next save;
- the run layout before runs/<preset>/ (every preset's runs were runs/<arm>-s<seed>):
  named, with the `mv` that continues it (`older_layout`, `check_not_moved`).
Config fields added later are read with the value older runs ran with: config.ADDED_FIELDS.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np

from aleph._io import read_json
from aleph.errors import ConfigError
from aleph.record.layout import RunLayout
from aleph.train.config import TrainConfig
from aleph.train.identity import TOP_LEVEL_PRESET

LEGACY_MARKER = re.compile(r"step (\d+)\n?")


def check_legacy_state(path: Path, files: tuple[str, ...]) -> str | None:
    """Readability of a state whose marker has no checksums (written by an earlier trainer)."""
    from safetensors import safe_open

    for name in files:
        if not (path / name).is_file():
            return f"{name}: missing"
    try:
        read_json(path / "meta.json")
    except (OSError, ValueError) as e:
        return f"meta.json: unreadable ({e})"
    try:
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            f.keys()
    except Exception as e:  # SafetensorError: header or coverage (truncation)
        return f"model.safetensors: unreadable ({' '.join(str(e).split())})"
    try:
        with zipfile.ZipFile(path / "trainer.pt") as z:
            bad = z.testzip()  # CRC of every record: catches truncation and most bit flips
    except (OSError, zipfile.BadZipFile) as e:
        return f"trainer.pt: unreadable ({e})"
    if bad is not None:
        return f"trainer.pt: record {bad} fails its zip CRC"
    return None


def cuda_state_of_list(saved, index: int):
    """Device `index`'s state from the list earlier trainers saved; None when it holds none."""
    if isinstance(saved, (list, tuple)) and index < len(saved):
        return saved[index]
    return None


def numpy_globals() -> list:
    """Exactly what a trainer.pt of the earlier format needs beyond torch's own allow-list:
    its numpy RNG state was np.random.get_state(), a tuple holding a uint32 array, whose
    bytes pickle protocol 2 spells as a latin-1 `_codecs.encode` (a data transform)."""
    import _codecs

    from numpy.core.multiarray import _reconstruct

    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32)), _codecs.encode]


def older_layout(cfg: TrainConfig, run_dir: Path) -> Path | None:
    """The directory an older aleph-e1 gave this run, when it differs from `run_dir`:
    before runs/<preset>/, every preset's runs were runs/<arm>-s<seed>."""
    old = run_dir.parents[1] / f"{cfg.arm}-s{cfg.seed}" if cfg.preset != TOP_LEVEL_PRESET else None
    if old is None or run_dir.parent.name != cfg.preset or not RunLayout(old).config.is_file():
        return None
    try:
        return old if read_json(RunLayout(old).config).get("preset") == cfg.preset else None
    except ValueError:
        return None


def check_not_moved(run_dir: Path, saved: dict, cfg: TrainConfig) -> None:
    """An e1 launch finding another preset's run in its directory (the older layout put
    every preset there) says so and how to move it, instead of listing field mismatches."""
    was = saved.get("preset")
    if was and was != cfg.preset and run_dir.name == f"{cfg.arm}-s{cfg.seed}":
        raise ConfigError(
            f"{run_dir} holds a {was}-preset run, not an {cfg.preset} one (an older aleph-e1 "
            f"put every preset's runs there; they now live under runs/{was}/): move it with "
            f"`mv {run_dir} {run_dir.parent / was / run_dir.name}` and relaunch, or give this "
            "run another name with --name")


