"""Code part of `aleph runs diff`: did either run execute what changed?

- the same source hash: identical code;
- both revisions clean and in a git checkout: each changed hunk is mapped to the functions
  it touches and reported as executed by A / B / neither (or no code change); only
  executed hunks are caveats (the seed's e21de50 -> ae93b6b argument);
- otherwise (no git, uncommitted changes, a revision the checkout lacks): the recorded
  function hashes alone; a function that ran with differing code, or ran on one side only
  in a file that differs, is a caveat.
A run without an executed-code record gets a caveat and the hunks listed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from aleph.record.executed import classify_hunk, executed_scopes
from aleph.record.fingerprint import scopes
from aleph.report.gitdiff import CodeDiff, HunksUnavailable, diff_revisions, file_at

Add = Callable[[str, str], None]  # add(level, text)
PACKAGE = "aleph/"


def _short(value) -> str:
    return str(value)[:12]


def _clean(rev) -> str:
    return str(rev).removesuffix("-dirty")


def _unknown(rev) -> bool:
    return _clean(rev) in ("unknown", "None", "")


def compare_code(add: Add, ca: dict, cb: dict, repo: Path | None, la: str = "A", lb: str = "B",
                 exec_a: dict | None = None, exec_b: dict | None = None,
                 why_a: str = "", why_b: str = "") -> CodeDiff | None:
    """Findings on two launches' code; returns the git diff shown under the section, if any."""
    ra, rb = ca.get("revision"), cb.get("revision")
    ha, hb = ca.get("source_sha256"), cb.get("source_sha256")
    if ha and ha == hb:
        add("same" if ra == rb else "info", f"identical source (sha256 {ha[:12]})"
            + ("" if ra == rb else f" under revisions {ra} and {rb}"))
        return None
    header = (f"code differs: {la} executed {ra} (source {_short(ha)}), "
              f"{lb} executed {rb} (source {_short(hb)})")
    if exec_a is None or exec_b is None:
        # Say why only when one of them has a record: for two older runs it is no news.
        mixed = exec_a is not None or exec_b is not None
        return _without_fingerprints(add, header, ra, rb, repo, la, lb, [
            f"{w} {why}" for w, why in ((la, why_a), (lb, why_b)) if why and mixed])
    cd, why = _git_diff(repo, ra, rb)
    if cd is not None:
        _by_hunks(add, header, cd, repo, la, lb, exec_a, exec_b)
        return cd
    add("info", f"{la} and {lb} recorded the functions they executed; no hunks ({why}): "
        "judged from the recorded function hashes")
    _by_fingerprints(add, header, la, lb, exec_a, exec_b)
    return None


def _git_diff(repo: Path | None, ra, rb) -> tuple[CodeDiff | None, str]:
    if _unknown(ra) or _unknown(rb):
        return None, "a launch records no code revision"
    if str(ra).endswith("-dirty") or str(rb).endswith("-dirty"):
        return None, "a launch ran from a modified working tree (no revision holds its code)"
    if _clean(ra) == _clean(rb):
        return None, "same revision, different source"
    try:
        return diff_revisions(repo, _clean(ra), _clean(rb)), ""
    except HunksUnavailable as e:
        return None, str(e)


def _by_hunks(add: Add, header: str, cd: CodeDiff, repo: Path, la: str, lb: str,
              exec_a: dict, exec_b: dict) -> None:
    executed, hunks = [], 0
    for f in cd.files:
        rel = f.path.removeprefix(PACKAGE)
        old, new = file_at(repo, cd.rev_a, f.path), file_at(repo, cd.rev_b, f.path)
        sa = scopes(old) if old is not None and f.path.endswith(".py") else None
        sb = scopes(new) if new is not None and f.path.endswith(".py") else None
        ran = {la: set(executed_scopes(exec_a, rel)), lb: set(executed_scopes(exec_b, rel))}
        for who, rec, table, rev in ((la, exec_a, sa, cd.rev_a), (lb, exec_b, sb, cd.rev_b)):
            wrong = sorted(s for s, h in executed_scopes(rec, rel).items()
                           if table is not None and s in table and table.hash(s) != h)
            if wrong:
                add("caveat", f"{who}'s record of the code it executed does not match revision "
                    f"{rev[:12]} in {f.path} ({', '.join(wrong)}): the recorded revision is not "
                    "what it ran")
        f.notes = []
        for old_lines, new_lines in f.changes:
            hunks += 1
            if sa is None and sb is None:  # not Python (or binary): cannot be mapped
                f.notes.append("not Python source: not mapped to functions")
                continue
            v = classify_hunk(old_lines, new_lines, sa, sb, ran)
            f.notes.append(v.describe())
            if v.executed_by:
                executed.append((f, f.hunks[len(f.notes) - 1], v))
    span = (f"{cd.rev_a[:12]} -> {cd.rev_b[:12]} changes {cd.lines_changed} line(s) in {hunks} "
            f"hunk(s) of {len(cd.files)} file(s) of the executed package (aleph/)")
    if not executed:
        add("info", f"{header}; behaviour-identical: {span}, none in a function {la} or {lb} "
            "executed")
    else:
        add("caveat", f"{header}: {span}; {len(executed)} hunk(s) in functions that ran")
        for f, h, v in executed:
            add("caveat", f"{f.path} {h}  [{v.describe()}]")
    _list_files(add, cd)


def _by_fingerprints(add: Add, header: str, la: str, lb: str, exec_a: dict, exec_b: dict) -> None:
    fa, fb = exec_a.get("files") or {}, exec_b.get("files") or {}
    changed = sorted(rel for rel in set(fa) | set(fb) if fa.get(rel) != fb.get(rel))
    findings = []
    for rel in changed:
        xa, xb = executed_scopes(exec_a, rel), executed_scopes(exec_b, rel)
        for s in sorted(set(xa) | set(xb)):
            if s in xa and s in xb:
                if xa[s] != xb[s]:
                    findings.append(f"{PACKAGE}{rel}: {s} executed by {la} and {lb}, its code differs")
            else:
                who, other = (la, lb) if s in xa else (lb, la)
                findings.append(f"{PACKAGE}{rel}: {s} executed by {who} only, in a file that "
                                f"differs: whether {other}'s code changed it is unknown")
    files = ", ".join(PACKAGE + r for r in changed) or "none"
    if not findings:
        add("info", f"{header}; behaviour-identical: every function either run executed has "
            f"the same code in both; the {len(changed)} differing file(s) ({files}) change only "
            "code neither executed")
        return
    add("caveat", f"{header}: {len(findings)} executed function(s) differ or cannot be compared "
        f"(differing files: {files})")
    for text in findings:
        add("caveat", text)


def _without_fingerprints(add: Add, header: str, ra, rb, repo, la: str, lb: str,
                          why: list[str]) -> CodeDiff | None:
    """The report for runs without executed-code records: a caveat, and the hunks."""
    add("caveat", header)
    for who, rev in ((la, ra), (lb, rb)):
        if str(rev).endswith("-dirty"):
            add("caveat", f"{who} ran from a modified working tree ({rev}): its exact source has no revision")
    for text in why:
        add("info", text)
    if _unknown(ra) or _unknown(rb):
        add("info", "hunks not shown: a run records no code revision (neither an image "
            "REVISION nor a git checkout); only the source hashes compare")
        return None
    if _clean(ra) == _clean(rb):
        add("info", f"same base revision {_clean(ra)[:12]}: the difference is in uncommitted "
            "changes, which no checkout holds (compare the source hashes)")
        return None
    try:
        cd = diff_revisions(repo, _clean(ra), _clean(rb))
    except HunksUnavailable as e:  # one line: no git here, no checkout, revision not in it
        add("info", str(e))
        return None
    add("info", f"{_clean(ra)[:12]} -> {_clean(rb)[:12]}: {len(cd.files)} file(s) of the "
        f"executed package (aleph/), {cd.lines_changed} line(s) changed")
    _list_files(add, cd)
    return cd


def _list_files(add: Add, cd: CodeDiff) -> None:
    for f in cd.files:
        counts = "binary" if f.added is None else f"+{f.added} -{f.removed}"
        add("info", f"  {f.path} ({counts}; {len(f.hunks)} hunk(s))")
