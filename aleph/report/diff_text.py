"""Text and JSON forms of a RunDiff (aleph.report.diff)."""

from __future__ import annotations

import dataclasses

from aleph.report.diff import RunDiff

SECTIONS = ("environment", "envelope", "execution", "code", "config", "targets", "launches", "vs E1")
MARK = {"same": "  same   ", "info": "  info   ", "caveat": "  CAVEAT ", "blocker": "  BLOCKER"}


def format_diff(d: RunDiff, patch: bool = False, max_hunks: int = 40) -> str:
    lines = [f"runs diff   A = {d.a}   B = {d.b}", ""]
    for section in SECTIONS:
        found = [f for f in d.findings if f.section == section]
        if not found:
            continue
        lines.append(f"[{section}]")
        lines += [f"{MARK[f.level]} {f.text}" for f in found]
        if section == "code" and d.code_diff is not None:
            lines += _hunks(d, patch, max_hunks)
        lines.append("")
    lines.append(f"verdict: {d.verdict.upper()}")
    for i, text in enumerate(d.blockers, start=1):
        lines.append(f"  blocker {i}: {text}")
    for i, text in enumerate(d.caveats, start=1):
        lines.append(f"  caveat {i}: {text}")
    return "\n".join(lines) + "\n"


def _hunks(d: RunDiff, patch: bool, max_hunks: int) -> list[str]:
    if patch:
        return ["", *d.code_diff.patch.splitlines()]
    out, shown = [], 0
    for f in d.code_diff.files:
        for i, h in enumerate(f.hunks):
            if shown == max_hunks:
                out.append("           ... more hunks: rerun with --patch for the full diff")
                return out
            note = f"  [{f.notes[i]}]" if i < len(f.notes) else ""
            out.append(f"           {f.path} {h}{note}")
            shown += 1
    return out


def as_json(d: RunDiff) -> dict:
    return {
        "a": d.a, "b": d.b, "verdict": d.verdict, "blockers": d.blockers, "caveats": d.caveats,
        "findings": [dataclasses.asdict(f) for f in d.findings],
        "code_diff": None if d.code_diff is None else {
            "rev_a": d.code_diff.rev_a, "rev_b": d.code_diff.rev_b,
            "files": [dataclasses.asdict(f) for f in d.code_diff.files],
            "patch": d.code_diff.patch,
        },
    }
