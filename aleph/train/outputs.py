"""What a run leaves behind (rank 0 only): manifest.json, metrics.json, TensorBoard events.

Every JSON file is rewritten atomically, so a reader (or a crash) sees the old version or
the new one. The manifest accumulates one entry per launch; an entry left 'running' by a
launch that died without recording its end (SIGKILL, OOM kill) is marked 'lost' by the
next launch, which can only start once the dead one's lock is gone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from aleph._io import atomic_write_json, read_json
from aleph.train.identity import code_revision, hostname, source_sha256, utc_now

# Launch statuses in manifest.json: 'running' while the launch lives; then 'complete' (all
# steps done), 'stopped' (SIGTERM/SIGINT: exit 0, resumable), 'failed' (an error, with its
# exit status) or 'lost' (set by a later launch for one that died without recording its end).
RUNNING, COMPLETE, STOPPED, FAILED, LOST = "running", "complete", "stopped", "failed", "lost"
STATUSES = (RUNNING, COMPLETE, STOPPED, FAILED, LOST)
# Note of a launch that found the run already finished and trained nothing (not a resume).
NOTHING_TO_TRAIN = "already complete"

MANIFEST = "manifest.json"
METRICS = "metrics.json"
CONFIG = "config.json"
TB_DIR = "tb"


def environment_summary() -> dict[str, Any]:
    """`aleph env check`'s summary; a clear marker instead if it cannot be produced."""
    try:
        from aleph.env.check import environment_summary as summary
    except ImportError as e:
        return {"error": f"aleph.env.check unavailable: {e}"}
    return summary()


class Manifest:
    """manifest.json of one run directory."""

    def __init__(self, run_dir: Path, run_id: str, arm: str, seed: int) -> None:
        self.path = Path(run_dir) / MANIFEST
        if self.path.is_file():
            self.data = read_json(self.path)
        else:
            self.data = {"run_id": run_id, "arm": arm, "seed": seed, "launches": []}
        for launch in self.data["launches"]:
            if launch.get("status") == RUNNING:
                launch["status"] = LOST
                launch["note"] = "ended without recording its end (killed: SIGKILL, OOM or host loss)"

    def start_launch(self, launch_id: str, log: str, world_size: int) -> None:
        self.data["launches"].append({
            "launch_id": launch_id, "start": utc_now(), "end": None, "exit_status": None,
            "status": RUNNING, "host": hostname(), "pid": os.getpid(), "log": log,
            "world_size": world_size,
        })
        self.data["code_revision"] = code_revision()
        self.data["source_sha256"] = source_sha256()
        self.data["environment"] = environment_summary()
        self.write()

    def set_store(self, store_info: dict[str, Any]) -> None:
        self.data["target_store"] = store_info
        self.write()

    def end_launch(self, exit_status: int, status: str, note: str = "") -> None:
        if status not in STATUSES:  # programming error: readers (aleph runs diff) key on these
            raise ValueError(f"launch status {status!r}: expected one of {', '.join(STATUSES)}")
        launch = self.data["launches"][-1]
        launch.update({"end": utc_now(), "exit_status": exit_status, "status": status})
        if note:
            launch["note"] = note
        self.write()

    def write(self) -> None:
        atomic_write_json(self.path, self.data)


def write_metrics(run_dir: Path, metrics: dict[str, Any]) -> None:
    atomic_write_json(Path(run_dir) / METRICS, {**metrics, "updated": utc_now()})


class Scalars:
    """TensorBoard writer; one event file per launch in tb/.

    purge_step drops events a killed launch wrote after its last checkpoint, so resumed
    curves have no duplicated steps. It is set on a fresh start too (first_step 1): a
    launch killed before its first resume state leaves steps 1..k that the next launch,
    starting over from step 0, writes again.
    """

    def __init__(self, run_dir: Path, first_step: int) -> None:
        """`first_step`: the first step this launch writes (resume step + 1)."""
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(log_dir=str(Path(run_dir) / TB_DIR),
                                purge_step=first_step)

    def write(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self._w.add_scalar(tag, value, step)

    def flush(self) -> None:
        self._w.flush()

    def close(self) -> None:
        self._w.close()
