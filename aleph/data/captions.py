"""Caption sources: .txt/.jsonl (also gzipped), .json and .parquet files, a directory of
.jsonl/.jsonl.gz/.parquet shards, or a Hugging Face dataset id. Row i is the text of target i.

A real run has 31.9M captions (some 65 GB as Python strings), so a `CaptionSource` reads in
batches (a hub dataset through its memory-mapped Arrow cache: clean page cache the kernel
reclaims), counts rows and hashes without holding them all. Every file is opened through
`aleph.data.readers` (regular files only, bounded lines). A `.json` list is parsed whole.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import aleph.data.readers as readers
from aleph._io import parse_json_bytes, read_chunked, work_root
from aleph.errors import DataError

FILE_SUFFIXES = (".txt", ".jsonl", ".json", ".parquet", ".gz")  # a path, not a dataset id
BATCH_ROWS = 8192  # captions per batch read from a source
_BLOCK = 1 << 20  # bytes read per block from a text file
MAX_JSON_BYTES = readers.MAX_LINE_BYTES  # a .json list is parsed whole (~30x in memory)


class CaptionsHasher:
    """sha256 of captions as UTF-8 lines (each followed by \\n), in row order, fed batch by
    batch (`aleph.data.tokens.captions_sha256`): a batch joined with \\n plus a final \\n is
    the same byte string as each caption then \\n in turn."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.rows = 0

    def update(self, batch: Sequence[str]) -> None:
        if not batch:
            return
        try:
            data = ("\n".join(batch) + "\n").encode("utf-8")
        except UnicodeEncodeError:
            for i, c in enumerate(batch):
                try:
                    c.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise DataError(f"caption row {self.rows + i} is not encodable as UTF-8 "
                                    f"({e.reason} at character {e.start}); expected valid Unicode text") from None
            raise
        self._h.update(data)
        self.rows += len(batch)

    def update_arrow(self, arr) -> None:
        """Hash a pyarrow string array (no nulls) without making Python strings."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(arr)
        if n == 0:
            return
        if not pa.types.is_string(arr.type):
            arr = arr.cast(pa.string())  # large_string: one batch is far below 2 GiB
        joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), arr), "\n")
        self._h.update(joined[0].as_buffer())
        self._h.update(b"\n")
        self.rows += n

    def hexdigest(self) -> str:
        return self._h.hexdigest()


class CaptionSource:
    """A caption source read lazily. Use `open_captions`."""

    def __init__(self, source: str | os.PathLike, column: str = "caption", split: str = "train",
                 cache_dir: str | os.PathLike | None = None) -> None:
        self.column, self.split = column, split
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._rows: int | None = None
        self._ds = None  # the hub dataset, loaded on first read
        self._json: list[str] | None = None  # a .json list, parsed on first read
        self.shards: list[CaptionSource] = []  # a directory's shards, in row order
        path = Path(source).expanduser()
        if path.suffix in FILE_SUFFIXES or os.path.lexists(path):
            self.path: Path | None = path
            self.name = str(path)
            if path.is_dir():
                self.kind = "dir"
                self.shards = [CaptionSource(p, column) for p in readers.shard_files(path)]
                return
            readers.check_regular(path)  # missing, a FIFO, a device: one line, never a hang
            self.kind = readers.caption_format(path)
            if self.kind == "parquet":
                self.parquet_reader()  # a non-parquet file or a missing column fails here
        else:
            self.path, self.kind, self.name = None, "hub", str(source)

    def __repr__(self) -> str:
        return f"CaptionSource({self.name!r}, column={self.column!r}, kind={self.kind!r})"

    # --- reading ---------------------------------------------------------------------------
    def batches(self, rows: int = BATCH_ROWS) -> Iterator[list[str]]:
        """The captions in row order, as lists of at most `rows` strings."""
        if rows < 1:
            raise DataError(f"batch rows {rows!r}: expected an integer >= 1")
        if self.kind == "dir":
            yield from _rebatch(itertools.chain.from_iterable(s.batches(rows) for s in self.shards),
                                rows)
        elif self.kind == "txt":
            yield from _rebatch((self._decode_lines(data, n) for data, n in self._line_blocks()),
                                rows)
        elif self.kind == "jsonl":
            yield from _rebatch(self._jsonl_lines(), rows)
        elif self.kind == "json":
            data = self._json_list()
            for i in range(0, len(data), rows):
                yield data[i:i + rows]
        else:
            start = 0
            for arr in self._arrow_batches(rows):
                yield _check_arrow(arr, self._where(), start).to_pylist()
                start += len(arr)

    def __iter__(self) -> Iterator[str]:
        return itertools.chain.from_iterable(self.batches())

    def head(self, n: int) -> list[str]:
        """The first `n` captions (or all, if fewer), reading no further than needed."""
        out: list[str] = []
        for batch in self.batches(min(max(n, 1), BATCH_ROWS)):
            out += batch[: n - len(out)]
            if len(out) >= n:
                break
        return out

    def count_rows(self) -> int:
        """Rows of the source, without holding its captions (cached): parquet's footer, text
        newlines, non-blank JSONL lines, the dataset's or list's length, a sum over shards."""
        if self._rows is None:
            self._rows = {"txt": self._count_text, "jsonl": self._count_jsonl,
                          "dir": lambda: sum(s.count_rows() for s in self.shards),
                          "json": lambda: len(self._json_list()),
                          "parquet": lambda: self.parquet_reader().file.metadata.num_rows,
                          "hub": lambda: self._dataset().num_rows}[self.kind]()
        return self._rows

    def sha256(self, rows: int = BATCH_ROWS, progress=None) -> str:
        """The captions' content hash (`aleph.data.tokens.captions_sha256`), streamed;
        parquet and hub datasets from their Arrow buffers (no Python strings).
        `progress(rows hashed so far)` is called after each batch. The rows hashed are the
        source's row count from now on; a count taken before (a parquet footer) must agree."""
        h = CaptionsHasher()
        for _ in self._hash_into(h, rows):
            if progress is not None:
                progress(h.rows)
        if self._rows is not None and self._rows != h.rows:
            raise DataError(f"captions {self._where()}: {h.rows:,} rows read but {self._rows:,} "
                            "counted before reading (a footer that overstates its rows, or "
                            "changed while being read?)")
        self._rows = h.rows
        return h.hexdigest()

    def _hash_into(self, h: CaptionsHasher, rows: int) -> Iterator[None]:
        """Feeds `h` batch by batch, yielding after each."""
        if self.kind == "dir":
            for shard in self.shards:  # one digest over all shards, as if concatenated
                yield from shard._hash_into(h, rows)
        elif self.kind in ("parquet", "hub"):
            start = h.rows
            for arr in self._arrow_batches(rows):
                h.update_arrow(_check_arrow(arr, self._where(), h.rows - start))
                yield
        else:
            for batch in self.batches(rows):
                h.update(batch)
                yield

    # --- text and JSON ---------------------------------------------------------------------
    def _line_blocks(self) -> Iterator[tuple[bytes, int]]:
        """(whole lines without their last \\n, first line number), a block at a time, then an
        unterminated last line. A line over `readers.MAX_LINE_BYTES` is refused once that
        many bytes are held, so a file without newlines cannot take the memory."""
        line_no, carry = 1, b""
        with readers.Stream(self.path) as f:
            while block := f.read(_BLOCK):
                data = carry + block
                cut = data.rfind(b"\n") + 1
                first = data.find(b"\n") if cut else len(data)
                if first > readers.MAX_LINE_BYTES:  # the only line that can span blocks
                    raise DataError(f"{self.path}:{line_no}: line longer than "
                                    f"{readers.MAX_LINE_BYTES:,} bytes; expected one caption "
                                    "per line")
                if cut == 0:
                    carry = data
                    continue
                carry = data[cut:]
                yield data[:cut - 1], line_no
                line_no += data.count(b"\n", 0, cut)
        if carry:
            yield carry, line_no

    def _decode_lines(self, data: bytes, first_line: int) -> list[str]:
        """Text lines of `data`, split on \\n only (a caption may hold U+2028 and the others
        str.splitlines splits on), a trailing \\r dropped; UTF-8 only (a NUL byte, as UTF-16
        text has, is refused)."""
        nul = data.find(b"\0")
        if nul >= 0:
            line = first_line + data.count(b"\n", 0, nul)
            raise DataError(f"{self.path}:{line}: a NUL byte; expected UTF-8 text, one caption "
                            "per line (UTF-16 or binary data?)")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = first_line + data.count(b"\n", 0, e.start)
            raise DataError(f"{self.path}:{line}: not UTF-8 text ({e})") from None
        return [s.removesuffix("\r") for s in text.split("\n")]

    def _count_text(self) -> int:
        """Lines (`_line_blocks`: an unterminated last one counts), none of them decoded."""
        return sum(data.count(b"\n") + 1 for data, _ in self._line_blocks())

    def _jsonl_lines(self) -> Iterator[str]:
        for n, obj, _ in readers.jsonl_objects(self.path):
            yield _field(obj, self.column, f"{self.path}:{n}")

    def _count_jsonl(self) -> int:
        """Lines that `_jsonl_lines` does not skip as blank (str.strip() is empty)."""
        with readers.Stream(self.path) as f:  # a printable ASCII first byte: not blank
            return sum(1 for _, raw in f.lines() if (s := raw.strip()) and (
                0x20 < s[0] < 0x80 or raw.decode("utf-8", "replace").strip()))

    def _json_list(self) -> list[str]:
        """A .json caption file: one list of objects, at most MAX_JSON_BYTES, parsed whole."""
        if self._json is None:
            try:  # a regular file, read by blocks up to the bound
                raw = read_chunked(self.path, MAX_JSON_BYTES, follow=True)
            except OSError as e:
                raise DataError(f"{self.path}: {e.strerror}; a .json caption list is parsed whole"
                                f" (at most {MAX_JSON_BYTES:,} bytes): use .jsonl or parquet") from None
            try:
                data = parse_json_bytes(raw)
            except ValueError as e:
                raise DataError(f"{self.path}: {readers.json_why(e)}") from None
            if not isinstance(data, list):
                raise DataError(f"{self.path}: expected a JSON list of objects with a "
                                f"{self.column!r} field")
            self._json = [_field(obj, self.column, f"{self.path}[{i}]") for i, obj in enumerate(data)]
            if readers.SURROGATE_ESCAPE.search(raw):  # rare: only then is every string checked
                readers.check_unicode(self._json, str(self.path))
        return self._json

    # --- Arrow: parquet and hub datasets ----------------------------------------------------
    def _where(self) -> str:
        return (f"{self.path} column {self.column!r}" if self.path is not None else
                f"dataset {self.name!r} column {self.column!r}")

    def parquet_reader(self) -> readers.Parquet:
        """The `readers.Parquet` of a parquet source, its column checked."""
        return readers.Parquet(self.path, [self.column])

    def _dataset(self):
        if self._ds is None:
            import datasets

            from aleph._hub import HubAnswerRefused, guard_hub

            guard_hub()  # a mirror's ETag or commit never becomes a path unchecked
            cache = self.cache_dir if self.cache_dir is not None else work_root() / "cache" / "hf"
            try:
                ds = datasets.load_dataset(self.name, split=self.split, cache_dir=str(cache))
            except Exception as e:  # offline, unknown id, bad split: datasets raises many types
                cause: BaseException | None = e
                while cause is not None and not isinstance(cause, HubAnswerRefused):
                    cause = cause.__cause__ or cause.__context__
                if cause is not None:
                    raise DataError(f"captions dataset {self.name!r}: {cause}") from None
                raise DataError(
                    f"cannot load captions dataset {self.name!r} (split {self.split!r}; not a local "
                    f"file, so taken as a Hugging Face dataset id: needs network access or a copy in "
                    f"{cache}): {type(e).__name__}: {e}") from e
            if self.column not in ds.column_names:
                raise DataError(f"dataset {self.name!r}: no column {self.column!r}; columns are "
                                f"{ds.column_names}")
            self._ds = ds
        return self._ds

    def _arrow_batches(self, rows: int) -> Iterator:
        """pyarrow arrays of at most `rows` values of the caption column, in row order."""
        if self.kind == "hub":
            ds = self._dataset().select_columns([self.column]).with_format("arrow")
            for table in ds.iter(batch_size=rows):  # memory-mapped Arrow cache, not a list
                yield table.column(self.column).combine_chunks()
            return
        for rb in readers.Parquet(self.path, [self.column]).batches([self.column], rows):
            yield rb.column(0)


def open_captions(source: str | os.PathLike | CaptionSource, column: str = "caption",
                  split: str = "train", cache_dir: str | os.PathLike | None = None) -> CaptionSource:
    """A `CaptionSource` for `source` (checked now: existence, type, parquet column); a hub
    dataset id is loaded when first read, cached under `cache_dir` (<work root>/cache/hf)."""
    if isinstance(source, CaptionSource):
        return source
    return CaptionSource(source, column, split, cache_dir)


def shards_identity(directory: str | os.PathLike) -> dict:
    """Cheap identity of a shard directory (keys the memo of its captions' sha256): its path
    and each shard's name, size and mtime."""
    stats = [(p, p.stat()) for p in readers.shard_files(directory)]
    return {"path": str(Path(directory).resolve()),
            "shards": [[p.name, st.st_size, st.st_mtime_ns] for p, st in stats]}


def load_captions(source: str | os.PathLike, column: str = "caption", split: str = "train",
                  cache_dir: str | os.PathLike | None = None) -> list[str]:
    """All captions of `source` as one list (small sources only)."""
    captions = list(open_captions(source, column, split, cache_dir))
    if not captions:
        raise DataError(f"captions source {source}: no rows")
    return captions


def _rebatch(pieces: Iterable[list[str]] | Iterable[str], rows: int) -> Iterator[list[str]]:
    """Lists of at most `rows` captions and about readers.BATCH_BYTES characters (at least
    one caption) from lists of any size or single captions: 8,192 captions of 16 MiB each
    would be 128 GiB held at once."""
    out: list[str] = []
    size = 0
    for piece in pieces:
        for text in (piece,) if isinstance(piece, str) else piece:
            out.append(text)
            size += len(text)
            if len(out) >= rows or size >= readers.BATCH_BYTES:
                yield out
                out, size = [], 0
    if out:
        yield out


def _field(obj: object, column: str, where: str) -> str:
    if not isinstance(obj, dict) or column not in obj:
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise DataError(f"{where}: expected an object with a {column!r} field, got {keys}")
    value = obj[column]
    if not isinstance(value, str):
        raise DataError(f"{where}: field {column!r} is {type(value).__name__}, expected a string")
    return value


def _check_arrow(arr, where: str, start: int):
    """`arr` as a string array with no nulls; else a DataError naming the first bad row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        first = next((v for v in arr.to_pylist() if v is not None), None) if len(arr) else None
        raise DataError(f"{where}: row {start} is {type(first).__name__} ({arr.type}), "
                        "expected a string")
    if arr.null_count:
        i = pc.index(arr.is_null(), True).as_py()
        raise DataError(f"{where}: row {start + i} is NoneType, expected a string")
    return arr


def check_row_counts(token_rows: int, target_rows: int, token_source: str = "token store",
                     target_source: str = "target store") -> None:
    """Captions and targets are aligned by row: their counts must be equal."""
    if token_rows != target_rows:
        raise DataError(
            f"row count mismatch: {token_source} has {token_rows} rows but {target_source} "
            f"has {target_rows}; row i of the captions must be the text of target i")
