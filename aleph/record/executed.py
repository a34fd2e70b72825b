"""A launch's executed-code record read back, and a changed hunk judged against what ran."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aleph._io import read_json_bounded
from aleph.record.fingerprint import SCHEMA, Scopes
from aleph.record.layout import LAUNCHES

RECORD_MAX_BYTES = 64 << 20  # {file: {scope: hash}} of the whole package is a few hundred kB


# --- changed hunks against what ran --------------------------------------------------------

@dataclass
class HunkVerdict:
    scopes_a: set[str]  # scopes of the removed lines, in the old revision
    scopes_b: set[str]  # scopes of the added lines, in the new revision
    changed: list[str]  # scopes whose code (not just comments/docstrings) differs
    executed_by: list[str]  # labels of the runs that executed a changed scope

    def describe(self) -> str:
        if not self.changed:
            return "no code change (comments, docstrings or formatting only)"
        who = " and ".join(self.executed_by) if self.executed_by else "neither"
        return f"{', '.join(self.changed)}: executed by {who}"


def classify_hunk(old_lines: list[int], new_lines: list[int], scopes_a: Scopes | None,
                  scopes_b: Scopes | None, executed: dict[str, set[str]]) -> HunkVerdict:
    """Map a hunk's changed lines to scopes on each side; `executed`: {run label: scopes that
    run executed in this file}. A scope counts as changed when its hash differs between the
    revisions (or it exists on one side only)."""
    sa = scopes_a.of_lines(old_lines) if scopes_a is not None and old_lines else set()
    sb = scopes_b.of_lines(new_lines) if scopes_b is not None and new_lines else set()
    def h(table: Scopes | None, name: str) -> str | None:
        return table.hash(name) if table is not None else None

    changed = sorted(s for s in sa | sb if h(scopes_a, s) != h(scopes_b, s))
    by = [label for label, names in executed.items() if any(s in names for s in changed)]
    return HunkVerdict(sa, sb, changed, by)


# --- reading a launch's record --------------------------------------------------------------

def read_executed(run_dir: Path, code: dict) -> tuple[dict | None, str]:
    """(the executed-code record a launch's `code.executed` names, '') or (None, why not)."""
    ref = code.get("executed") if isinstance(code, dict) else None
    if not isinstance(ref, dict) or not isinstance(ref.get("file"), str):
        return None, "records no executed-code fingerprint (a launch from before they existed)"
    if ref.get("unavailable"):
        return None, f"recorded no executed functions: {ref['unavailable']}"
    rel = Path(ref["file"])
    if rel.is_absolute() or ".." in rel.parts or len(rel.parts) != 2 or rel.parts[0] != LAUNCHES:
        return None, f"executed-code record {ref['file']!r}: not a file in launches/ of the run"
    try:  # a pulled run's record: a regular file (no link followed), bounded size and depth
        data = read_json_bounded(Path(run_dir) / rel, RECORD_MAX_BYTES, follow=False)
    except OSError as e:
        return None, f"executed-code record {ref['file']} unreadable ({type(e).__name__})"
    except ValueError as e:
        return None, f"executed-code record {ref['file']} unreadable ({str(e)[:200]})"
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("executed"), dict):
        return None, f"executed-code record {ref['file']}: not a {SCHEMA} record"
    return data, ""


def executed_scopes(record: dict, path: str) -> dict[str, str]:
    """{scope: hash} a record says ran in package file `path` ('model/bank.py')."""
    got = record.get("executed", {}).get(path)
    return got if isinstance(got, dict) else {}
