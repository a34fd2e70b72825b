"""Push a run directory to a destination; pull runs back into a work root.

push sends only the files that differ from the destination's newest snapshot (none: nothing
is written). pull fetches every file of the newest snapshot into a staging directory beside
`runs/`, checks each sha256 and size, and makes the run appear by one rename; it never
replaces an existing run directory, and a refused pull leaves no directory it made. A
pull holds a flock on its staging's `lock` and removes only stagings whose lock it can take
(a pid says nothing across containers).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aleph.sync.index as ix
from aleph._io import RUNS_DIR, atomic_write_json, fsync_dir, read_json, sha256_file
from aleph.record import layout
from aleph.record.layout import RunLayout
from aleph.sync.dest import Destination, pause_hook
from aleph.sync.index import Snapshot, SyncError, run_path
from aleph.sync.select import HashCache, collect

STAGING_PREFIX = ".aleph-pull-"
STAGING_LOCK = "lock"


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


@dataclass(frozen=True)
class PushResult:
    destination: str
    run: str
    revision: str
    step: int | None
    files: int
    sent: int
    bytes_sent: int
    seconds: float
    time: str
    repaired: int = 0  # files whose copy at the destination was damaged, sent again
    unpruned: str = ""  # why older snapshots were not pruned (the new one is in place)

    def line(self) -> str:
        what = (f"{self.sent} of {self.files} files sent ({_mb(self.bytes_sent)})" if self.sent
                else f"up to date, nothing sent ({self.files} files)")
        if self.repaired:
            what += f", {self.repaired} of them damaged at the destination and sent again"
        if self.unpruned:
            what += f"; older snapshots kept, the next push prunes them ({self.unpruned})"
        return (f"synced {self.run} step {self.step} -> {self.destination} revision "
                f"{self.revision}: {what} in {self.seconds:.1f} s")

    def record(self) -> dict:
        """What the manifest records of the last successful sync."""
        return {"destination": self.destination, "time": self.time, "step": self.step,
                "revision": self.revision}


@dataclass(frozen=True)
class PullResult:
    destination: str
    run: str
    revision: str
    step: int | None
    files: int
    bytes: int
    path: Path

    def line(self) -> str:
        return (f"pulled {self.run} from {self.destination} revision {self.revision} (step "
                f"{self.step}): {self.files} files, {_mb(self.bytes)}, every sha256 verified "
                f"-> {self.path}")


def push(run_dir: Path, dest: Destination, verify: bool = False) -> PushResult:
    """Push `run_dir` (under <work>/runs) to `dest`, sending only files changed since its
    newest snapshot; the caller holds the run lock or is the run's own trainer. verify:
    first re-hash that snapshot at the destination and resend missing or damaged copies
    (without it a stored copy is trusted, which keeps an unchanged push cheap)."""
    t0, run_dir = time.monotonic(), Path(run_dir)
    run, cache = check_run_dir(run_dir), HashCache(run_dir)
    step, items = collect(run_dir, cache)
    files = {i.rel: {"sha256": i.sha256, "size": i.size} for i in items}
    previous = dest.latest(run)
    old = previous.files if previous else {}
    bad = set(_damaged(dest, run, previous)) if verify and previous else set()
    sends = [i for i in items if old.get(i.rel) != files[i.rel] or i.rel in bad]
    drops = sorted(set(old) - set(files))
    rewrite = frozenset(files[r]["sha256"] for r in bad if r in files)
    now = utc_now()
    unpruned = ""
    if previous is not None and not sends and not drops:
        revision = previous.revision
    else:
        revision = dest.publish(run, ix.make_index(run, step, files, now), sends, drops,
                                previous, rewrite)
        try:  # the snapshot is in place: a failed pruning does not make the push a failure
            dest.prune(run)
        except SyncError as e:
            unpruned = str(e)
    result = PushResult(dest.spec, run, revision, step, len(files), len(sends),
                        sum(i.size for i in sends), time.monotonic() - t0, now,
                        sum(1 for i in sends if i.rel in bad), unpruned)
    cache.pushed[dest.spec] = result.record()
    cache.save(keep=set(files))
    return result


def check_run_dir(run_dir: Path) -> str:
    """The run path of `run_dir` if it is a run directory (under <work>/runs, holding the
    config.json or manifest.json `aleph train` writes first); SyncError otherwise. Called
    before anything is written into it, the run lock included."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise SyncError(f"{run_dir}: no such run directory")
    run = run_path(run_dir)
    if not any((run_dir / n).is_file() and not (run_dir / n).is_symlink()  # lstat: a regular file
               for n in (layout.CONFIG, layout.MANIFEST)):
        raise SyncError(f"{run_dir}: not a run directory (no config.json or manifest.json; "
                        "expected a directory `aleph train` wrote); nothing was written to it")
    return run


def _damaged(dest: Destination, run: str, snap: Snapshot) -> list[str]:
    """dest.damaged with a scratch directory for the copies it hashes (removed after)."""
    with tempfile.TemporaryDirectory(prefix="aleph-verify-") as scratch:
        return dest.damaged(run, snap, Path(scratch))


def pull(dest: Destination, into: Path, run: str | None = None) -> list[PullResult]:
    """Restore the newest snapshot of `run` (default: every run at `dest`) under `into`."""
    into = Path(into).absolute()
    runs = [ix.check_rel(run, "--run")] if run else dest.runs()
    if not runs:
        raise SyncError(f"sync destination {dest.spec}: no run has been pushed there")
    targets = []
    for r in runs:
        snap = dest.latest(r)
        if snap is None:
            raise SyncError(f"sync destination {dest.spec}: no complete snapshot of {r}")
        final = into / r
        if final.exists():
            raise SyncError(f"{final}: already exists; a pull never replaces a run directory: "
                            "pull --into another work root, or move it aside")
        _refuse_inside_a_run(dest, r, into)
        targets.append((r, snap, final))
    made = sorted({p for *_, final in targets for p in final.parents if not os.path.lexists(p)},
                  key=lambda p: len(p.parts), reverse=True)  # deepest first
    into.mkdir(parents=True, exist_ok=True)
    try:
        _remove_stale_staging(into)
        return [_pull_one(dest, r, snap, final, into) for r, snap, final in targets]
    except BaseException:
        for p in made:  # a refused pull leaves no directory it made (only while empty)
            with contextlib.suppress(OSError):
                os.rmdir(p)
        raise


def _refuse_inside_a_run(dest: Destination, run: str, into: Path) -> None:
    """A pulled run is `runs/<name>` or `runs/<preset>/<name>` and lands in no run directory
    (a destination's `runs/<your run>/checkpoints/step-N` would plant a resume state in yours)."""
    parts = run.split("/")
    if parts[0] != RUNS_DIR or not 2 <= len(parts) <= 3:
        raise SyncError(f"sync destination {dest.spec}: {run!r} is not a run path (expected "
                        f"{RUNS_DIR}/<name> or {RUNS_DIR}/<preset>/<name>); nothing "
                        "was pulled")
    above = into.joinpath(*parts[:2])
    if len(parts) == 3 and any(os.path.lexists(above / n) for n in (layout.CONFIG, layout.MANIFEST)):
        raise SyncError(f"sync destination {dest.spec}: {run} lies inside the run directory "
                        f"{above}; a pull never writes into a run directory; nothing was pulled")


def _pull_one(dest: Destination, run: str, snap: Snapshot, final: Path, into: Path) -> PullResult:
    staging, lock = _new_staging(into)
    tree, scratch = staging / "run", staging / "scratch"
    try:
        scratch.mkdir(parents=True)
        for n, (rel, rec) in enumerate(sorted(snap.files.items()), start=1):
            out = tree / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            dest.fetch(run, snap, rel, out, scratch)
            _verify(dest, run, snap, rel, rec, out)
            pause_hook(n)
        _seed_cache(tree, snap, dest)
        _record_pull(tree, snap, dest)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(tree, final)  # the run appears whole, or not at all
        fsync_dir(final.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(lock)
    return PullResult(dest.spec, run, snap.revision, snap.step, len(snap.files),
                      sum(r["size"] for r in snap.files.values()), final)


def _verify(dest: Destination, run: str, snap: Snapshot, rel: str, rec: dict, out: Path) -> None:
    with open(out, "rb") as f:
        os.fsync(f.fileno())
    size, sha = out.stat().st_size, sha256_file(out)
    if (sha, size) != (rec["sha256"], rec["size"]):
        raise SyncError(f"sync destination {dest.spec}: {run}/{rel}: sha256 {sha[:16]}... "
                        f"({size:,} B), its index (revision {snap.revision}) records "
                        f"{rec['sha256'][:16]}... ({rec['size']:,} B): the copy at the "
                        "destination is damaged; nothing was restored")


def _seed_cache(tree: Path, snap: Snapshot, dest: Destination) -> None:
    """The pulled files' hashes (just verified) as the run's local record, so the first
    push from the new machine neither re-hashes nor re-sends them."""
    cache = HashCache(tree)
    for rel, rec in snap.files.items():
        cache.store(rel, (tree / rel).stat(), rec["sha256"])
    cache.pushed[dest.spec] = {"destination": dest.spec, "time": snap.index.get("time"),
                               "step": snap.step, "revision": snap.revision}
    cache.save(keep=set(snap.files))


def _record_pull(tree: Path, snap: Snapshot, dest: Destination) -> None:
    """pulled.json: the source and the sync_to the pulled config.json came with (chosen by
    whoever wrote the destination: `foreign_sync_to`)."""
    try:
        config = read_json(RunLayout(tree).config)
    except (OSError, ValueError):
        config = {}
    sync_to = config.get("sync_to") if isinstance(config, dict) else None
    atomic_write_json(RunLayout(tree).pulled, {"from": dest.spec, "revision": snap.revision,
                                               "sync_to": sync_to if isinstance(sync_to, str) else ""})


def foreign_sync_to(run_dir: Path, sync_to: str) -> str | None:
    """The source a run was pulled from when `sync_to` is the one its pulled config.json came
    with and not that source (a destination the source's writer chose, not the user), else
    None. A pulled.json that cannot be read counts as foreign: it is written atomically."""
    path = RunLayout(run_dir).pulled
    if not sync_to or not os.path.lexists(path):
        return None
    try:
        rec = read_json(path)
    except (OSError, ValueError):
        return str(path)
    if not isinstance(rec, dict):
        return str(path)
    src = rec.get("from")
    return None if rec.get("sync_to") != sync_to or sync_to == src else str(src)


def _new_staging(into: Path) -> tuple[Path, int]:
    """A new staging directory under `into` and the descriptor holding its lock. The lock
    file is created and locked under a temporary name, then renamed: a `lock` a cleanup can
    see is always held already."""
    for _ in range(3):
        staging = into / f"{STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        tmp = staging / f".{STAGING_LOCK}-{uuid.uuid4().hex[:8]}"
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileNotFoundError:
            continue  # removed while still empty by another pull's cleanup: a new name
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(tmp, staging / STAGING_LOCK)
        return staging, fd
    raise SyncError(f"{into}: a pull staging directory was removed three times as it was "
                    "made; another process is clearing .aleph-pull-* there")


def _remove_stale_staging(into: Path) -> None:
    """Staging directories of pulls that died: a real directory whose lock file this pull
    can lock (its pull is gone, whatever its pid, in whatever PID namespace), or an empty
    one. Links, files and stagings without a lock are left alone: not a pull's own."""
    for p in sorted(into.glob(f"{STAGING_PREFIX}*")):
        with contextlib.suppress(OSError):
            if not stat.S_ISDIR(os.lstat(p).st_mode):
                continue
            try:
                fd = os.open(p / STAGING_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
            except FileNotFoundError:
                os.rmdir(p)  # only while empty: a pull between mkdir and lock makes another
                continue
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: live
                    shutil.rmtree(p, ignore_errors=True)
            finally:
                os.close(fd)
