"""The heartbeat of a live launch, and what the next launch concludes when one vanished.

Rank 0 rewrites `launches/<launch id>.heartbeat.json` atomically every `heartbeat_seconds`
from a daemon thread: time, phase, step, RSS and peak RSS, and its memory cgroup (usage,
working set, limit, peak, OOM-kill counter). A launch the kernel killed cannot record its
end; the next launch marks it `lost`, says when and at which step it was last alive, and
"likely killed by the cgroup OOM killer" when the cgroup's counter (read again now) rose or
its working set was within 2% of the limit.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from aleph._io import atomic_write_json, read_json
from aleph.env.cgroup import memory_at, read_memory
from aleph.env.hostinfo import status_bytes
from aleph.record.layout import RunLayout

NEAR_LIMIT = 0.98  # a working set within 2% of the limit counts as at the limit


class LaunchMonitor:
    """The live state of one launch (phase, first and current step, set by the trainer as
    it goes), written with the memory figures every `interval_s`; `path` None: no file."""

    def __init__(self, path: Path | None, launch_id: str, interval_s: float = 5.0,
                 on_first_beat=None) -> None:
        self.path, self.launch_id, self.interval_s = path, launch_id, interval_s
        self.phase = "start"
        self.step_from: int | None = None  # the step the loop started from
        self.step: int | None = None  # the last step done
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_first_beat = on_first_beat  # e.g. a tracer that records the thread's code
        self.last: dict[str, Any] | None = None

    def snapshot(self) -> dict[str, Any]:
        mem = read_memory()
        return {"launch_id": self.launch_id, "pid": os.getpid(), "time": time.time(),
                "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "phase": self.phase, "step_from": self.step_from, "step": self.step,
                "rss_bytes": status_bytes("VmRSS"), "peak_rss_bytes": status_bytes("VmHWM"),
                "cgroup": mem.as_dict() if mem is not None else None}

    def beat(self) -> None:
        if self.path is None:
            return
        self.last = self.snapshot()
        with contextlib.suppress(OSError):  # a full disk must not kill training: next beat retries
            atomic_write_json(self.path, self.last)

    def start(self) -> LaunchMonitor:
        """First beat now (so even a launch killed at once leaves one), then the thread."""
        if self.path is None:
            return self
        self.beat()
        self._thread = threading.Thread(target=self._run, name="aleph-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        around = self._on_first_beat or contextlib.nullcontext  # the thread's first beat only
        while not self._stop.wait(self.interval_s):
            with around():
                self.beat()
            around = contextlib.nullcontext

    def stop(self, phase: str = "ended") -> None:
        """Last beat (phase 'ended') and the thread joined."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.phase = phase
        self.beat()


def read_heartbeat(run: RunLayout, launch_id: str) -> dict[str, Any] | None:
    """The last heartbeat of launch `launch_id` of a run (RunLayout.heartbeat), or None."""
    path = run.heartbeat(launch_id)
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _b(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def diagnose_lost(hb: dict[str, Any] | None) -> dict[str, Any]:
    """{diagnosis (one line), last_heartbeat, oom (evidence or None)} for a vanished launch."""
    if hb is None:
        return {"diagnosis": "ended without recording its end (killed: SIGKILL, OOM or host "
                "loss); it left no heartbeat", "last_heartbeat": None, "oom": None}
    step = hb.get("step")
    where = f"step {step}" if step is not None else f"phase {hb.get('phase')} (before the first step)"
    cg = hb.get("cgroup") if isinstance(hb.get("cgroup"), dict) else None
    last = (f"last heartbeat {hb.get('utc', '?')}: {where}, RSS {_b(hb.get('rss_bytes'))} B")
    if cg is not None:
        limit = (f"of limit {_b(cg['limit_bytes'])} B" if cg.get("limit_bytes")
                 else "B (no memory limit)")
        last += f", cgroup working set {_b(cg.get('working_set_bytes'))} {limit}"
    oom = _oom_evidence(cg)
    if oom is None:
        text = f"ended without recording its end (killed: SIGKILL, OOM or host loss); {last}"
    else:
        text = (f"likely killed by the cgroup OOM killer at {oom['at_bytes']:,} of "
                f"{oom['limit_bytes']:,} bytes ({oom['evidence']}); {last}")
    return {"diagnosis": text, "last_heartbeat": hb, "oom": oom}


def _oom_evidence(cg: dict | None) -> dict[str, Any] | None:
    """Why the memory cgroup's OOM killer is the likely cause, or None."""
    if not cg or not cg.get("path"):
        return None
    limit = cg.get("limit_bytes")
    ws = cg.get("working_set_bytes")
    now = memory_at(cg["path"], int(cg.get("version") or 1))
    before = cg.get("oom_kill")
    if now is not None and now.oom_kill is not None and before is not None and now.oom_kill > before:
        limit = limit or now.limit_bytes
        peak = now.peak_bytes if now.peak_bytes is not None else ws
        at = min(peak, limit) if (peak is not None and limit) else (peak or ws or 0)
        return {"evidence": f"oom_kill counter of memory cgroup {cg['path']} rose {before} -> "
                f"{now.oom_kill} since the last heartbeat", "at_bytes": at,
                "limit_bytes": limit or 0, "counter_before": before, "counter_now": now.oom_kill}
    if limit and ws is not None and ws >= NEAR_LIMIT * limit:
        return {"evidence": f"working set within {100 * (1 - NEAR_LIMIT):.0f}% of the limit at the "
                f"last heartbeat (memory cgroup {cg['path']})", "at_bytes": ws,
                "limit_bytes": limit, "counter_before": before,
                "counter_now": None if now is None else now.oom_kill}
    return None
