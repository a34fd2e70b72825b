"""Reading and writing inside a directory that others can write, without following links.

Paths below a destination's root are walked one component at a time through directory
descriptors opened with O_NOFOLLOW, so a link planted anywhere is reported, never followed,
even if swapped in after a check. Files are opened only once `lstat` says they are
regular, with O_NONBLOCK and an `fstat` of the descriptor: a FIFO never blocks, a device is
never opened.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from aleph.sync.index import SyncError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
CHUNK = 8 << 20


def kind(mode: int, size: int | None = None) -> str:
    """What an lstat mode is, in words: 'a symbolic link', 'a FIFO', 'a regular file of N B'..."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file" + (f" of {size:,} B" if size is not None else "")
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "a special file"


class Tree:
    """The directory `root` (the destination, given by its user: it may itself be a link)
    and error messages that name it: `sync destination <root>: <path>: <what>`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def error(self, rel: str, what: str) -> SyncError:
        return SyncError(f"sync destination {self.root}: {rel}: {what}")

    @contextlib.contextmanager
    def dir(self, rel: str, create: bool = False) -> Iterator[int | None]:
        """A descriptor of directory `rel` (POSIX, relative to root), or None when a part of it
        is missing and `create` is false. A part that is a link or not a directory is refused."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            done = []
            for part in [p for p in rel.split("/") if p]:
                done.append(part)
                try:
                    st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    if not create:
                        yield None
                        return
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, dir_fd=fd)
                    st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    raise self.error("/".join(done), f"{kind(st.st_mode)}, expected a directory "
                                     "(nothing in a destination is followed through a link)")
                fd, parent = os.open(part, _DIR_FLAGS, dir_fd=fd), fd
                os.close(parent)
            yield fd
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def entries(self, dir_fd: int) -> list[tuple[str, os.stat_result]]:
        """(name, lstat) of every entry of an open directory, sorted by name."""
        out = []
        for name in sorted(os.listdir(dir_fd)):
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile: not there
                out.append((name, os.stat(name, dir_fd=dir_fd, follow_symlinks=False)))
        return out

    def open_regular(self, dir_fd: int, name: str, rel: str, size: int | None = None,
                     most: int | None = None, expected: str = "") -> int:
        """A read descriptor of regular file `name` in `dir_fd`: of exactly `size` bytes when
        given, of at most `most` bytes when given; anything else is refused, naming `rel`."""
        want = expected or (f"a regular file of {size:,} B" if size is not None else
                            f"a regular file of at most {most:,} B")
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise self.error(rel, f"missing, expected {want}") from None
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd) if stat.S_ISREG(st.st_mode) else None
        if fd is not None:
            st = os.fstat(fd)  # the file opened, not the one looked at
        if (fd is None or not stat.S_ISREG(st.st_mode) or (size is not None and st.st_size != size)
                or (most is not None and st.st_size > most)):
            if fd is not None:
                os.close(fd)
            raise self.error(rel, f"{kind(st.st_mode, st.st_size)}, expected {want}")
        return fd


def copy(read: Callable[[int], bytes], size: int, *sinks: Callable[[bytes], object]) -> int:
    """Pass at most `size` bytes from `read(n)` to each of `sinks`, block by block; returns
    how many of them were missing (the file ended first)."""
    while size > 0 and (block := read(min(CHUNK, size))):
        for sink in sinks:
            sink(block)
        size -= len(block)
    return size


def read_at_most(fd: int, n: int) -> bytes:
    """Up to `n` bytes from `fd` (a regular file: a read returns what is there)."""
    blocks: list[bytes] = []
    copy(partial(os.read, fd), n, blocks.append)
    return b"".join(blocks)


def open_dir_at(dir_fd: int, name: str) -> int:
    """A descriptor of directory `name` in `dir_fd`, never through a link (OSError if it is one)."""
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
