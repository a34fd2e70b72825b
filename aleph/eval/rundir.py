"""Reading the files of a run directory (layout in docs/ARCHITECTURE.md), with clear errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from aleph._io import read_json
from aleph.errors import DataError
from aleph.record.layout import (  # noqa: F401
    CONFIG,
    EVAL,
    LOCK,
    MANIFEST,
    METRICS,
    TB,
    TOKENIZER,
    WEIGHTS_FILE,
    RunLayout,
    check_version,
)

FINAL_WEIGHTS = Path(RunLayout(".").final_weights.relative_to("."))  # weights/final


def resolve_run(given: str | Path) -> Path:
    """A run as a user gives it: its directory (wins), or its name under <work root>/runs
    (e.g. `smoke/a2_dense-s0`); neither: returned as given, for require_run_dir to refuse."""
    from aleph._io import RUNS_DIR, work_root

    path = Path(given)
    if path.is_dir() or path.is_absolute():
        return path
    named = work_root() / RUNS_DIR / path
    return named if named.is_dir() else path


def require_run_dir(run_dir: str | Path) -> Path:
    run_dir = resolve_run(run_dir)
    if not run_dir.is_dir():
        raise DataError(f"{run_dir}: not a run directory (it does not exist, and is no run name "
                        "under <work root>/runs either; `aleph runs list` lists the runs)")
    return run_dir


def read_run_json(run_dir: str | Path, name: str, required: bool = True) -> dict[str, Any] | None:
    """Parse `run_dir/name` as a JSON object; missing optional files give None. config.json
    and manifest.json must be of this code's format_version (one line otherwise)."""
    path = Path(run_dir) / name
    if not os.path.lexists(path):  # a FIFO, link or directory there is refused by read_json
        if required:
            raise DataError(f"{path}: missing (is {run_dir} a run directory written by `aleph train`?)")
        return None
    try:
        data = read_json(path)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from e
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}); expected JSON") from e
    except ValueError:  # read_json's only other ValueError
        raise DataError(f"{path}: nested too deeply to parse; expected a JSON object") from None
    except OSError as e:  # too large, a link, a FIFO: its strerror says so
        raise DataError(f"{path}: {e.strerror or e}") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return check_version(path, data) if name in (CONFIG, MANIFEST) else data


def field(data: dict, dotted: str, source: str, default: Any = ..., kind: type | tuple = object):
    """data['a']['b'] for 'a.b'; a missing or mistyped field is an error naming `source`."""
    node: Any = data
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            if default is not ...:
                return default
            raise DataError(f"{source}: missing field {dotted!r}")
        node = node[key]
    if not isinstance(node, kind):
        raise DataError(f"{source}: field {dotted!r} has type {type(node).__name__}")
    return node


def run_label(run_dir: Path, manifest: dict | None) -> str:
    if manifest and isinstance(manifest.get("run_id"), str):
        return manifest["run_id"]
    return Path(run_dir).name


def manifest_targets(manifest: dict, source: str) -> dict:
    """The target store record (`target_store`) of a run's manifest."""
    return field(manifest, "target_store", source, kind=dict)


STATUSES = ("complete", "running", "stopped", "failed", "lost", "not started")


def lock_held(run_dir: Path) -> bool:
    """Whether a live launch holds `run.lock` (an flock the kernel drops when the process
    dies); probed with a shared non-blocking flock, so nothing is written or blocked."""
    import fcntl
    import os

    try:
        fd = os.open(Path(run_dir) / LOCK, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released as the descriptor closes
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def step_weights(run_dir: Path) -> list[Path]:
    """The run's saved `weights/step-NNNNNNNN` directories, oldest first."""
    d = RunLayout(run_dir).weights
    return sorted(p for p in d.glob("step-*") if (p / WEIGHTS_FILE).is_file()) if d.is_dir() else []


def run_state(run_dir: str | Path) -> dict[str, Any]:
    """What a run directory says about its training, read only: {status (STATUSES), step,
    total_steps, last_launch, launches, final_weights, evaluated (eval.json's weights)}.
    running: a live launch holds run.lock; complete: recorded so, with weights/final;
    otherwise the last launch's status, `lost` if it is marked running without the lock."""
    run_dir = Path(run_dir)
    manifest = read_run_json(run_dir, MANIFEST, required=False) or {}
    if not isinstance(manifest.get("launches") or [], list):
        raise DataError(f"{run_dir / MANIFEST}: field 'launches' is "
                        f"{type(manifest['launches']).__name__}, expected a list of launches")
    launches = [e for e in manifest.get("launches") or [] if isinstance(e, dict)]
    metrics = read_run_json(run_dir, METRICS, required=False) or {}
    final = (run_dir / FINAL_WEIGHTS / WEIGHTS_FILE).is_file()
    last = launches[-1] if launches else {}
    if lock_held(run_dir):
        status = "running"
    elif final and any(e.get("status") == "complete" for e in launches):
        status = "complete"
    elif not launches:
        status = "not started"
    else:
        status = last.get("status") if last.get("status") in STATUSES else "lost"
        status = "lost" if status == "running" else status  # its process holds no lock: died
    ev = read_run_json(run_dir, EVAL, required=False)
    steps = (last.get("steps") or {}) if isinstance(last.get("steps"), dict) else {}
    step = metrics.get("step") if isinstance(metrics.get("step"), int) else steps.get("to")
    return {
        "status": status, "step": step, "total_steps": metrics.get("total_steps"),
        "last_launch": {k: last.get(k) for k in ("launch_id", "start", "end", "status", "action")}
        if last else None,
        "launches": len(launches), "final_weights": final,
        "evaluated": (ev.get("weights") or {}) if isinstance(ev, dict) else None,
    }
