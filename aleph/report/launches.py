"""Launch history of a run: count, gaps, overlaps, failed or lost launches, log headers.

Each launch appends to its own log (`launches/<launch id>.log`), every line tagged with
the launch id, and starts with a header (launch id, allocator cap, VRAM probe, config
echo, resume line). A log whose first line is not that launch's header has lost its
preamble, or was written by someone else (the seed's a1-s1 log began with 7,195 bytes of
a duplicate launch): the run's own setup then has no witness, which is a caveat.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from aleph.train.outputs import COMPLETE, NOTHING_TO_TRAIN, STATUSES, STOPPED

# The header is among the launch's first lines (aleph.train.session.Session.header);
# each item is a message that starts with its marker. Lines read `[<tag>] <UTC> <message>`.
HEADER_LINES = 12
HEADER_MARKERS = {
    "launch id": "launch {launch_id}",
    "allocator cap": "allocator cap:",
    "VRAM probe": "VRAM probe:",
    "config echo": "config:",
    "resume line": "resume:",
}


def _time(value) -> _dt.datetime | None:
    if isinstance(value, int | float):
        return _dt.datetime.fromtimestamp(value, _dt.UTC)
    if isinstance(value, str):
        try:
            t = _dt.datetime.fromisoformat(value)
        except ValueError:
            return None
        return t if t.tzinfo else t.replace(tzinfo=_dt.UTC)
    return None


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}h{rest // 60:02d}m{rest % 60:02d}s"


def _message(line: str) -> str:
    """The message of a tagged log line: what follows `[<tag>] <UTC timestamp> `."""
    parts = line.rstrip("\n").split(" ", 2)
    return parts[2] if len(parts) == 3 else ""


def header_problem(log: Path, launch_id: str) -> str | None:
    """None when `log` starts with `launch_id`'s header, else what is wrong."""
    if not log.is_file():
        return f"log {log.name} is missing"
    with open(log, encoding="utf-8", errors="replace") as f:
        head = [f.readline() for _ in range(HEADER_LINES)]
    head = [line for line in head if line]
    if not head:
        return f"log {log.name} is empty"
    if not head[0].startswith(f"[{launch_id}] "):
        return (f"log {log.name} does not start with this launch's lines (first line: "
                f"{head[0].strip()[:80]!r}): its preamble has no witness")
    own = [_message(line) for line in head if line.startswith(f"[{launch_id}] ")]
    missing = [name for name, marker in HEADER_MARKERS.items()
               if not any(m.startswith(marker.format(launch_id=launch_id)) for m in own)]
    if missing:
        return f"log {log.name} lacks header line(s): {', '.join(missing)}"
    return None


def _status_findings(i: int, n: int, lid: str, status, code) -> list[tuple[str, str]]:
    """How launch i of n ended, judged by the trainer's statuses (aleph.train.outputs).

    complete/exit 0: nothing to say. stopped/exit 0 before a later launch: an ordinary
    resume (the launch count names it). failed, lost, running, or a non-zero exit status:
    a caveat, a blocker when it is the last launch; so is a last launch that stopped: the
    run did not finish. A status the trainer never writes is a caveat naming it.
    """
    last = i == n
    if status not in STATUSES:
        text = (f"launch {i} ({lid}) has status {status!r}, which the trainer does not write "
                f"({', '.join(STATUSES)}): how it ended is unknown")
        return [("blocker", text + ": the run may not have finished")] if last else [("caveat", text)]
    if status in (COMPLETE, STOPPED) and code == 0 and (status == COMPLETE or not last):
        return []
    ended = (f"launch {i} ({lid}) ended {status} with exit status {code}" if code is not None
             else f"launch {i} ({lid}) ended {status} (no exit status recorded)")
    return [("blocker", ended + ": the run did not finish")] if last else [("caveat", ended)]


def check_launches(run_dir: Path, manifest: dict) -> list[tuple[str, str]]:
    """(level, text) findings about one run's launches."""
    entries = manifest.get("launches") or []
    if not entries:
        return [("caveat", "no launch recorded in manifest.json")]
    out: list[tuple[str, str]] = []
    n = len(entries)
    # Later launches continue the run, except those that found it finished and trained nothing.
    idle = sum(1 for e in entries[1:] if e.get("note") == NOTHING_TO_TRAIN)
    resumes = n - 1 - idle
    text = f"{n} launch(es)" + (f": resumed {resumes} time(s)" if resumes else "")
    if idle:
        text += f"; {idle} found the run already complete and trained nothing"
    out.append(("caveat" if resumes else "info", text))
    prev_end = None
    for i, e in enumerate(entries, start=1):
        lid = str(e.get("launch_id", f"#{i}"))
        start, end = _time(e.get("start")), _time(e.get("end"))
        if prev_end and start:
            gap = (start - prev_end).total_seconds()
            if gap < 0:
                out.append(("caveat", f"launch {i} ({lid}) started {_duration(-gap)} before launch "
                            f"{i - 1} ended: overlapping launches (duplicate orchestrator?)"))
            else:
                out.append(("info", f"gap of {_duration(gap)} before launch {i} ({lid})"))
        out.extend(_status_findings(i, n, lid, e.get("status"), e.get("exit_status")))
        if e.get("log"):
            problem = header_problem(Path(run_dir) / e["log"], lid)
            if problem:
                out.append(("caveat", f"launch {i} ({lid}): {problem}"))
        else:
            out.append(("caveat", f"launch {i} ({lid}) records no log"))
        prev_end = end or prev_end
    return out
