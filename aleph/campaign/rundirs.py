"""What a run directory says, for the campaign: complete or not, how a launch ended.

Read only: the trainer writes these files (docs/ARCHITECTURE.md, "Run directory").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aleph._io import read_json, sha256_file
from aleph.errors import EXIT_STOPPED, ConfigError, StoreError
from aleph.record import layout
from aleph.record.launch import COMPLETE, FAILED, STOPPED
from aleph.record.layout import RunLayout
from aleph.train.identity import run_dir_for

FINAL_WEIGHTS = RunLayout(".").final_weights_file.relative_to(".")
run_dir = run_dir_for  # a campaign run's directory is the trainer's own, from its config


def _manifest(rd: Path) -> dict[str, Any] | None:
    try:
        data = read_json(RunLayout(rd).manifest)
    except (OSError, ValueError):  # ValueError: bad JSON, not UTF-8, nested too deeply
        return None
    return data if isinstance(data, dict) else None


def is_complete(rd: Path) -> bool:
    """A launch recorded the run complete and its final weights exist."""
    man = _manifest(rd)
    if man is None or not (rd / FINAL_WEIGHTS).is_file():
        return False
    return any(isinstance(e, dict) and e.get("status") == COMPLETE
               for e in man.get("launches") or [])


def weights_sha256(rd: Path) -> str:
    return sha256_file(rd / FINAL_WEIGHTS)


def config_conflict(rd: Path, cfg) -> str | None:
    """Why a complete run directory is not this campaign's run (another config), or None."""
    from aleph.train.config import check_same_run

    path = RunLayout(rd).config
    try:
        saved = read_json(path)
    except (OSError, ValueError) as e:
        return f"{path}: unreadable ({e})"
    try:
        check_same_run(layout.config_fields(path, saved), cfg)
    except StoreError as e:  # another format version: one line naming the file
        return str(e)
    except ConfigError as e:
        return f"{rd} is complete with another config: {e}"
    return None


def launch_end(rd: Path, pid: int | None, host: str) -> tuple[str | None, int | None]:
    """(status, exit status) the trainer recorded for its launch with this pid on this host,
    or (None, None) when it recorded none (refused before the manifest, or never started)."""
    man = _manifest(rd)
    for e in reversed((man or {}).get("launches") or []):
        if isinstance(e, dict) and e.get("pid") == pid and e.get("host") == host:
            status, code = e.get("status"), e.get("exit_status")
            if status in (COMPLETE, STOPPED):  # the trainer's own exit status for either
                return status, EXIT_STOPPED if status == STOPPED else 0
            # running (died unrecorded) or lost: no exit status
            return status, code if status == FAILED and isinstance(code, int) else None
    return None, None


def trainer_logs(rd: Path) -> list[str]:
    """The trainer's own launch logs of a run (rank 0's: one per launch)."""
    d = RunLayout(rd).launches
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.glob("*.log") if ".rank" not in p.name)


def error_line(log: Path) -> str:
    """The one-line reason a launch ended: its `aleph train: error:` line, else the last line."""
    try:
        lines = [x.strip() for x in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return f"{log}: unreadable"
    lines = [x for x in lines if x]
    errors = [x for x in lines if x.startswith("aleph train: error:")]
    return (errors or lines or ["(no output)"])[-1]
