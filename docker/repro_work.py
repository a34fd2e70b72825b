"""The repro gate's `--work` directory (docker/repro_check.py): what it may use and remove.

Standard library only. The gate runs as root, so its work directory is handled as input
someone else may have prepared:
- it starts only from a directory that is missing (then made), empty, or marked by an
  earlier run of the gate (`.aleph-repro-work`, a regular file); anything else, or a
  symbolic link, is refused in one line;
- each run's inputs layout, OCI output, build context and SBOM view are new directories
  of its own (`mkdtemp`: a fresh name, mode 0700), never a layout already there;
- the two stores `a/` and `b/` are made by the run, or reused from a marked directory only
  when they are real directories (not links), which is what `--keep` is for;
- logs are opened with O_NOFOLLOW and O_NONBLOCK and checked with fstat: a planted link or
  FIFO at `a/build.log` is refused, never truncated or appended through;
- `cleanup` removes only what this run created (the directory itself too when this run
  made it); what an earlier `--keep` run left stays for the next one.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

MARKER = ".aleph-repro-work"
MARK_TEXT = b"a work directory of docker/repro_check.py; its stores may be reused\n"
LOG_TAIL = 3000  # bytes of a failed command's log echoed


class WorkError(Exception):
    """A work directory the gate will not use: one line, exit 2."""


def _kind(mode: int) -> str:
    return {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO", stat.S_IFREG: "a file",
            stat.S_IFDIR: "a directory"}.get(stat.S_IFMT(mode), "not a regular file")


class WorkDir:
    """The gate's work directory, checked on entry; `created` lists what this run made."""

    def __init__(self, path: Path | None) -> None:
        self.created: list[Path] = []
        self.made = path is None
        if path is None:
            path = Path(tempfile.mkdtemp(prefix="aleph-repro-", dir="/var/tmp"))
        self.path = Path(path).absolute()
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            self.path.mkdir(parents=True)
            self.made, st = True, os.lstat(self.path)
        if not stat.S_ISDIR(st.st_mode):
            raise WorkError(f"--work {self.path} is {_kind(st.st_mode)}; expected a directory "
                            "(missing, empty, or one this gate marked)")
        names = sorted(os.listdir(self.path))
        if MARKER in names:
            mst = os.lstat(self.path / MARKER)
            if not stat.S_ISREG(mst.st_mode):
                raise WorkError(f"--work {self.path}: {MARKER} is {_kind(mst.st_mode)}; "
                                "expected the regular file this gate writes")
        elif names:
            raise WorkError(f"--work {self.path} holds files this gate did not make "
                            f"({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}); "
                            f"expected a missing or empty directory, or one marked {MARKER} by "
                            "an earlier run")
        else:
            fd = os.open(self.path / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                         0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(MARK_TEXT)
            self.created.append(self.path / MARKER)

    def fresh(self, name: str) -> Path:
        """A new directory of this run (`<name>-XXXXXXXX`), never one already there."""
        d = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.path))
        self.created.append(d)
        return d

    def store(self, name: str) -> Path:
        """`<work>/<name>`: made now, or a real directory an earlier (marked) run kept."""
        d = self.path / name
        try:
            d.mkdir()
            self.created.append(d)
        except FileExistsError:
            st = os.lstat(d)
            if not stat.S_ISDIR(st.st_mode):
                raise WorkError(f"{d} is {_kind(st.st_mode)}; expected a build store directory "
                                "this gate made") from None
        return d

    def cleanup(self, remove_store: Callable[[Path], None], keep: tuple[Path, ...] = ()) -> None:
        """Remove what this run created but `keep`, newest first (`remove_store` first for a
        store directory, for buildah's overlay mounts); the directory itself if this run made
        it and nothing is kept."""
        for p in reversed(self.created):
            st = os.lstat(p) if os.path.lexists(p) else None
            if st is None or p in keep or (p.name == MARKER and keep):
                continue
            if stat.S_ISDIR(st.st_mode):
                if p.parent == self.path and p.name in ("a", "b"):
                    remove_store(p)
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink()
        self.created.clear()
        if self.made and not keep:
            shutil.rmtree(self.path, ignore_errors=True)


def real_dir(d: Path) -> Path:
    """`d` made if missing; a link or anything but a directory there is refused."""
    try:
        d.mkdir()
    except FileExistsError:
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode):
            raise WorkError(f"{d} is {_kind(st.st_mode)}; expected a directory") from None
    return d


def open_log(path: Path, truncate: bool = False) -> int:
    """A read-write fd of a log file, appended to (emptied first when `truncate`): created if
    missing, never through a symbolic link (O_NOFOLLOW), never blocking on a FIFO
    (O_NONBLOCK), a regular file by fstat before anything is written."""
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):  # a link; a FIFO without a reader
            kind = "a symbolic link" if e.errno == errno.ELOOP else "a FIFO"
            raise WorkError(f"log {path} is {kind}; expected a regular file this gate "
                            "writes (left as it is)") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise WorkError(f"log {path} is {_kind(st.st_mode)}; expected a regular file this gate "
                        "writes (left as it is)")
    if truncate:
        os.ftruncate(fd, 0)
    os.set_blocking(fd, True)
    return fd


def log_tail(fd: int) -> str:
    """The last LOG_TAIL bytes written through `fd` (read back through the same file)."""
    size = os.fstat(fd).st_size
    return os.pread(fd, LOG_TAIL, max(size - LOG_TAIL, 0)).decode(errors="replace")


def store_args(d: Path) -> list[str]:
    """buildah's options for the store in `d`: its own storage root and run root."""
    return ["--root", str(d / "root"), "--runroot", str(d / "run"), "--storage-driver", "overlay"]


def remove_store(d: Path) -> None:
    """buildah's own removal of a store's containers and images (its overlay mounts)."""
    root = d / "root"
    if root.is_dir() and not root.is_symlink():
        for sub in (["rm", "--all"], ["rmi", "--all", "--force"]):
            subprocess.run(["buildah", *store_args(d), *sub], capture_output=True, timeout=600)


def remove_marked_work(work: Path) -> None:
    """Remove a whole work directory a run of the gate marked (a test's teardown after
    --keep runs): its stores through buildah, then the directory. An empty one (a run that
    stopped before using it) is removed too; anything else unmarked is refused."""
    marker = work / MARKER
    if not work.is_symlink() and work.is_dir() and not any(work.iterdir()):
        work.rmdir()
        return
    if work.is_symlink() or marker.is_symlink() or not marker.is_file():
        raise WorkError(f"{work}: not a work directory this gate marked; not removed")
    for name in ("a", "b"):
        if (work / name).is_dir() and not (work / name).is_symlink():
            remove_store(work / name)
    shutil.rmtree(work)
