"""Untrusted caption files, opened safely: regular files only, gzip streams, shard directories.

Every caption input is checked by stat, then opened by `aleph._io.open_regular` (O_NONBLOCK,
fstat), so a FIFO or a device is refused in one line instead of blocking the reader. A
damaged gzip stream is a DataError naming the file; lines are bounded (`MAX_LINE_BYTES`), so
a file without newlines (or a one-line gzip bomb) cannot take the memory; parquet values
too, their pages' headers read first and decoded a few rows at a time (`Parquet.batches`), so
a dictionary or compressed-page bomb cannot either.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import re
import stat
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from aleph import _io
from aleph._io import NotRegularFile, number_order_clash, parse_json_bytes
from aleph.errors import DataError

SHARD_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")  # what a shard directory may hold
GZ_INNER = (".txt", ".jsonl")  # what a .gz file may hold
MAX_LINE_BYTES = 16 << 20  # one caption line, JSONL record or parquet value, at most
BATCH_BYTES = 32 << 20  # decoded bytes of a parquet batch handed on (at least one read)
PAGE_MAX = 8 * MAX_LINE_BYTES  # one parquet page decoded, at most (pyarrow's default: 1 MiB)
_GZ_ERRORS = (OSError, EOFError, zlib.error)  # BadGzipFile is an OSError; truncation EOFError


def _refused(path: str | os.PathLike, what: str, e: OSError, doing: str) -> DataError:
    """The one line for an input that is missing, not a regular file, or refused `doing`."""
    if isinstance(e, NotRegularFile):
        return DataError(f"{what} {path} is {e.kind}; expected a regular file")
    if e.errno == errno.ENOENT:
        return DataError(f"{what} {path} does not exist")
    return DataError(f"{what} {path}: cannot {doing} ({e.strerror})")


def check_regular(path: str | os.PathLike, what: str = "captions file") -> os.stat_result:
    """os.stat of `path` (links followed), or a DataError when it is missing or not a
    regular file: stat never blocks, so a FIFO is told apart before anything opens it."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, st.st_mode)
    except OSError as e:
        raise _refused(path, what, e, "stat") from None
    return st


def open_regular(path: str | os.PathLike, what: str = "captions file"):
    """A binary file object of the regular file `path`: `check_regular`, then
    `aleph._io.open_regular` (the path may have been swapped for a FIFO in between)."""
    check_regular(path, what)
    try:
        return os.fdopen(_io.open_regular(path), "rb")
    except OSError as e:
        raise _refused(path, what, e, "open") from None


class Stream:
    """A binary read stream of one caption file, decompressed when it ends in .gz; read
    errors (a damaged gzip stream above all) become one-line DataErrors naming the file."""

    def __init__(self, path: str | os.PathLike, what: str = "captions file") -> None:
        self.path = Path(path)
        self._raw = open_regular(path, what)
        self.gz = self.path.name.endswith(".gz")
        self._f = gzip.GzipFile(fileobj=self._raw, mode="rb") if self.gz else self._raw

    def _fail(self, e: BaseException) -> DataError:
        why = "truncated gzip stream" if isinstance(e, EOFError) else f"{type(e).__name__}: {e}"
        kind = "gzip file" if self.gz else "file"
        return DataError(f"{self.path}: damaged or unreadable {kind} ({why}); expected a "
                         f"complete {'gzip-compressed ' if self.gz else ''}file")

    def read(self, n: int, line: bool = False) -> bytes:
        """At most `n` bytes (`line`: up to and including the next \\n)."""
        try:
            return (self._f.readline if line else self._f.read)(n)
        except _GZ_ERRORS as e:
            raise self._fail(e) from None

    def lines(self) -> Iterator[tuple[int, bytes]]:
        """(1-based line number, line without its \\n), each at most MAX_LINE_BYTES."""
        n = 0
        while raw := self.read(MAX_LINE_BYTES + 1, line=True):
            n += 1
            if len(raw) > MAX_LINE_BYTES:
                raise DataError(f"{self.path}:{n}: line longer than {MAX_LINE_BYTES:,} bytes; "
                                "expected one caption or JSON record per line")
            yield n, raw.removesuffix(b"\n")

    def close(self) -> None:
        if self._f is not self._raw:
            self._f.close()
        self._raw.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Parquet:
    """A parquet file read by record batches, opened by path right after `check_regular`;
    buffered reads without pre-buffering, so memory does not scale with a row group's size.
    Not parquet, a missing column of `columns`, an unreadable page: one-line DataErrors."""

    def __init__(self, path: str | os.PathLike, columns: Sequence[str] = (),
                 what: str = "captions file") -> None:
        import pyarrow.parquet as pq

        self.path = Path(path)
        check_regular(path, what)
        try:
            self.file = pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
        except Exception as e:  # pyarrow raises several types for a damaged or foreign file
            raise DataError(f"{path}: not a readable parquet file ({_arrow_why(e)})") from None
        self.names = self.file.schema_arrow.names
        if missing := [c for c in columns if c not in self.names]:
            raise DataError(f"{path}: no column {missing[0]!r}; columns are {self.names}")

    def batches(self, columns: list[str], rows: int, row_group: int | None = None) -> Iterator:
        """pyarrow RecordBatches of `columns`, at most `rows` rows and about BATCH_BYTES
        each, in row order, read on this thread; only `row_group` when given. Each row
        group's page headers are read first (`_safe_rows`): a page over PAGE_MAX is refused
        before pyarrow allocates it, and rows are decoded as few at a time as keeps a read
        within BATCH_BYTES (one dictionary value named by many rows, a page of compressed
        zeros). A value over MAX_LINE_BYTES is refused naming its row; the rows read must be
        the footer's count."""
        meta = self.file.metadata
        groups = range(meta.num_row_groups) if row_group is None else range(row_group, row_group + 1)
        got = sum(meta.row_group(g).num_rows for g in range(groups.start))  # the rows before
        counted = got + sum(meta.row_group(g).num_rows for g in groups)
        held, n, size = [], 0, 0
        for g in groups:
            step = self._safe_rows(columns, g, rows, got)
            for rb in self._read(columns, step, [g]):
                held.append(self._decoded(rb, got))
                got, n, size = got + rb.num_rows, n + rb.num_rows, size + held[-1].nbytes
                if n + step > rows or size >= BATCH_BYTES:  # checked once per batch: cheap
                    yield self._checked(_one_batch(held), got - n)
                    held, n, size = [], 0, 0
        if held:
            yield self._checked(_one_batch(held), got - n)
        if got != counted:
            raise DataError(f"{self._where(columns)}: {got:,} rows read but {counted:,} counted "
                            "before reading (a footer that overstates its rows, or changed "
                            "while being read?)")

    def _safe_rows(self, columns: list[str], g: int, rows: int, start: int) -> int:
        """Rows of row group `g` (its first: row `start`) pyarrow may decode at once: a row
        of a flat column is in one page, so k rows decode at most k + 1 pages of each:
        BATCH_BYTES / the sum over the columns of their largest page (`largest_page`; over
        PAGE_MAX: refused before pyarrow allocates it), at most `rows`, at least one. A
        nested column (one row: any number of values) is refused before it is read."""
        import pyarrow as pa

        from aleph.data.pages import BadPage, largest_page

        for name in columns:
            t = self.file.schema_arrow.field(name).type
            if pa.types.is_nested(t):
                py = "dict" if pa.types.is_struct(t) else "list"
                raise DataError(f"{self.path} column {name!r}: row {start} is {py} ({t}), "
                                "expected a string")
        rg, total = self.file.metadata.row_group(g), 1
        fd = _io.open_regular(self.path)
        try:
            for i in range(rg.num_columns):
                c = rg.column(i)
                name = c.path_in_schema.split(".")[0]
                if name not in columns:
                    continue
                start = c.data_page_offset  # where parquet-cpp starts the chunk
                if c.has_dictionary_page and 0 < (c.dictionary_page_offset or 0) < start:
                    start = c.dictionary_page_offset
                size = largest_page(fd, start, c.total_compressed_size)
                if size > PAGE_MAX:
                    raise DataError(f"{self.path} column {name!r}: row group {g} has a page of "
                                    f"{size:,} bytes decoded; expected at most {PAGE_MAX:,} (a "
                                    f"caption is at most {MAX_LINE_BYTES:,})")
                total += size
        except BadPage as e:
            raise DataError(f"{self.path}: {self._cols(columns)} not readable (row group {g}: "
                            f"{e})") from None
        except OSError as e:
            raise _refused(self.path, "captions file", e, "read") from None
        finally:
            os.close(fd)
        return max(1, min(rows, BATCH_BYTES // total))

    def _decoded(self, rb, start: int):
        """`rb` with its dictionary columns decoded, each value measured on the dictionary
        first (one 16 MiB value taken 1,000 times must not be decoded to see it)."""
        import pyarrow as pa

        if not any(pa.types.is_dictionary(c.type) for c in rb.columns):
            return rb
        cols = []
        for name, col in zip(rb.schema.names, rb.columns, strict=True):
            if pa.types.is_dictionary(col.type):
                self._refuse_long(name, col.dictionary, start, col.indices)
                col = col.dictionary_decode()
            cols.append(col)
        return pa.RecordBatch.from_arrays(cols, names=rb.schema.names)

    def _checked(self, rb, start: int):
        """`rb`, or a DataError naming the first string over MAX_LINE_BYTES (row `start` is
        rb's first)."""
        for name, col in zip(rb.schema.names, rb.columns, strict=True):
            self._refuse_long(name, col, start)
        return rb

    def _refuse_long(self, name: str, values, start: int, indices=None) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        if not any(f(values.type) for f in (pa.types.is_string, pa.types.is_large_string,
                                            pa.types.is_binary, pa.types.is_large_binary)):
            return
        lens = pc.binary_length(values)
        over = pc.greater(lens if indices is None else lens.take(indices), MAX_LINE_BYTES)
        if pc.any(over).as_py():
            i = pc.index(over, True).as_py()
            raise DataError(f"{self.path} column {name!r}: row {start + i:,} is longer "
                            f"than {MAX_LINE_BYTES:,} bytes; expected one caption per value")

    def _read(self, columns: list[str], rows: int, groups: Sequence[int]) -> Iterator:
        try:  # the consumer's own errors never reach here: only the reader's
            yield from self.file.iter_batches(batch_size=rows, row_groups=groups,
                                              columns=columns, use_threads=False)
        except Exception as e:  # a damaged data page after a readable footer
            raise DataError(f"{self.path}: {self._cols(columns)} not readable "
                            f"({_arrow_why(e)})") from None

    @staticmethod
    def _cols(columns: Sequence[str]) -> str:
        return f"column {columns[0]!r} is" if len(columns) == 1 else f"columns {list(columns)} are"

    def _where(self, columns: Sequence[str]) -> str:
        return (f"{self.path} column {columns[0]!r}" if len(columns) == 1 else
                f"{self.path} columns {list(columns)}")


def _one_batch(batches: list):
    """One RecordBatch of consecutive `batches` (copied only when more than one)."""
    import pyarrow as pa

    return batches[0] if len(batches) == 1 else pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def _arrow_why(e: Exception) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"  # Arrow's messages span lines


def caption_format(path: Path) -> str:
    """The format of a caption file by its name: 'txt', 'jsonl', 'json' or 'parquet' (a
    .gz by its inner suffix), or a DataError naming the suffixes understood."""
    name = path.name
    inner = Path(name[:-3]).suffix if name.endswith(".gz") else path.suffix
    allowed = (".txt", ".jsonl", ".json", ".parquet") if not name.endswith(".gz") else GZ_INNER
    if inner not in allowed:
        raise DataError(f"captions file {path}: unsupported type; expected .txt, .jsonl, .json, "
                        ".parquet, .txt.gz or .jsonl.gz (or a directory of "
                        f"{'/'.join(SHARD_SUFFIXES)} shards)")
    return inner[1:]


def shard_files(directory: str | os.PathLike) -> list[Path]:
    """The shards (SHARD_SUFFIXES, no dot files) of a caption directory in name order, their
    row order. Refused: no shards, a symlink leading outside, a shard that is not a regular
    file, names that sort differently by name and by number (shard_2, shard_10)."""
    d = Path(directory)
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(SHARD_SUFFIXES)
                       and not n.startswith("."))
    except OSError as e:
        raise DataError(f"captions directory {d}: cannot list ({e.strerror})") from None
    if not names:
        raise DataError(f"captions directory {d} holds no caption shards; expected files "
                        f"ending in {', '.join(SHARD_SUFFIXES)}, read in name order")
    if clash := number_order_clash(names):
        raise DataError(f"captions directory {d}: shard names sort differently by name "
                        f"({clash[0]} first) and by number ({clash[1]} first), so their "
                        "row order is ambiguous; zero-pad the numbers (shard_002, not shard_2)")
    real_dir = os.path.realpath(d)
    out = []
    for n in names:
        p = d / n
        if p.is_symlink():
            target = os.path.realpath(p)
            if os.path.commonpath([real_dir, target]) != real_dir:
                raise DataError(f"captions shard {p} is a symlink leading outside {d} (to "
                                f"{target}); expected shards inside the directory")
        check_regular(p, "captions shard")
        out.append(p)
    return out


SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # a \uD800-\uDFFF escape: maybe half a pair


def check_unicode(value: object, where: str) -> None:
    """A DataError naming `where` when a string in `value` holds a lone surrogate (JSON's
    "\\ud800" parses to one; UTF-8 cannot encode it, so Arrow and the tokenizer fail)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(f"{where}: a lone surrogate (\\u{ord(e.object[e.start]):04x} without "
                        "its pair) in a string; expected valid Unicode text") from None


def parse_json_line(raw: bytes, where: str) -> object:
    """The JSON value of one .jsonl line, or a DataError naming `where`: not UTF-8, invalid
    JSON, nesting too deep, a lone surrogate."""
    try:
        obj = parse_json_bytes(raw)
    except ValueError as e:
        hint = " (NUL bytes: UTF-16 or UTF-32 text?)" if b"\0" in raw and "UTF" not in str(e) else ""
        raise DataError(f"{where}: {json_why(e)}{hint}; expected one UTF-8 JSON record per "
                        "line") from None
    if SURROGATE_ESCAPE.search(raw):  # rare: only then is every string checked
        check_unicode(obj, where)
    return obj


def json_why(e: ValueError) -> str:
    """Why `aleph._io.parse_json_bytes` refused: 'invalid JSON (...)' or its own line."""
    return f"invalid JSON ({e})" if isinstance(e, json.JSONDecodeError) else str(e)


def jsonl_objects(path: Path) -> Iterator[tuple[int, object, int]]:
    """(line number, `parse_json_line` value, the line's bytes) of each non-blank line of a
    .jsonl(.gz) file."""
    with Stream(path) as f:
        for n, raw in f.lines():
            try:
                obj = parse_json_line(raw, f"{path}:{n}")
            except DataError:
                if not raw.decode("utf-8", "replace").strip():
                    continue  # a blank line (Unicode whitespace included) is not a record
                raise
            yield n, obj, len(raw)
