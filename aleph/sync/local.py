"""A directory destination (a mounted bucket, an NFS share, a second disk).

Layout of one run, `<root>/runs/<run>/`: `objects/<sha[:2]>/<sha256>` (each content
written to a temporary name, fsynced and renamed: present means complete) and
`indexes/<N:08d>.json`, snapshot N (revision `rN`), written last and linked into place so
two pushers cannot both claim N. Nothing a snapshot references changes before a newer one
is in place, so a killed push leaves the previous snapshot readable; after a push,
snapshots older than the newest KEEP go, then the objects none of the kept ones references.

Nothing in the destination is trusted (`safefs`): no link is followed, only regular files
are read, never more bytes than recorded. A push deletes only names it writes itself (64
hex digits, its temporaries) and refuses a destination holding anything else there.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from collections.abc import Callable
from functools import partial
from pathlib import Path

import aleph.sync.index as ix
from aleph._io import file_mode
from aleph.sync.dest import Destination, pause_hook
from aleph.sync.index import Snapshot, SyncError
from aleph.sync.safefs import Tree, copy, kind, open_dir_at, read_at_most
from aleph.sync.select import Item

OBJECTS, INDEXES = "objects", "indexes"
KEEP = 2
"""Snapshots kept per run: the newest, and the one a pull that started just before it reads."""
_OBJECT, _SUB = re.compile(r"[0-9a-f]{64}"), re.compile(r"[0-9a-f]{2}")
_INDEX = re.compile(r"[0-9]{8}\.json")
_LAST_INDEX = 99_999_999  # the largest number _INDEX names
_TMP = re.compile(r"\.tmp-[a-z0-9_]{8}")  # _put's mkstemp names
_INDEX_TMP = re.compile(r"\.[0-9]{8}\.json\.[a-z0-9_]{8}\.tmp")  # atomic_write_bytes' names
_NFS = re.compile(r"\.nfs[0-9a-f]+")  # NFS's own: a file removed while open; left alone


class DirDestination(Destination):
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.spec = str(root)
        self.tree = Tree(self.root)

    def _check_root(self) -> None:
        if not self.root.is_dir():
            what = "missing" if not self.root.exists() else "not a directory"
            raise SyncError(f"sync destination {self.root}: {what} (expected an existing "
                            "directory: a mounted bucket, NFS share or second disk)")

    def runs(self) -> list[str]:
        self._check_root()
        with self.tree.dir(ix.RUNS_DIR) as fd:
            if fd is None:
                return []
        found = []
        # fwalk with follow_symlinks=False lists a linked folder but never enters it; a run is
        # runs/<name> or runs/<preset>/<name>, so nothing deeper is walked (a planted tree of
        # any depth would recurse without bound)
        top = self.root / ix.RUNS_DIR
        for dirpath, dirnames, filenames, _ in os.fwalk(top):
            if len(Path(dirpath).relative_to(top).parts) >= 2:
                dirnames[:] = [d for d in dirnames if d == INDEXES]
            if INDEXES in dirnames or INDEXES in filenames:
                run = ix.check_rel(Path(dirpath).relative_to(self.root).as_posix(),
                                   f"sync destination {self.root}: a run folder")
                dirnames.clear()  # a run's own folders hold no runs
                if self._numbers(run):
                    found.append(run)
        return sorted(found)

    def _numbers(self, run: str) -> list[int]:
        """Snapshot numbers of `run`, oldest first; a name in its indexes/ that this
        destination never writes is refused (a hostile name must not reach int())."""
        rel = f"{run}/{INDEXES}"
        with self.tree.dir(rel) as fd:
            if fd is None:
                return []
            numbers = []
            for name, st in self.tree.entries(fd):
                if _INDEX.fullmatch(name):
                    numbers.append(int(name[:8]))
                elif not ((_INDEX_TMP.fullmatch(name) or _NFS.fullmatch(name))
                          and stat.S_ISREG(st.st_mode)):
                    raise self.tree.error(rel, f"holds {name!r} ({kind(st.st_mode)}), not a snapshot "
                                          "index of this destination (expected NNNNNNNN.json, "
                                          "8 ASCII digits, or its own .tmp files)")
        return sorted(numbers)

    def _read_index(self, run: str, number: int) -> dict:
        name = f"{number:08d}.json"
        rel = f"{run}/{INDEXES}/{name}"
        with self.tree.dir(f"{run}/{INDEXES}") as dfd:
            try:
                fd = None if dfd is None else self.tree.open_regular(
                    dfd, name, rel, most=ix.INDEX_MAX, expected=f"a regular file of at most "
                    f"{ix.INDEX_MAX:,} B (the cap on an index)")
            except FileNotFoundError:
                fd = None
        if fd is None:
            raise self.tree.error(rel, "removed while it was read (a newer push pruned it): "
                                  "pull again")
        try:
            data = read_at_most(fd, ix.INDEX_MAX + 1)
        finally:
            os.close(fd)
        if len(data) > ix.INDEX_MAX:
            raise self.tree.error(rel, f"grew past {ix.INDEX_MAX:,} B (the cap on an index) while "
                                  "it was read")
        return ix.parse(data, str(self.root / rel))

    def latest(self, run: str) -> Snapshot | None:
        self._check_root()
        numbers = self._numbers(run)
        if not numbers:
            return None
        return Snapshot(self._read_index(run, numbers[-1]), f"r{numbers[-1]}")

    def publish(self, run: str, index: dict, sends: list[Item], drops: list[str],
                previous: Snapshot | None, rewrite: frozenset[str] = frozenset()) -> str:
        self._check_root()
        number = (int(previous.revision[1:]) if previous else 0) + 1
        if number > _LAST_INDEX:  # its name would have 9 digits, which no reader accepts
            raise SyncError(f"sync destination {self.root}: {run}: snapshot numbers used up "
                            f"(the newest is {number - 1:08d}.json); push to another destination")
        self._check_objects(run)  # before anything is written
        try:
            for n, item in enumerate(sends, start=1):
                self._put(run, item, item.sha256 in rewrite)
                pause_hook(n)
            self._write_index(run, number, ix.encode(index))
        except OSError as e:
            kept = f"snapshot {number - 1} is unchanged" if previous else "nothing of it was there"
            raise self._failed(e, f"snapshot {number} of {run} not written; {kept}") from None
        return f"r{number}"

    def prune(self, run: str) -> None:
        try:
            self._collect_garbage(run)
        except OSError as e:
            raise self._failed(e, f"pruning the older snapshots of {run} failed") from None

    def _failed(self, e: OSError, what: str) -> SyncError:
        """A disk-full, read-only or vanished destination as one line naming it: the bare
        OSError of a write names no file (`No space left on device`)."""
        where = f" ({e.filename})" if e.filename else ""
        return SyncError(f"sync destination {self.root}: {e.strerror or e}{where}; {what}")

    def _check_objects(self, run: str) -> None:
        """Refuse a run whose objects/ holds anything this destination does not write there:
        folders named by 2 hex digits holding regular files named by their sha256 (and the
        .tmp- files of a push). Pruning would otherwise judge names it does not know."""
        rel = f"{run}/{OBJECTS}"
        with self.tree.dir(rel) as fd:
            for sub, st in self.tree.entries(fd) if fd is not None else []:
                if not (stat.S_ISDIR(st.st_mode) and _SUB.fullmatch(sub)):
                    raise self._foreign(f"{rel}/{sub}", st, "a directory named by 2 hex digits")
                sfd = open_dir_at(fd, sub)
                try:
                    for name, est in self.tree.entries(sfd):
                        if not (stat.S_ISREG(est.st_mode)
                                and (_own_object(sub, name) or _NFS.fullmatch(name))):
                            raise self._foreign(f"{rel}/{sub}/{name}", est, "a regular file named "
                                                "by its sha256 (64 hex digits) or a push's .tmp- file")
                finally:
                    os.close(sfd)

    def _foreign(self, rel: str, st: os.stat_result, expected: str) -> SyncError:
        return self.tree.error(rel, f"{kind(st.st_mode)}, expected {expected}: the destination "
                               "holds what it did not write where its objects live; nothing was "
                               "written (remove it, or push to another destination)")

    def _put(self, run: str, item: Item, rewrite: bool = False) -> None:
        sha = item.sha256
        with self.tree.dir(f"{run}/{OBJECTS}/{sha[:2]}", create=True) as dfd:
            if not rewrite:
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(sha, dir_fd=dfd, follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and st.st_size == item.size:
                        return  # content-addressed: already there (an earlier push, or a rename)

            def write(out) -> None:
                digest = self._write(out, item)
                if digest != sha:
                    raise SyncError(f"{item.path}: changed while it was sent (sha256 {digest[:16]}"
                                    f"..., hashed as {sha[:16]}...); the next sync sends it again")

            _write_new(dfd, f".tmp-{os.urandom(4).hex()}", sha, write, os.replace)

    @staticmethod
    def _write(out, item: Item) -> str:
        if item.data is not None:
            out.write(item.data)
            return hashlib.sha256(item.data).hexdigest()
        h = hashlib.sha256()
        with open(item.path, "rb") as f:
            copy(f.read, item.size, h.update, out.write)
        return h.hexdigest()

    def _write_index(self, run: str, number: int, data: bytes) -> None:
        name = f"{number:08d}.json"

        def link(src: str, dst: str, src_dir_fd: int, dst_dir_fd: int) -> None:
            os.link(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            os.unlink(src, dir_fd=src_dir_fd)

        try:  # linked, not renamed, into place: fails if another push took number N
            with self.tree.dir(f"{run}/{INDEXES}", create=True) as dfd:
                _write_new(dfd, f".{name}.{os.urandom(4).hex()}.tmp", name,
                           lambda out: out.write(data), link)
        except FileExistsError:
            raise SyncError(f"sync destination {self.root / run}: snapshot {number} was written "
                            "by another push meanwhile (one pusher per run at a time)") from None

    def _collect_garbage(self, run: str) -> None:
        """Remove snapshots older than the newest KEEP, then the objects none of those
        references and the temporaries of killed pushes: only entries of the destination's
        own names and kinds, through descriptors (a link is removed as a name, never entered)."""
        numbers = self._numbers(run)
        keep = set()
        for n in numbers[-KEEP:]:
            keep |= {r["sha256"] for r in self._read_index(run, n)["files"].values()}
        with self.tree.dir(f"{run}/{INDEXES}") as fd:
            for name, st in self.tree.entries(fd) if fd is not None else []:
                old = _INDEX.fullmatch(name) and int(name[:8]) in numbers[:-KEEP]
                if old or (_INDEX_TMP.fullmatch(name) and stat.S_ISREG(st.st_mode)):
                    _unlink(name, fd)
        with self.tree.dir(f"{run}/{OBJECTS}") as fd:
            for sub, st in self.tree.entries(fd) if fd is not None else []:
                if not (stat.S_ISDIR(st.st_mode) and _SUB.fullmatch(sub)):
                    continue  # not its own: left alone (the next push refuses it)
                sfd = open_dir_at(fd, sub)
                try:
                    for name, est in self.tree.entries(sfd):
                        if stat.S_ISREG(est.st_mode) and _own_object(sub, name) and name not in keep:
                            _unlink(name, sfd)
                    empty = not os.listdir(sfd)
                finally:
                    os.close(sfd)
                if empty:
                    with contextlib.suppress(OSError):  # filled meanwhile: kept
                        os.rmdir(sub, dir_fd=fd)

    def _open_object(self, run: str, rel: str, rec: dict) -> int:
        """A read descriptor of the object of `rel`: a regular file of the recorded size."""
        sha = rec["sha256"]
        where = f"{run}/{rel} (object {run}/{OBJECTS}/{sha[:2]}/{sha})"
        with self.tree.dir(f"{run}/{OBJECTS}/{sha[:2]}") as dfd:
            try:
                if dfd is not None:
                    return self.tree.open_regular(
                        dfd, sha, where, size=rec["size"],
                        expected=f"a regular file of {rec['size']:,} B as its index records")
            except FileNotFoundError:
                pass
        raise self.tree.error(where, "missing; the snapshot was superseded during the pull, "
                              "or the destination was damaged: pull again")

    def damaged(self, run: str, snap: Snapshot, scratch: Path) -> list[str]:
        """Hashes the stored objects in place (no copy), each read up to its recorded size."""
        self._check_root()
        bad = []
        for rel, rec in sorted(snap.files.items()):
            try:
                fd = self._open_object(run, rel, rec)
            except (OSError, SyncError):
                bad.append(rel)
                continue
            h = hashlib.sha256()
            try:
                short = copy(partial(os.read, fd), rec["size"], h.update)
            except OSError:
                short = 1  # unreadable: as damaged as a wrong hash
            finally:
                os.close(fd)
            if short or h.hexdigest() != rec["sha256"]:
                bad.append(rel)
        return bad

    def fetch(self, run: str, snap: Snapshot, rel: str, out: Path, scratch: Path) -> None:
        rec = snap.files[rel]
        fd = self._open_object(run, rel, rec)
        try:
            with open(out, "xb") as dst:  # a new file of the pull's own staging
                left = copy(partial(os.read, fd), rec["size"], dst.write)
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            raise self.tree.error(f"{run}/{rel}", f"not copied ({where}{e.strerror or e})") from None
        finally:
            os.close(fd)
        if left:
            raise self.tree.error(f"{run}/{rel}", f"shrank by {left:,} B while it was read: "
                                  "pull again")


def _own_object(sub: str, name: str) -> bool:
    """A name this destination writes in objects/<sub>/: the sha256, or a push's temporary."""
    return bool((_OBJECT.fullmatch(name) and name.startswith(sub)) or _TMP.fullmatch(name))


def _unlink(name: str, dir_fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def _write_new(dir_fd: int, tmp: str, name: str, write: Callable, publish: Callable) -> None:
    """Write `tmp` in `dir_fd` (new, never through a link), fsync it, publish it as `name`
    with publish(tmp, name, src_dir_fd=, dst_dir_fd=), fsync the directory."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        publish(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink(tmp, dir_fd)
        raise
    os.fsync(dir_fd)
