"""Destinations: what a push writes to and a pull reads from, named by one string.

`hf:<namespace>/<repo>` is a Hugging Face hub model repo (created private on first push;
token from HF_TOKEN, never from a file), any other value an existing directory given as an
absolute path. Each run is kept under `runs/<run>`, so runs can share a destination.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from pathlib import Path

from aleph.sync.index import SyncError
from aleph.sync.select import Item

HUB_PREFIX = "hf:"
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
PAUSE_ENV = "ALEPH_SYNC_PAUSE_AFTER_FILES"
"""Test hook: a push (files sent) or pull (files fetched) waits forever after this many
files, so a test can kill it at a known point."""


class Destination(ABC):
    """One destination (DirDestination, HubDestination). Each keeps a run's snapshots so
    that a push killed at any point leaves the previous complete snapshot readable."""

    spec: str

    @abstractmethod
    def runs(self) -> list[str]:
        """Run paths holding at least one complete snapshot."""

    @abstractmethod
    def latest(self, run: str):
        """The newest complete Snapshot of `run`, or None."""

    @abstractmethod
    def publish(self, run: str, index: dict, sends: list[Item], drops: list[str],
                previous, rewrite: frozenset[str] = frozenset()) -> str:
        """Send `sends`, make `index` the newest snapshot (files not sent are unchanged
        since `previous`; `drops` left it); returns the new revision. `rewrite`: sha256s
        whose stored copy is damaged, to be written again even where a copy is present."""

    @abstractmethod
    def prune(self, run: str) -> None:
        """Remove what only snapshots older than the newest few hold; SyncError if that
        fails (called after publish: the new snapshot is in place either way)."""

    @abstractmethod
    def fetch(self, run: str, snap, rel: str, out: Path, scratch: Path) -> None:
        """Write file `rel` of snapshot `snap` to `out` (not verified here)."""

    def damaged(self, run: str, snap, scratch: Path) -> list[str]:
        """Files of `snap` whose stored copy is missing or does not hash to the index:
        each is fetched into `scratch` and hashed (subclasses may hash in place)."""
        from aleph._io import sha256_file

        bad = []
        for rel, rec in sorted(snap.files.items()):
            out = scratch / "verify"
            try:
                self.fetch(run, snap, rel, out, scratch)
                ok = out.stat().st_size == rec["size"] and sha256_file(out) == rec["sha256"]
            except (OSError, SyncError):
                ok = False
            finally:
                out.unlink(missing_ok=True)
            if not ok:
                bad.append(rel)
        return bad


def check_spec(spec: str) -> str | None:
    """What is wrong with a destination string, or None (used by config validation)."""
    if spec.startswith(HUB_PREFIX):
        if not _REPO_ID.fullmatch(spec[len(HUB_PREFIX):]):
            return f"{HUB_PREFIX}<namespace>/<repo> (a hub repo id such as hf:me/aleph-runs)"
    elif not os.path.isabs(spec):
        return ("an absolute directory path (a mounted bucket, NFS share or second disk) or "
                f"{HUB_PREFIX}<namespace>/<repo>")
    return None


def scrub(text: str) -> str:
    """`text` with the hub token (HF_TOKEN) masked: errors are logged, the token never is."""
    token = os.environ.get("HF_TOKEN")
    return text.replace(token, "<redacted>") if token and len(token) >= 4 else text


def pause_hook(done: int) -> None:
    """The test hook of PAUSE_ENV: after `done` files, say so on stderr and wait."""
    want = os.environ.get(PAUSE_ENV)
    if want and done == int(want):
        import sys
        import time

        print(f"sync pause hook: paused after {done} file(s) ({PAUSE_ENV})", file=sys.stderr,
              flush=True)
        while True:
            time.sleep(1)
