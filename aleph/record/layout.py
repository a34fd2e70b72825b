"""The run directory and its resume-state format, defined once: every name the trainer
writes under `runs/<name>/`, the step directories, the COMPLETE marker and the link rules.

    runs/<name>/
      config.json            the run's config (first launch; replaced until a resume state exists)
      manifest.json          launches, inputs, store, execution facts, end status
      metrics.json           the last step's figures and the carried-over totals
      run.lock               flock of the live launch (a duplicate exits 75)
      sync-state.json        what `aleph.sync` hashed and pushed (local, never synced)
      pulled.json            where `aleph runs pull` brought the run from (local, never synced)
      launches/<id>.log      one console log per launch (rank r > 0: <id>.rank<r>.log)
      launches/<id>.heartbeat.json, <id>.code.json
      checkpoints/step-NNNNNNNN/   resume states (model.safetensors, trainer.pt, meta.json;
                             COMPLETE marker last); step-NNNNNNNN.corrupt-<UTC>/ set aside
      weights/final/         final weights (model.safetensors + model_config.json)
      weights/step-NNNNNNNN/ periodic weights (weights_every_steps)
      tb/                    TensorBoard events
      tokenizer/             the run's own copy of its tokenizer
      eval.json              what `aleph eval` measured

Train writes it; eval, report, campaign and sync read it, all through `RunLayout`.
Format version: `config.json`, `manifest.json`, each state's `meta.json` and `COMPLETE` carry
`format_version` (FORMAT_VERSION); `check_version` refuses any other in one line.
Link rule: a resume state counts only as a real directory holding a regular `COMPLETE`
(lstat, never followed), for the trainer and for sync alike.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aleph._io import atomic_write_json, read_bounded
from aleph.errors import StoreError

CONFIG = "config.json"
MANIFEST = "manifest.json"
METRICS = "metrics.json"
EVAL = "eval.json"
LOCK = "run.lock"
SYNC_STATE = "sync-state.json"
PULLED = "pulled.json"
LAUNCHES = "launches"
HEARTBEAT_SUFFIX = ".heartbeat.json"
CODE_SUFFIX = ".code.json"
CHECKPOINTS = "checkpoints"
WEIGHTS = "weights"
FINAL = "final"
TB = "tb"
TOKENIZER = "tokenizer"
WEIGHTS_FILE = "model.safetensors"

FORMAT_VERSION = 1
"""The version of every format a run directory holds; nothing else is read."""
COMPLETE = "COMPLETE"
STATE_FILES = ("model.safetensors", "trainer.pt", "meta.json")
CORRUPT_TAG = ".corrupt-"
_STEP_NAME = re.compile(r"step-(\d{8})")
_TMP_NAME = re.compile(r"step-\d{8}\.tmp-\d+")  # a save in progress
_MARKER_MAX = 1 << 20


def step_name(step: int) -> str:
    """`step-NNNNNNNN`: the name of step `step`'s resume state and periodic weights."""
    return f"step-{step:08d}"


def step_of(name: str) -> int | None:
    """The step a `step-NNNNNNNN` name stands for; None for any other name."""
    m = _STEP_NAME.fullmatch(name)
    return int(m.group(1)) if m else None


def is_unfinished_save(name: str) -> bool:
    """`step-NNNNNNNN.tmp-<pid>`: the temporary directory of a save."""
    return _TMP_NAME.fullmatch(name) is not None


def check_version(path: Path, doc: Any) -> Any:
    """`doc` (a JSON file's content) when its `format_version` is FORMAT_VERSION; else one
    line naming the file, the version found and the one expected (StoreError, exit 2)."""
    found = doc.get("format_version") if isinstance(doc, dict) else None
    if type(found) is not int or found != FORMAT_VERSION:
        raise StoreError(f"{path}: format_version {found!r}, expected {FORMAT_VERSION} "
                         "(written by another version of aleph-e1; this one reads only its own)")
    return doc


def config_fields(path: Path, doc: Any) -> dict[str, Any]:
    """The fields of a run's config.json (`doc`): its format_version checked, then dropped."""
    fields = dict(check_version(path, doc))
    del fields["format_version"]
    return fields


def _lstat_is(path: Path, test) -> bool:
    """test(st_mode) of `path` itself (a link is never followed); False when it is missing."""
    try:
        return test(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def write_marker(state: Path, step: int, files: dict[str, dict]) -> None:
    """Write `state`'s COMPLETE marker atomically (last: the state counts from now on)."""
    atomic_write_json(Path(state) / COMPLETE,
                      {"format_version": FORMAT_VERSION, "step": step, "files": files})


def read_marker(state: Path) -> dict[str, dict]:
    """{file name: {sha256, size}} of `state`'s COMPLETE marker: the STATE_FILES and nothing
    else (a name beyond them, `../x` or `/dev/zero`, would lead the check outside the state).
    Another format version is a StoreError (check_version); an unreadable, malformed or
    other-step marker is a ValueError saying what is wrong (the state is damaged)."""
    path = Path(state) / COMPLETE
    try:
        marker = json.loads(read_bounded(path, _MARKER_MAX, follow=False))
    except OSError as e:
        raise ValueError(f"{COMPLETE}: unreadable ({e.strerror or type(e).__name__})") from None
    except ValueError:
        marker = None
    if not isinstance(marker, dict):  # a torn or hand-made file (ours are written atomically)
        raise ValueError(f"{COMPLETE}: not a valid marker (expected a JSON object with "
                         f"format_version {FORMAT_VERSION} and the sha256 and size of "
                         f"{', '.join(STATE_FILES)})")
    check_version(path, marker)
    files = marker.get("files")
    if not (isinstance(files, dict) and set(files) == set(STATE_FILES) and all(
            isinstance(r, dict) and isinstance(r.get("sha256"), str) and type(r.get("size")) is int
            for r in files.values())):
        raise ValueError(f"{COMPLETE}: not a valid marker (expected the sha256 and size of "
                         f"{', '.join(STATE_FILES)} and of nothing else)")
    if marker.get("step") != step_of(Path(state).name):
        raise ValueError(f"{COMPLETE}: records step {marker.get('step')!r}, the directory is "
                         f"{Path(state).name}")
    return files


def _under(name: str, parent: str = "dir") -> property:
    """A RunLayout path: `name` under the run directory (or under another of its paths)."""
    return property(lambda self: getattr(self, parent) / name)


@dataclass(frozen=True)
class RunLayout:
    """Paths of one run directory."""

    dir: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir))

    config = _under(CONFIG)
    manifest = _under(MANIFEST)
    metrics = _under(METRICS)
    eval = _under(EVAL)
    lock = _under(LOCK)
    sync_state = _under(SYNC_STATE)
    pulled = _under(PULLED)
    launches = _under(LAUNCHES)
    checkpoints = _under(CHECKPOINTS)
    weights = _under(WEIGHTS)
    final_weights = _under(FINAL, "weights")  # the last step's weights
    final_weights_file = _under(WEIGHTS_FILE, "final_weights")
    tb = _under(TB)
    tokenizer = _under(TOKENIZER)

    def launch_log(self, launch_id: str, rank: int = 0) -> Path:
        return self.launches / (f"{launch_id}.log" if rank == 0 else f"{launch_id}.rank{rank}.log")

    def heartbeat(self, launch_id: str) -> Path:
        return self.launches / f"{launch_id}{HEARTBEAT_SUFFIX}"

    def code_record(self, launch_id: str) -> Path:
        """launches/<id>.code.json: the functions of aleph/ the launch executed."""
        return self.launches / f"{launch_id}{CODE_SUFFIX}"

    def state_dir(self, step: int) -> Path:
        """checkpoints/step-NNNNNNNN/: step `step`'s resume state."""
        return self.checkpoints / step_name(step)

    def complete_states(self) -> list[Path]:
        """Resume states that count, oldest first: real directories named step-NNNNNNNN
        holding a regular COMPLETE (a link is never a state; set-aside ones excluded).
        Not verified against the marker."""
        root = self.checkpoints
        if not root.is_dir():
            return []
        return sorted(p for p in root.iterdir() if step_of(p.name) is not None
                      and _lstat_is(p, stat.S_ISDIR) and _lstat_is(p / COMPLETE, stat.S_ISREG))

    def is_state_dir(self, path: Path) -> bool:
        """Whether `path` is a real directory named step-NNNNNNNN (complete or not)."""
        return step_of(Path(path).name) is not None and _lstat_is(path, stat.S_ISDIR)

    def step_weights(self, step: int) -> Path:
        return self.weights / step_name(step)
