"""What a run leaves behind (rank 0 only): manifest.json, the executed-code record, TensorBoard
events (metrics.json: progress.py).

JSON files are rewritten atomically. The manifest holds one entry per launch; one left
'running' by a launch that died (SIGKILL, OOM kill) is marked 'lost' by the next launch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from aleph._io import atomic_write_json, read_json, short_repr
from aleph.errors import StoreError
from aleph.record import heartbeat, layout, provenance
from aleph.record.launch import ACTIONS, LOST, NOTHING, RESUMED, RUNNING, STATUSES, TRAINED
from aleph.record.layout import RunLayout
from aleph.train.identity import hostname, utc_now


class Manifest:
    """manifest.json of one run directory (entry schema: aleph.record.launch); each launch
    writes only its own entry of `launches[]`; another format_version is refused."""

    def __init__(self, run_dir: Path, run_id: str, arm: str, seed: int) -> None:
        self.path = RunLayout(run_dir).manifest
        if self.path.is_file():
            try:  # a pulled run's manifest is a stranger's JSON
                self.data = layout.check_version(self.path, read_json(self.path))
            except (OSError, ValueError) as e:
                raise StoreError(f"{self.path}: unreadable ({e})") from None
            found = self.data.get("launches")
            if not (isinstance(found, list) and all(isinstance(x, dict) for x in found)):
                raise StoreError(f"{self.path}: field 'launches' is {short_repr(found, 80)}, "
                                 "expected a list of launch records (objects)")
        else:
            self.data = {"format_version": layout.FORMAT_VERSION, "run_id": run_id, "arm": arm,
                         "seed": seed, "launches": []}
        self.lost: list[str] = []  # one line per launch found lost, for the launch log
        for i, launch in enumerate(self.data["launches"], start=1):
            if launch.get("status") == RUNNING:
                self._mark_lost(i, launch)

    def _mark_lost(self, i: int, launch: dict[str, Any]) -> None:
        """A launch that died without recording its end: its last heartbeat, and the cgroup
        OOM killer named when the evidence says so (aleph.record.heartbeat)."""
        lid = str(launch.get("launch_id"))
        found = heartbeat.diagnose_lost(heartbeat.read_heartbeat(RunLayout(self.path.parent), lid))
        launch["status"] = LOST
        launch["note"] = found["diagnosis"]
        launch["lost"] = found
        hb = found["last_heartbeat"] or {}
        steps = launch.setdefault("steps", {"from": None, "to": None})
        if isinstance(hb.get("step"), int):
            steps["to"] = hb["step"]
        if steps.get("from") is None and isinstance(hb.get("step_from"), int):
            steps["from"] = hb["step_from"]
        start, to = steps.get("from"), steps.get("to")
        if isinstance(start, int) and isinstance(to, int) and to > start:
            launch["action"] = RESUMED if start else TRAINED
        elif hb:  # alive until its last heartbeat without finishing a step
            launch["action"] = NOTHING
        # else: no heartbeat (a launch written before heartbeats): its effect is unknown
        self.lost.append(f"launch {i} ({lid}) lost: {found['diagnosis']}")

    def start_launch(self, launch_id: str, log: str, world_size: int,
                     code: dict[str, Any] | None = None) -> None:
        """Append this launch's entry with what it executes and on what. `code`: the
        launch's {revision, dirty, source_sha256} (from the snapshot its tracer took)."""
        env = provenance.environment_summary()
        code = code or provenance.code_record()
        self.data["launches"].append({
            "launch_id": launch_id, "start": utc_now(), "end": None, "exit_status": None,
            "status": RUNNING, "host": hostname(), "pid": os.getpid(), "log": log,
            "world_size": world_size, "code": code, "environment": env,
            "envelope": provenance.envelope(env), "steps": {"from": None, "to": None},
        })
        self.write()

    @property
    def launch(self) -> dict[str, Any]:
        """This launch's own entry (the last one)."""
        return self.data["launches"][-1]

    def record(self, **fields: Any) -> None:
        """Set fields of this launch's own entry (e.g. execution, steps) and write."""
        self.launch.update(fields)
        self.write()

    def set_store(self, store_info: dict[str, Any]) -> None:
        self.data["target_store"] = store_info
        self.write()

    def trained_inputs(self) -> dict[str, Any] | None:
        """The stores the run trained on so far, {"from", "target_store", "token_store"}: the
        newest earlier launch's `inputs` (`record_inputs`), or None."""
        for launch in reversed(self.data["launches"][:-1]):
            inputs = launch.get("inputs")
            if isinstance(inputs, dict):
                return {"from": f"launch {launch.get('launch_id')}", **inputs}
        return None

    def record_inputs(self, inputs: dict[str, Any], allowed: dict[str, Any] | None = None) -> None:
        """This launch's stores in its own entry and, when allow_input_change let a change
        through, what changed."""
        self.record(inputs=inputs, **({"input_change_allowed": allowed} if allowed else {}))

    def end_launch(self, exit_status: int, status: str, note: str = "",
                   action: str | None = None, step_to: int | None = None) -> None:
        if status not in STATUSES:  # programming error: readers (aleph runs diff) key on these
            raise ValueError(f"launch status {status!r}: expected one of {', '.join(STATUSES)}")
        if action is not None and action not in ACTIONS:
            raise ValueError(f"launch action {action!r}: expected one of {', '.join(ACTIONS)}")
        launch = self.launch
        launch.update({"end": utc_now(), "exit_status": exit_status, "status": status})
        launch.update({k: v for k, v in (("note", note), ("action", action)) if v})
        if step_to is not None:
            launch.setdefault("steps", {"from": None, "to": None})["to"] = step_to
        self.write()

    def write(self) -> None:
        atomic_write_json(self.path, self.data)


def write_executed(manifest: Manifest, tracer, launch_id: str) -> None:
    """launches/<launch id>.code.json: the functions of aleph/ this launch executed
    (aleph.record.fingerprint), referenced from its manifest entry."""
    run = RunLayout(manifest.path.parent)
    path = run.code_record(launch_id)
    rel = path.relative_to(run.dir).as_posix()
    rec = tracer.record()
    try:
        atomic_write_json(path, rec)
    except OSError:  # the record is evidence, not a reason to fail the launch
        return
    manifest.launch["code"]["executed"] = {
        "file": rel, "functions": rec["functions"], "window": rec["window"],
        "traced_seconds": rec["traced_seconds"], "unavailable": rec["unavailable"]}
    manifest.write()


class Scalars:
    """TensorBoard writer; one event file per launch in tb/. `first_step` (resume step + 1,
    so 1 on a fresh start too) is the purge step: events a killed launch wrote after its
    last resume state are dropped, so the curves have no duplicated steps."""

    def __init__(self, run_dir: Path, first_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(log_dir=str(RunLayout(run_dir).tb), purge_step=first_step)
        self.flush, self.close = self._w.flush, self._w.close

    def write(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self._w.add_scalar(tag, value, step)
