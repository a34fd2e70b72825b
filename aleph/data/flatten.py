"""`aleph data captions`: flatten a source of caption records into one caption per row.

A record source (a .jsonl/.jsonl.gz/.parquet file or a directory of such shards) holds one
record per image with several caption fields. The output parquet has one row per listed
field of each record whose value is a string of at least max(`min_chars`, 1) characters:
`caption`, `source_row` (the 0-based record index, blank JSONL lines not counted) and
`field`. Order `record`: each record's fields in turn; order `field`: one pass per field.
Streamed (one batch of records plus one row group in memory); published by a link, never
replacing OUT; the recipe and counts are kept in its metadata under `aleph.flatten`.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aleph.data.readers as readers
from aleph._io import file_mode, fsync_dir, open_regular
from aleph.errors import DataError

ORDERS = ("record", "field")
RECORD_BATCH = 8192  # source records read per batch
WRITE_ROWS = 65536  # output rows per parquet row group
META_KEY = b"aleph.flatten"
# The e1 preset's choice (README, "Our choices"): E1's own fields, order and filter are not
# public. Both caption fields of the public file, each record's in turn, the lineage
# trainer's `min_caption_len 50`.
E1_FIELDS = ("caption_llava", "caption_llava_short")
E1_ORDER, E1_MIN_CHARS = "record", 50
E1_TARGET_ROWS = 31_905_616  # rows of E1's targets (the seed), for comparison


@dataclass
class FlattenResult:
    """What one flatten wrote: its rows, the records read, and per-field counts."""

    out: str
    rows: int
    records: int
    kept: dict[str, int] = field(default_factory=dict)
    """Rows written per field."""
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per field: records skipped as missing/null, not a string, empty or too short."""
    seconds: float = 0.0
    """Wall time of the passes and the write (not the interpreter's start)."""


def source_files(source: str | os.PathLike) -> list[Path]:
    """The record files of `source`: itself, or a directory's shards in name order."""
    p = Path(source).expanduser()
    if p.is_dir():
        return readers.shard_files(p)
    readers.check_regular(p, "captions source")
    kind = readers.caption_format(p)
    if kind not in ("jsonl", "parquet"):
        raise DataError(f"captions source {p}: a {kind} file holds no records with fields; "
                        "expected .jsonl, .jsonl.gz, .parquet or a directory of them")
    return [p]


def record_batches(files: Sequence[Path], fields: Sequence[str],
                   batch: int = RECORD_BATCH) -> Iterator[dict[str, list]]:
    """{field: [value or None per record]} for consecutive batches of records, in order."""
    for path in files:
        if path.name.endswith(".parquet"):
            pf = readers.Parquet(path, what="captions shard")
            present = [f for f in fields if f in pf.names]  # a field it lacks is None
            for rb in pf.batches(present, batch):
                yield {f: rb.column(f).to_pylist() if f in present else [None] * rb.num_rows
                       for f in fields}
            continue
        cols: dict[str, list] = {f: [] for f in fields}
        size = 0  # bytes of the lines held: a batch of long records stays bounded
        for n, obj, line_bytes in readers.jsonl_objects(path):
            if not isinstance(obj, dict):
                raise DataError(f"{path}:{n}: expected a JSON object (one record per line), "
                                f"got {type(obj).__name__}")
            for f in fields:
                cols[f].append(obj.get(f))
            size += line_bytes
            if len(cols[fields[0]]) >= batch or size >= readers.BATCH_BYTES:
                yield cols
                cols, size = {f: [] for f in fields}, 0
        if cols[fields[0]]:
            yield cols


def parse_fields(text: str) -> list[str]:
    fields = [f.strip() for f in text.split(",")]
    if not fields or any(not f for f in fields) or len(set(fields)) != len(fields):
        raise DataError(f"--fields {text!r}: expected a comma list of distinct field names, "
                        "e.g. caption_llava,caption_llava_short")
    return fields


class _Writer:
    """Rows into a parquet file under a temporary name; `publish` renames it to `out`."""

    def __init__(self, out: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa, self.out = pa, out
        self.schema = pa.schema([("caption", pa.string()), ("source_row", pa.int64()),
                                 ("field", pa.string())])
        fd, self.tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        os.close(fd)
        self.writer = pq.ParquetWriter(self.tmp, self.schema, compression="zstd")
        self.cols: tuple[list, list, list] = ([], [], [])

    def flush(self) -> None:
        if self.cols[0]:
            self.writer.write_table(self.pa.Table.from_arrays(
                [self.pa.array(a, t.type) for a, t in zip(self.cols, self.schema, strict=True)],
                schema=self.schema))
            self.cols = ([], [], [])

    def publish(self, meta: dict) -> None:
        self.flush()
        self.writer.add_key_value_metadata({META_KEY: json.dumps(meta, sort_keys=True)})
        self.writer.close()
        with os.fdopen(open_regular(self.tmp, follow=False), "rb") as f:  # our mkstemp file
            os.fsync(f.fileno())
        os.chmod(self.tmp, file_mode())  # as open() would make it, not mkstemp's 0o600
        os.link(self.tmp, self.out)  # never replaces a file that appeared meanwhile
        os.unlink(self.tmp)
        fsync_dir(self.out.parent)

    def discard(self) -> None:
        try:
            self.writer.close()
        finally:
            Path(self.tmp).unlink(missing_ok=True)


def same_flatten(source: str | os.PathLike, fields: Sequence[str], out: str | os.PathLike,
                 order: str = "record", min_chars: int = 0) -> FlattenResult | None:
    """The recorded result when `out` holds this very flatten (the same recipe, no shard
    modified after it was written); None otherwise."""
    out = Path(out).expanduser()
    try:
        meta = json.loads((readers.Parquet(out, what="--out").file.metadata.metadata or {})[META_KEY])
        files = source_files(source)
        newest = max(p.stat().st_mtime_ns for p in files)
        written = out.stat().st_mtime_ns
    except Exception:  # noqa: BLE001 - any failure means "not known to be the same": flatten refuses OUT
        return None
    recipe = {"source": str(source), "shards": [p.name for p in files], "fields": list(fields),
              "order": order, "min_chars": min_chars}
    if any(meta.get(k) != v for k, v in recipe.items()) or newest > written:
        return None
    try:
        return FlattenResult(str(out), meta["rows"], meta["records"], meta["kept"], meta["skipped"],
                             meta.get("seconds", 0.0))
    except (KeyError, TypeError):
        return None


def flatten_captions(source: str | os.PathLike, fields: Sequence[str], out: str | os.PathLike,
                     order: str = "record", min_chars: int = 0, say=lambda line: None
                     ) -> FlattenResult:
    """Flatten `source` into `out` (see the module docstring); returns the counts."""
    if order not in ORDERS:
        raise DataError(f"--order {order!r}: expected one of {', '.join(ORDERS)}")
    if min_chars < 0:
        raise DataError(f"--min-chars {min_chars}: expected an integer >= 0")
    fields = list(fields)
    if not fields:
        raise DataError("--fields: expected at least one field name")
    out = Path(out).expanduser()
    if not out.name.endswith(".parquet"):
        raise DataError(f"--out {out}: expected a path ending in .parquet")
    if os.path.lexists(out):
        raise DataError(f"--out {out} already exists; it is never replaced: remove it or "
                        "choose another path")
    if not out.parent.is_dir():
        raise DataError(f"--out {out}: directory {out.parent} does not exist")
    files = source_files(source)
    t0 = time.perf_counter()
    res = FlattenResult(str(out), 0, 0, {f: 0 for f in fields},
                        {f: {"missing": 0, "not_string": 0, "empty": 0, "short": 0}
                         for f in fields})
    w = _Writer(out)
    try:
        passes = [fields] if order == "record" else [[f] for f in fields]
        for i, pass_fields in enumerate(passes):
            records = _one_pass(files, pass_fields, min_chars, w, res)
            if i and records != res.records:
                raise DataError(f"captions source {source} changed while it was read: "
                                f"{res.records:,} records in pass 1, {records:,} in pass "
                                f"{i + 1}; expected a source that stays as it is")
            res.records = records
            say(f"captions: pass {i + 1} of {len(passes)} ({', '.join(pass_fields)}): "
                f"{res.records:,} records, {res.rows:,} rows so far")
        empty = [f for f in fields if res.kept[f] == 0]
        if empty:
            raise DataError(f"captions source {source}: field(s) {empty} gave no caption in "
                            f"{res.records:,} records (missing, not strings or shorter than "
                            f"{max(min_chars, 1)} characters); expected field names of the "
                            "records")
        res.seconds = time.perf_counter() - t0
        w.publish({"source": str(source), "shards": [p.name for p in files], "fields": fields,
                   "order": order, "min_chars": min_chars, **asdict(res)})
    except BaseException:
        w.discard()
        raise
    return res


def _one_pass(files: Sequence[Path], pass_fields: Sequence[str], min_chars: int, w: _Writer,
              res: FlattenResult) -> int:
    """Read every record once, writing `pass_fields` of each; returns the record count."""
    row = held = 0  # held: characters of the captions not yet flushed
    need = max(min_chars, 1)
    for cols in record_batches(files, pass_fields):
        n = len(cols[pass_fields[0]])
        caps, rows, names = w.cols
        for j in range(n):
            for f in pass_fields:
                v = cols[f][j]
                if isinstance(v, str) and len(v) >= need:
                    caps.append(v), rows.append(row + j), names.append(f)
                    held += len(v)
                    res.kept[f] += 1
                else:
                    why = ("missing" if v is None else "not_string" if not isinstance(v, str)
                           else "empty" if not v else "short")
                    res.skipped[f][why] += 1
        res.rows = sum(res.kept.values())
        if len(caps) >= WRITE_ROWS or held >= readers.BATCH_BYTES:  # long captions: by size
            w.flush()
            held = 0
        row += n
    return row
