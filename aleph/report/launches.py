"""Launch history of a run: count, gaps, overlaps, failed or lost launches, log headers.

Each launch's log (`launches/<launch id>.log`) starts with its header; a log that does not
has lost its preamble or was written by someone else (the seed's a1-s1 log began with a
duplicate launch's bytes): the run's setup then has no witness, a caveat. Only launches
that trained steps the run kept can raise a caveat or a blocker; the others are counted
as information, never in the resume caveat.
"""

from __future__ import annotations

import datetime as _dt
from collections import Counter
from pathlib import Path

from aleph.errors import EXIT_STOPPED
from aleph.record.launch import (
    COMPLETE,
    NOOP,
    NOTHING,
    REFUSED,
    RESUMED,
    STATUSES,
    STOPPED,
    TRAINED,
    LaunchRecord,
    describe_lost,
    read_launches,
)

# The header is among the launch's first lines (aleph.train.trainer.build_trainer);
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
        head = [line for _ in range(HEADER_LINES) if (line := f.readline())]
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


def _status_findings(r: LaunchRecord, last_trained: bool, finished_later: bool,
                     status, code) -> list[tuple[str, str]]:
    """How a launch that trained ended: nothing for complete/0 or an ordinary stop before
    a later launch; else a caveat, or a blocker when the run did not finish after it."""
    last = last_trained and not finished_later
    name = r.label()
    if status not in STATUSES:
        text = (f"{name} has status {status!r}, which the trainer does not write "
                f"({', '.join(STATUSES)}): how it ended is unknown")
        return [("blocker", text + ": the run may not have finished")] if last else [("caveat", text)]
    if (status, code) == (COMPLETE, 0) or ((status, code) == (STOPPED, EXIT_STOPPED) and not last):
        return []
    ended = (f"{name} ended {status} with exit status {code}" if code is not None
             else f"{name} ended {status} (no exit status recorded)")
    if lost := describe_lost(r.entry):
        ended += f": {lost}"
    return [("blocker", ended + ": the run did not finish")] if last else [("caveat", ended)]


def _idle_finding(r: LaunchRecord) -> tuple[str, str]:
    """A launch that trained nothing the run kept: information only."""
    e = r.entry
    code = e.get("exit_status")
    how = f"{e.get('status')}" + (f", exit status {code}" if code is not None else "")
    note = describe_lost(e) or e.get("note") or ""
    return ("info", f"{r.label()}: {r.action if r.action != 'trained' else 'its steps were redone'}"
            f" ({how}{': ' + str(note) if note else ''}); trained nothing the run kept")


# How a launch that trained nothing the run kept is counted, by its action.
IDLE_WORDS = {NOOP: "found the run already complete", REFUSED: "refused before training",
              NOTHING: "ended before its first step", TRAINED: "had its steps redone",
              RESUMED: "had its steps redone"}


def _count_text(records: list[LaunchRecord]) -> str:
    """'3 launch(es); 1 trained nothing the run kept (1 refused before training)'."""
    idle = Counter(IDLE_WORDS[r.action] for r in records if not r.trained)
    text = f"{len(records)} launch(es)"
    if idle:
        kinds = ", ".join(f"{k} {words}" for words, k in idle.items())
        text += f"; {sum(idle.values())} trained nothing the run kept ({kinds})"
    return text


def check_launches(run_dir: Path, manifest: dict) -> list[tuple[str, str]]:
    """(level, text) findings about one run's launches."""
    records = read_launches(manifest)
    if not records:
        return [("caveat", "no launch recorded in manifest.json")]
    out: list[tuple[str, str]] = []
    n = len(records)
    trained = [r for r in records if r.trained]
    out.append(("info", _count_text(records)))
    if len(trained) > 1:
        out.append(("caveat", f"{len(trained)} launch(es) trained steps the run kept: resumed "
                    f"{len(trained) - 1} time(s)"))
    last_trained = trained[-1].index if trained else None
    prev_end, prev = None, None
    for r in records:
        e, i = r.entry, r.index
        start, end = _time(e.get("start")), _time(e.get("end"))
        if prev_end and start:
            gap = (start - prev_end).total_seconds()
            if gap < 0:
                both = r.trained and prev is not None and prev.trained
                out.append(("caveat" if both else "info",
                            f"launch {i} ({r.launch_id}) started {_duration(-gap)} before launch "
                            f"{i - 1} ended: overlapping launches (duplicate orchestrator?)"))
            else:
                out.append(("info", f"gap of {_duration(gap)} before launch {i} ({r.launch_id})"))
        if r.trained or (r.index == n and not trained):
            finished_later = any(x.entry.get("status") == COMPLETE for x in records[i:])
            out.extend(_status_findings(r, i == last_trained or not trained, finished_later,
                                        e.get("status"), e.get("exit_status")))
        else:
            out.append(_idle_finding(r))
        level = "caveat" if r.trained else "info"
        if not e.get("log"):
            out.append((level, f"launch {i} ({r.launch_id}) records no log"))
        elif problem := header_problem(Path(run_dir) / e["log"], r.launch_id):
            out.append((level, f"launch {i} ({r.launch_id}): {problem}"))
        prev_end, prev = end or prev_end, r
    return out
