"""Changed files and hunks between two code revisions, when both are in a git checkout.

Otherwise `diff_revisions` raises HunksUnavailable with one line saying why (no git, no
checkout, a missing revision), which `aleph runs diff` prints where the hunks would be.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class FileChange:
    path: str
    added: int | None  # None for binary files
    removed: int | None
    hunks: list[str] = field(default_factory=list)  # the "@@ ... @@" header of each hunk
    # per hunk: (line numbers removed in the old file, line numbers added in the new file)
    changes: list[tuple[list[int], list[int]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # per hunk: what ran it (runs diff)


@dataclass
class CodeDiff:
    rev_a: str
    rev_b: str
    files: list[FileChange]
    patch: str  # the full unified diff

    @property
    def lines_changed(self) -> int:
        return sum((f.added or 0) + (f.removed or 0) for f in self.files)


NO_GIT = "no git in this environment: code hunks not listed"


class HunksUnavailable(Exception):
    """The hunks between two revisions cannot be listed; the message says why, in one line."""


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          timeout=60, check=False)


def has_commit(repo: Path, rev: str) -> bool:
    return _git(repo, "cat-file", "-e", f"{rev}^{{commit}}").returncode == 0


def diff_revisions(repo: str | Path | None, rev_a: str, rev_b: str,
                   paths: tuple[str, ...] = ("aleph",)) -> CodeDiff:
    """The diff rev_a -> rev_b under `paths` (default: the package a run executes, which
    its source hash covers). Raises HunksUnavailable when git, the checkout or either
    revision is missing, or git fails."""
    if shutil.which("git") is None:
        raise HunksUnavailable(NO_GIT)
    if repo is None:
        raise HunksUnavailable("no git checkout given (--repo): code hunks not listed")
    repo = Path(repo)
    top = _git(repo, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise HunksUnavailable(f"{repo} is not a git checkout: code hunks not listed")
    if absent := [rev for rev in (rev_a, rev_b) if not has_commit(repo, rev)]:
        raise HunksUnavailable(
            f"revision{'s' if len(absent) > 1 else ''} {' and '.join(r[:12] for r in absent)} "
            f"not in the git checkout at {top.stdout.strip()}: code hunks not listed")
    numstat = _git(repo, "diff", "--no-renames", "--numstat", rev_a, rev_b, "--", *paths)
    patch = _git(repo, "diff", "--no-renames", "--unified=3", rev_a, rev_b, "--", *paths)
    for run in (numstat, patch):
        if run.returncode:
            first = next((ln.strip() for ln in run.stderr.splitlines() if ln.strip()), "no message")
            raise HunksUnavailable(f"git diff {rev_a[:12]} {rev_b[:12]} failed in {repo} "
                                   f"(exit {run.returncode}: {first}): code hunks not listed")
    files = {}
    for line in numstat.stdout.splitlines():
        added, removed, path = line.split("\t", 2)
        files[path] = FileChange(path, None if added == "-" else int(added),
                                 None if removed == "-" else int(removed))
    current, old, new, in_hunk = None, 0, 0, False
    for line in patch.stdout.splitlines():
        if line.startswith("diff --git "):
            # "diff --git a/<path> b/<path>": the b-side path is the one numstat names
            current = files.get(line.split(" b/", 1)[-1])
            in_hunk = False  # the ---/+++ header lines follow
        elif line.startswith("@@") and current is not None:
            current.hunks.append(line)
            current.changes.append(([], []))
            m = _HUNK.match(line)
            old, new = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
            in_hunk = True
        elif current is not None and in_hunk:
            removed, added = current.changes[-1]
            if line.startswith("-"):
                removed.append(old)
                old += 1
            elif line.startswith("+"):
                added.append(new)
                new += 1
            elif line.startswith(" "):
                old, new = old + 1, new + 1
    return CodeDiff(rev_a, rev_b, list(files.values()), patch.stdout)


_HUNK = re.compile(r"@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def file_at(repo: str | Path, rev: str, path: str) -> str | None:
    """The text of `path` at `rev` in the checkout, or None where it does not exist."""
    got = _git(Path(repo), "show", f"{rev}:{path}")
    return got.stdout if got.returncode == 0 else None
