"""File helpers shared by every subpackage: atomic writes (temp file, fsync, rename, fsync
dir: a crash leaves the old file or the new one), bounded reads of regular files, hashing."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from aleph.errors import QuotaError

_CHUNK = 8 << 20
# errno values of a write that ran out of room: disk full, quota, file size limit.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory so a rename inside it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process umask, read without changing it (os.umask would race other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def file_mode() -> int:
    """The mode an ordinary `open(path, "w")` gives a new file: 0o666 less the umask."""
    return 0o666 & ~_umask()


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem of `path` (or of its
    nearest existing parent); None when it cannot be asked."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free  # f_bavail * f_frsize
    except OSError:
        return None


def check_free_space(path: str | os.PathLike, needed: int, what: str) -> None:
    """Raise QuotaError (one line: the file, bytes needed vs free) unless `needed` bytes fit."""
    free = free_bytes(path)
    if free is not None and free < needed:
        raise QuotaError(f"{path}: not enough disk space for {what}: needs {needed:,} B, "
                         f"{free:,} B free; free space (or point ALEPH_WORK elsewhere) and retry")


def disk_full_message(path: str | os.PathLike, e: OSError, needed: int | None = None,
                      what: str = "writing") -> str:
    """One line for a write that ran out of room: the file, the error, bytes needed vs free."""
    free = free_bytes(Path(path).parent)
    need = f"needs {needed:,} B, " if needed is not None else ""
    room = f"{free:,} B free" if free is not None else "free space unknown"
    return f"{path}: disk full while {what} ({e.strerror or e}): {need}{room}"


class DurableWriter:
    """Bytes into a file, durably, hashed on the way (`sha256`); every `flush_bytes`
    fdatasync'ed and dropped from page cache (the memory cgroup is charged for it).
    `create(path, size)` makes a new file with O_EXCL (nothing there is followed or taken
    over) and reserves `size` bytes, so a full disk fails up front. A failure raises
    `error(line)` (default OSError, errno kept) naming `label` and what failed."""

    def __init__(self, fd: int, path: str | os.PathLike, offset: int = 0, *,
                 flush_bytes: int = 64 << 20, size: int | None = None,
                 needed: int | None = None, label: str | os.PathLike | None = None,
                 error=None) -> None:
        self.fd, self.path, self.label = fd, str(path), str(label or path)
        self.pos = self.synced = offset
        self.flush_bytes, self.size, self.error = max(1, int(flush_bytes)), size, error
        self.needed = needed if needed is not None else size
        self.sha256 = hashlib.sha256()

    @classmethod
    def create(cls, path: str | os.PathLike, size: int | None = None, **kw) -> DurableWriter:
        w = cls(-1, path, size=size, **kw)
        try:
            w.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:  # a link, a FIFO, someone's file: never written through or over
            raise w.fail("exists already, and is not replaced: move it away") from None
        except OSError as e:
            raise w.fail(e, "creating") from None
        os.fchmod(w.fd, file_mode())  # 0644 under the usual umask, like every other file we write
        try:
            if size:
                os.posix_fallocate(w.fd, 0, size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # not: a filesystem without it
                w.close()
                os.unlink(path)
                raise w.fail(e, f"reserving {size:,} bytes") from None
        return w

    def fail(self, e: OSError | str, what: str = "") -> Exception:
        """The one-line error (for the caller to raise) for `e` while doing `what`."""
        if isinstance(e, str):
            msg, code = f"{self.label}: {e}", errno.EIO
        elif e.errno in DISK_FULL_ERRNOS:
            msg, code = disk_full_message(self.label, e, self.needed, what), e.errno
        else:
            msg, code = f"{self.label}: I/O error while {what} ({e.strerror or e})", e.errno
        return self.error(msg) if self.error else OSError(code, msg)

    def write(self, data) -> None:
        """Write all of `data` (any C-contiguous buffer) at the position."""
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        while view:
            try:
                n = os.pwrite(self.fd, view, self.pos)
            except OSError as e:
                raise self.fail(e, "writing") from None
            view, self.pos = view[n:], self.pos + n
        if self.pos - self.synced >= self.flush_bytes:
            self.flush()

    def flush(self) -> None:
        """fdatasync what was written, then drop its pages from page cache."""
        try:
            os.fdatasync(self.fd)
        except OSError as e:
            raise self.fail(e, "flushing") from None
        if self.pos > self.synced:  # a length of 0 would mean "to the end of the file"
            os.posix_fadvise(self.fd, self.synced, self.pos - self.synced, os.POSIX_FADV_DONTNEED)
        self.synced = self.pos

    def finish(self) -> dict[str, Any]:
        """Make every byte durable; the file's {sha256, size}. A file created with a `size`
        must have been written to exactly that size."""
        if self.size is not None and self.pos != self.size:
            raise self.fail(f"{self.pos:,} bytes written, expected {self.size:,}")
        self.flush()
        return {"sha256": self.sha256.hexdigest(), "size": self.pos}

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> DurableWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, replace: bool = True) -> None:
    """Write `data` to `path` atomically (temp file, fsync, rename, fsync dir).

    replace=False publishes with a hard link: FileExistsError when `path` exists. The mode
    is `file_mode()`, not mkstemp's 0o600: records on a shared volume must stay readable."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
            os.unlink(tmp)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            raise OSError(e.errno, disk_full_message(path, e, len(data))) from e
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented, key-sorted JSON, atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}


def file_kind(mode: int) -> str:
    """'a FIFO', 'a directory', ... for an st_mode that is not a regular file's."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


class NotRegularFile(OSError):
    """An input that is not a regular file (EINVAL); `kind` says what it is ('a FIFO', ...,
    or 'a file with 2 hard links' where one name of our own was expected)."""

    def __init__(self, path: str | os.PathLike, mode: int, kind: str | None = None) -> None:
        self.mode, self.kind = mode, kind or file_kind(mode)
        super().__init__(errno.EINVAL, f"not a regular file ({self.kind}): expected a regular "
                         "file", str(path))

    def __reduce__(self):  # OSError's would rebuild it from (errno, strerror, filename)
        return NotRegularFile, (self.filename, self.mode, self.kind)


def natural_key(name: str) -> list:
    """Sort key of a name by the values of its numbers: shard_2 before shard_10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def number_order_clash(names: list[str]) -> tuple[str, str] | None:
    """For names in name order: the first place where number order (`natural_key`) puts
    another name, as (first by name, first by number); None when the two orders agree
    (files read in name order as rows must not leave their row order to guess)."""
    by_number = sorted(names, key=natural_key)
    return next(((a, b) for a, b in zip(names, by_number, strict=True) if a != b), None)


def _regular_fd(fd: int, path: str | os.PathLike) -> int:
    """`fd`, made blocking, when fstat says it is a regular file (no race with a swap after
    a stat); else it is closed and `NotRegularFile` raised."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(path, mode)
    os.set_blocking(fd, True)
    return fd


def open_regular(path: str | os.PathLike, *, follow: bool = True) -> int:
    """A read-only fd of a regular file (`_regular_fd`); O_NONBLOCK keeps the open itself
    from waiting on a FIFO; with follow=False a symbolic link is refused (O_NOFOLLOW)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise NotRegularFile(path, stat.S_IFLNK) from None
        raise
    return _regular_fd(fd, path)


def open_write_nofollow(path: str | os.PathLike, *, append: bool = False,
                        truncate: bool = False, mode: int = 0o666) -> int:
    """A read-write fd of the regular file `path`, created if missing (`mode` less the
    umask): never through a symbolic link (O_NOFOLLOW) or a hard link of another name, never
    blocking on a FIFO (O_NONBLOCK), checked by `_regular_fd`; appending when `append`,
    emptied when `truncate`, which happens only after the check."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = _regular_fd(os.open(path, flags | (os.O_APPEND if append else 0), mode), path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotRegularFile(path, stat.S_IFLNK) from None
        raise
    if (links := os.fstat(fd).st_nlink) > 1:  # a planted hard link: its other name is not ours
        os.close(fd)
        raise NotRegularFile(path, stat.S_IFREG, f"a file with {links} hard links")
    if truncate:
        os.ftruncate(fd, 0)
    return fd


def read_bounded(path: str | os.PathLike, limit: int, *, follow: bool = True) -> bytes:
    """`read_chunked`, following links by default."""
    return read_chunked(path, limit, follow=follow)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def plain_relative(name: Any) -> bool:
    """Whether `name` is a plain relative POSIX path: a non-empty string with no absolute
    start, backslash, empty, '.' or '..' part, or control character (a NUL would reach the
    OS as a path and fail there)."""
    return (isinstance(name, str) and bool(name) and not name.startswith("/") and "\\" not in name
            and not _CONTROL.search(name) and all(p not in ("", ".", "..") for p in name.split("/")))


def short_repr(value: Any, limit: int = 120) -> str:
    """repr of a value echoed in an error, bounded (reprlib): a huge input stays one line."""
    import reprlib

    r = reprlib.Repr()
    r.maxstring, r.maxother, r.maxlist, r.maxdict, r.maxtuple, r.maxlevel = limit, limit, 8, 8, 8, 3
    return r.repr(value)


def load_yaml(text: str) -> Any:
    """yaml.safe_load without aliases: `*name` is refused (a ComposerError at its mark), so
    a few hundred bytes of nested aliases cannot expand into gigabytes."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise yaml.composer.ComposerError(
                    None, None, "aliases (*name) are not accepted here; write the value out",
                    self.peek_event().start_mark)
            return super().compose_node(parent, index)

    return yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 (a SafeLoader subclass)


def parse_json_bytes(data: bytes) -> Any:
    """The JSON value of UTF-8 `data` (a BOM allowed; json.loads would also take UTF-16/32).
    ValueError, one line, for other text, invalid JSON or nesting too deep to parse."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        hint = " (NUL bytes: UTF-16 or UTF-32?)" if b"\0" in data[:4096] else ""
        raise ValueError(f"not UTF-8 text ({e.reason} at byte {e.start}){hint}") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse; expected a shallow document") from None


def read_json_bounded(path: str | os.PathLike, limit: int, *, follow: bool = False) -> Any:
    """`parse_json_bytes` of `read_chunked(path, limit)`; OSError or ValueError, one line."""
    return parse_json_bytes(read_chunked(path, limit, follow=follow))


_WORDS = {str: "a non-empty string", int: "an integer >= 0", list: "a list", dict: "an object"}


def _fits(value: Any, kind: Any) -> bool:
    if isinstance(kind, re.Pattern):
        return isinstance(value, str) and kind.fullmatch(value) is not None
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return isinstance(value, kind) and (kind is not str or value != "")


def check_record(obj: dict, fields: dict[str, Any]) -> dict:
    """`obj` when it holds each of `fields`, {name: kind or (kind, words)}: `str` a non-empty
    string, `int` an integer >= 0, a compiled pattern a string it matches in full, another
    type an instance of it; else a ValueError naming the first field that does not fit."""
    for name, spec in fields.items():
        kind, words = spec if isinstance(spec, tuple) else (spec, _WORDS.get(spec, spec.__name__))
        if not _fits(obj.get(name), kind):
            raise ValueError(f"field {name!r} is {short_repr(obj.get(name), 80)}, expected {words}")
    return obj


def read_json_record(path: str | os.PathLike, limit: int,
                     fields: dict[str, Any] | None = None) -> dict:
    """The JSON object in `path` (`read_json_bounded`, no link followed) holding `fields`
    (`check_record`); else a ValueError, one line without the path (the caller adds it)."""
    try:
        obj = read_json_bounded(path, limit)
    except OSError as e:  # a link, a FIFO, too large: its strerror says so
        raise ValueError(e.strerror or str(e)) from None
    except ValueError as e:
        raise ValueError(f"invalid JSON ({e})") from None
    fields = fields or {}
    if not isinstance(obj, dict):
        want = f" with {', '.join(fields)}" if fields else ""
        raise ValueError(f"a JSON {type(obj).__name__}, expected an object{want}")
    return check_record(obj, fields)


def read_chunked(path: str | os.PathLike, limit: int, *, follow: bool = False) -> bytes:
    """The bytes of a regular file (no link followed unless `follow`) of at most `limit`
    bytes, else OSError EFBIG; read 64 KiB at a time, never more than limit + 1 bytes, so a
    generous limit costs nothing (one read of limit + 1 would allocate that much first)."""
    chunks, size = [], 0
    with os.fdopen(open_regular(path, follow=follow), "rb", buffering=0) as f:
        while size <= limit and (block := f.read(min(1 << 16, limit + 1 - size))):
            chunks.append(block)
            size += len(block)
    if size > limit:
        raise OSError(errno.EFBIG, f"larger than the {limit:,} B this input may have", str(path))
    return b"".join(chunks)


JSON_MAX = 16 << 20  # a run's or cache's JSON record is KiB; a pulled one may be anything


def read_json(path: str | os.PathLike, limit: int = JSON_MAX) -> Any:
    """The JSON value of UTF-8 file `path`, read bounded (`read_chunked`: at most `limit`
    bytes, no link followed, only a regular file, a FIFO refused at once): OSError for the
    file, json.JSONDecodeError or UnicodeDecodeError for its text, a plain ValueError for
    nesting too deep to parse (never a RecursionError)."""
    text = read_chunked(path, limit).decode("utf-8")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse; expected a shallow document") from None


def sha256_file(path: str | os.PathLike, chunk: int = _CHUNK) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_json(obj: Any) -> str:
    """Hash of the canonical JSON form of `obj` (sorted keys, no whitespace)."""
    canon = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return sha256_bytes(canon)


RUNS_DIR = "runs"  # <work root>/runs/<run name>: every run directory


def work_root() -> Path:
    """The work root: $ALEPH_WORK, default ./work (data/, cache/, runs/ live under it)."""
    return Path(os.environ.get("ALEPH_WORK", "work")).absolute()

