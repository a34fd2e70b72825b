"""Changed files and hunks between two code revisions, when both are in a git checkout."""

from __future__ import annotations

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


@dataclass
class CodeDiff:
    rev_a: str
    rev_b: str
    files: list[FileChange]
    patch: str  # the full unified diff

    @property
    def lines_changed(self) -> int:
        return sum((f.added or 0) + (f.removed or 0) for f in self.files)


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          timeout=60, check=False)


def has_commit(repo: Path, rev: str) -> bool:
    return _git(repo, "cat-file", "-e", f"{rev}^{{commit}}").returncode == 0


def diff_revisions(repo: str | Path, rev_a: str, rev_b: str,
                   paths: tuple[str, ...] = ("aleph",)) -> CodeDiff | None:
    """The diff rev_a -> rev_b under `paths` (default: the package a run executes, which
    its source hash covers), or None when git, the checkout or either revision is missing."""
    repo = Path(repo)
    if shutil.which("git") is None or not rev_a or not rev_b:
        return None
    if not (has_commit(repo, rev_a) and has_commit(repo, rev_b)):
        return None
    numstat = _git(repo, "diff", "--numstat", rev_a, rev_b, "--", *paths)
    patch = _git(repo, "diff", "--unified=3", rev_a, rev_b, "--", *paths)
    if numstat.returncode or patch.returncode:
        return None
    files = {}
    for line in numstat.stdout.splitlines():
        added, removed, path = line.split("\t", 2)
        files[path] = FileChange(path, None if added == "-" else int(added),
                                 None if removed == "-" else int(removed))
    current = None
    for line in patch.stdout.splitlines():
        if line.startswith("diff --git "):
            # "diff --git a/<path> b/<path>": the b-side path is the one numstat names
            current = files.get(line.split(" b/", 1)[-1])
        elif line.startswith("@@") and current is not None:
            current.hunks.append(line)
    return CodeDiff(rev_a, rev_b, list(files.values()), patch.stdout)
