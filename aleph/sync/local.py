"""A directory destination (a mounted bucket, an NFS share, a second disk).

Layout of one run, `<root>/runs/<run>/`:
- `objects/<sha[:2]>/<sha256>` every file content pushed, named by its sha256, each written
  to a temporary name, fsynced and renamed: present means complete;
- `indexes/<N:08d>.json` snapshot N (revision `rN`), written last, atomically, and linked
  into place so that two pushers cannot both claim N.
Nothing a snapshot references is overwritten or deleted before a newer snapshot is in
place, so a push killed at any point leaves the previous snapshot readable. After a push,
snapshots older than the newest KEEP are removed, then the objects none of the kept ones
references (and temporaries of killed pushes).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from aleph._io import atomic_write_bytes, file_mode, fsync_dir, sha256_file
from aleph.sync import index as ix
from aleph.sync.dest import Destination, pause_hook
from aleph.sync.index import Snapshot, SyncError
from aleph.sync.select import Item

OBJECTS, INDEXES = "objects", "indexes"
KEEP = 2
"""Snapshots kept per run: the newest, and the one a pull that started just before it reads."""
_CHUNK = 8 << 20


class DirDestination(Destination):
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.spec = str(root)

    def _base(self, run: str) -> Path:
        if not self.root.is_dir():
            what = "missing" if not self.root.exists() else "not a directory"
            raise SyncError(f"sync destination {self.root}: {what} (expected an existing "
                            "directory: a mounted bucket, NFS share or second disk)")
        return self.root / run

    def runs(self) -> list[str]:
        base = self._base("")
        found = {p.parent.parent.relative_to(base).as_posix()
                 for p in base.glob(f"{ix.RUNS_DIR}/**/{INDEXES}/*.json")}
        return sorted(r for r in found if self._numbers(self._base(r)))

    @staticmethod
    def _numbers(base: Path) -> list[int]:
        folder = base / INDEXES
        names = [p.stem for p in folder.glob("*.json")] if folder.is_dir() else []
        return sorted(int(n) for n in names if n.isdigit())

    def latest(self, run: str) -> Snapshot | None:
        base = self._base(run)
        numbers = self._numbers(base)
        if not numbers:
            return None
        path = base / INDEXES / f"{numbers[-1]:08d}.json"
        return Snapshot(ix.parse(path.read_bytes(), str(path)), f"r{numbers[-1]}")

    def publish(self, run: str, index: dict, sends: list[Item], drops: list[str],
                previous: Snapshot | None, sent: Callable[[], None],
                rewrite: frozenset[str] = frozenset()) -> str:
        base = self._base(run)
        number = (int(previous.revision[1:]) if previous else 0) + 1
        try:
            for n, item in enumerate(sends, start=1):
                self._put(base, item, item.sha256 in rewrite)
                sent()
                pause_hook(n)
            self._write_index(base, number, ix.encode(index))
        except OSError as e:
            kept = f"snapshot {number - 1} is unchanged" if previous else "nothing of it was there"
            raise self._failed(e, f"snapshot {number} of {run} not written; {kept}") from None
        try:
            self._collect_garbage(base)
        except OSError as e:  # the snapshot is in place; the next push prunes again
            raise self._failed(e, f"snapshot {number} of {run} written, pruning older ones "
                               "failed") from None
        return f"r{number}"

    def _failed(self, e: OSError, what: str) -> SyncError:
        """A disk-full, read-only or vanished destination as one line naming it: the bare
        OSError of a write names no file (`No space left on device`)."""
        where = f" ({e.filename})" if e.filename else ""
        return SyncError(f"sync destination {self.root}: {e.strerror or e}{where}; {what}")

    def _object(self, base: Path, sha: str) -> Path:
        return base / OBJECTS / sha[:2] / sha

    def _put(self, base: Path, item: Item, rewrite: bool = False) -> None:
        final = self._object(base, item.sha256)
        if not rewrite and final.is_file() and final.stat().st_size == item.size:
            return  # content-addressed: already there (an earlier push, or a rename)
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=final.parent)
        try:
            os.fchmod(fd, file_mode())
            with os.fdopen(fd, "wb") as out:
                digest = self._write(out, item)
                out.flush()
                os.fsync(out.fileno())
            if digest != item.sha256:
                raise SyncError(f"{item.path}: changed while it was sent (sha256 {digest[:16]}..., "
                                f"hashed as {item.sha256[:16]}...); the next sync sends it again")
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(final.parent)

    @staticmethod
    def _write(out, item: Item) -> str:
        if item.data is not None:
            out.write(item.data)
            return hashlib.sha256(item.data).hexdigest()
        h, left = hashlib.sha256(), item.size
        with open(item.path, "rb") as f:
            while left > 0 and (block := f.read(min(_CHUNK, left))):
                h.update(block)
                out.write(block)
                left -= len(block)
        return h.hexdigest()

    def _write_index(self, base: Path, number: int, data: bytes) -> None:
        try:  # linked, not renamed, into place: fails if another push took number N
            atomic_write_bytes(base / INDEXES / f"{number:08d}.json", data, replace=False)
        except FileExistsError:
            raise SyncError(f"sync destination {base}: snapshot {number} was written by another "
                            "push meanwhile (one pusher per run at a time)") from None

    def _collect_garbage(self, base: Path) -> None:
        numbers = self._numbers(base)
        for n in numbers[:-KEEP]:
            (base / INDEXES / f"{n:08d}.json").unlink(missing_ok=True)
        keep = set()
        for n in numbers[-KEEP:]:
            path = base / INDEXES / f"{n:08d}.json"
            keep |= {r["sha256"] for r in ix.parse(path.read_bytes(), str(path))["files"].values()}
        for sub in (base / OBJECTS).iterdir() if (base / OBJECTS).is_dir() else []:
            for obj in sub.iterdir():
                if obj.name not in keep:
                    obj.unlink(missing_ok=True)
            if not any(sub.iterdir()):
                sub.rmdir()
        for tmp in (base / INDEXES).glob(".*.tmp"):  # left by a write killed mid-way
            tmp.unlink(missing_ok=True)

    def damaged(self, run: str, snap: Snapshot, scratch: Path) -> list[str]:
        """Hashes the stored objects in place (no copy)."""
        base = self._base(run)
        bad = []
        for rel, rec in sorted(snap.files.items()):
            obj = self._object(base, rec["sha256"])
            ok = obj.is_file() and obj.stat().st_size == rec["size"] \
                and sha256_file(obj) == rec["sha256"]
            if not ok:
                bad.append(rel)
        return bad

    def fetch(self, run: str, snap: Snapshot, rel: str, out: Path, scratch: Path) -> None:
        sha = snap.files[rel]["sha256"]
        src = self._object(self._base(run), sha)
        try:
            shutil.copyfile(src, out)
        except FileNotFoundError:
            raise SyncError(f"sync destination {self.root}: {run}/{rel} (object "
                            f"{src.relative_to(self.root)}) is missing; the snapshot was "
                            "superseded during the pull, or the destination was damaged: "
                            "pull again") from None
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise
            raise SyncError(f"{src}: unreadable ({e.strerror or e})") from None
