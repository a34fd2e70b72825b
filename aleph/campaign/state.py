"""The campaign's state: `<work root>/campaigns/<name>/campaign.json`, rewritten atomically.

It holds the campaign's identity (Spec.identity), the queue (run ids in launch order), each
run's status and every launch the campaign made of it (device, pid and its start time,
exit status, outcome, log), the evaluations, and one entry per campaign process.

Run statuses: queued (to launch), running (a launch of ours is in flight), locked (another
launch holds the run's lock: waited for), complete, failed (retries used up, or refused).
Launch outcomes: running, complete, stopped, failed, locked, lost (it ended while no
campaign process watched it, how unknown).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from aleph._io import atomic_write_json, read_json, work_root
from aleph.campaign.spec import Spec
from aleph.errors import ConfigError, DataError
from aleph.train.identity import hostname, utc_now

SCHEMA = 1
STATE_FILE = "campaign.json"
QUEUED, RUNNING, LOCKED, COMPLETE, FAILED = "queued", "running", "locked", "complete", "failed"
RUN_STATUSES = (QUEUED, RUNNING, LOCKED, COMPLETE, FAILED)
LAUNCH_LOGS = "launches"
"""<campaign>/launches/<run>.<n>.log: the console of each launch the campaign started."""
OUTCOMES = ("running", "complete", "stopped", "failed", "locked", "lost")


def campaign_dir(name: str) -> Path:
    return work_root() / "campaigns" / name


class State:
    """campaign.json of one campaign; `save()` after every change."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path, self.data = path, data

    @classmethod
    def open(cls, path: Path, spec: Spec) -> State:
        """Read the state of `spec`'s campaign, or start a new one (nothing written yet)."""
        path = Path(path)
        if not path.is_file():
            runs = {rid: {"arm": arm, "seed": seed, "status": QUEUED, "failures": 0,
                          "note": "", "launches": []} for rid, arm, seed in spec.runs()}
            return cls(path, {"schema": SCHEMA, "id": uuid.uuid4().hex, "name": spec.name,
                              "spec": spec.identity(), "created": utc_now(),
                              "queue": [rid for rid, _, _ in spec.runs()], "runs": runs,
                              "processes": [], "finish": None})
        try:
            data = read_json(path)
        except ValueError as e:  # bad JSON, not UTF-8, nested too deeply
            raise DataError(f"{path}: not valid JSON (line {e.lineno}: {e.msg}); it is written "
                            "atomically, so it was edited by hand: restore it or remove the "
                            "campaign directory to start over") from None
        state = cls(path, data)
        state._validate(spec)
        return state

    def _validate(self, spec: Spec) -> None:
        d, p = self.data, self.path
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            got = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise DataError(f"{p}: field 'schema' is {got!r}, expected {SCHEMA}")
        for key, kind in (("id", str), ("spec", dict), ("queue", list), ("runs", dict),
                          ("processes", list)):
            if not isinstance(d.get(key), kind):
                raise DataError(f"{p}: field {key!r} missing or not a {kind.__name__}")
        for key, value in spec.identity().items():
            if d["spec"].get(key) != value:
                raise ConfigError(
                    f"{p}: this campaign was started with {key} {d['spec'].get(key)!r}, this "
                    f"command gives {value!r}; rerun with the same {key}, or start another "
                    "campaign with --name")
        want = [rid for rid, _, _ in spec.runs()]
        if d["queue"] != want or set(d["runs"]) != set(want):
            raise DataError(f"{p}: field 'queue' lists {d['queue']}, expected {want}")
        for rid, run in d["runs"].items():
            if not isinstance(run, dict) or run.get("status") not in RUN_STATUSES:
                got = run.get("status") if isinstance(run, dict) else run
                raise DataError(f"{p}: field 'runs.{rid}.status' is {got!r}, expected one of "
                                f"{', '.join(RUN_STATUSES)}")
            if not isinstance(run.get("launches"), list) or not isinstance(run.get("failures"), int):
                raise DataError(f"{p}: field 'runs.{rid}.launches' or 'failures' is malformed")
            for i, launch in enumerate(run["launches"]):
                if not isinstance(launch, dict) or launch.get("outcome") not in OUTCOMES:
                    raise DataError(f"{p}: field 'runs.{rid}.launches[{i}].outcome' is malformed")

    # --- access -------------------------------------------------------------------------
    @property
    def queue(self) -> list[str]:
        return list(self.data["queue"])

    def run(self, rid: str) -> dict[str, Any]:
        return self.data["runs"][rid]

    def with_status(self, *statuses: str) -> list[str]:
        return [rid for rid in self.queue if self.run(rid)["status"] in statuses]

    def save(self) -> None:
        self.data["updated"] = utc_now()
        atomic_write_json(self.path, self.data)

    # --- campaign processes -------------------------------------------------------------
    def begin_process(self, pid: int, devices: list[str], options: dict) -> list[str]:
        """Record this campaign process; returns a line per earlier one that died unrecorded."""
        lines = []
        for proc in self.data["processes"]:
            if proc.get("end") is None:
                proc["end"], proc["status"] = utc_now(), "lost"
                lines.append(f"campaign process {proc.get('pid')} on {proc.get('host')} (started "
                             f"{proc.get('start')}) ended without recording it (killed); "
                             "continuing where it stopped")
        self.data["processes"].append({"pid": pid, "host": hostname(), "start": utc_now(),
                                       "end": None, "status": "running", "devices": devices,
                                       "options": options})
        self.save()
        return lines

    def end_process(self, status: str) -> None:
        proc = self.data["processes"][-1]
        proc["end"], proc["status"] = utc_now(), status
        self.save()
