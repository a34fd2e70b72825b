"""Caption files are untrusted: regular files only (a FIFO is refused, never waited on),
gzip read as a stream and refused in one line when damaged, shards kept inside their
directory and in an unambiguous name order."""

from __future__ import annotations

import ast
import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aleph.data import load_captions, open_captions, readers
from aleph.errors import DataError

CAPS = ["a red dog", "unicode: café ☕", "", "last"]


def test_gzip_text_and_jsonl_read_as_they_are(tmp_path):
    t = tmp_path / "c.txt.gz"
    t.write_bytes(gzip.compress(("\n".join(CAPS) + "\n").encode()))
    assert load_captions(t) == CAPS
    assert open_captions(t).count_rows() == 4
    assert open_captions(t).sha256() == open_captions(_plain(tmp_path, CAPS)).sha256()
    j = tmp_path / "c.jsonl.gz"
    j.write_bytes(gzip.compress("".join(f'{{"caption_llava": "{c}"}}\n'
                                        for c in ("x", "y")).encode()))
    assert load_captions(j, column="caption_llava") == ["x", "y"]
    (tmp_path / "c.gz").write_bytes(gzip.compress(b"x\n"))
    with pytest.raises(DataError, match=r"c\.gz: unsupported type.*\.txt\.gz or \.jsonl\.gz"):
        open_captions(tmp_path / "c.gz")


def _plain(tmp_path, caps):
    p = tmp_path / "plain.txt"
    p.write_text("\n".join(caps) + "\n", encoding="utf-8")
    return p


def test_damaged_gzip_is_one_line_naming_the_file(tmp_path):
    data = gzip.compress("".join(f"caption number {i}\n" for i in range(5000)).encode())
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"cut\.txt\.gz: damaged or unreadable gzip file "
                                        r"\(truncated gzip stream\)"):
        open_captions(cut).count_rows()
    junk = tmp_path / "junk.jsonl.gz"
    junk.write_bytes(b"not gzip at all\n")
    with pytest.raises(DataError, match=r"junk\.jsonl\.gz: damaged or unreadable gzip file"):
        load_captions(junk)


def test_a_line_without_end_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 1000)
    p = tmp_path / "one.jsonl.gz"
    p.write_bytes(gzip.compress(b'{"caption": "' + b"a" * 5000 + b'"}\n'))
    with pytest.raises(DataError, match=r"one\.jsonl\.gz:1: line longer than 1,000 bytes"):
        load_captions(p)


def test_fifo_source_is_refused_not_waited_on(tmp_path):
    """A FIFO as caption file, as .gz and as a shard: one line, exit 2, within seconds
    (nobody ever writes to it, so any open without O_NONBLOCK would block forever)."""
    d = tmp_path / "shards"
    d.mkdir()
    (d / "a-000.jsonl").write_text('{"caption": "x"}\n')
    for fifo in (tmp_path / "c.jsonl", tmp_path / "c.txt.gz", d / "a-001.jsonl.gz"):
        os.mkfifo(fifo)
    for src in (tmp_path / "c.jsonl", tmp_path / "c.txt.gz", d):
        with pytest.raises(DataError, match=r"is a FIFO; expected a regular file"):
            open_captions(src).count_rows()
    code = ("import sys\nfrom aleph.cli import main\n"
            "sys.exit(main(['data', 'captions', sys.argv[1], '--fields', 'caption', "
            "'--out', sys.argv[2]]))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c.jsonl"),
                        str(tmp_path / "o.parquet")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "c.jsonl is a FIFO; expected a regular file" in r.stderr


def test_fd_check_catches_what_stat_let_through(tmp_path, monkeypatch):
    # the path is swapped for a FIFO between the stat and the open: fstat refuses it
    fifo = tmp_path / "swapped.jsonl"
    os.mkfifo(fifo)
    monkeypatch.setattr(readers, "check_regular", lambda path, what="": None)
    with pytest.raises(DataError, match="swapped.jsonl is a FIFO"):
        readers.open_regular(fifo)


def test_shards_stay_inside_and_in_unambiguous_order(tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_text('{"caption": "secret"}\n')
    d = tmp_path / "d"
    d.mkdir()
    (d / "s-00.jsonl").write_text('{"caption": "a"}\n')
    (d / "s-01.jsonl").symlink_to(outside)
    with pytest.raises(DataError, match=r"s-01\.jsonl is a symlink leading outside"):
        open_captions(d)
    (d / "s-01.jsonl").unlink()
    (d / "real-01.jsonl").write_text('{"caption": "b"}\n')
    (d / "s-01.jsonl").symlink_to("real-01.jsonl")  # inside the directory: followed
    assert [str(p.name) for p in readers.shard_files(d)] == ["real-01.jsonl", "s-00.jsonl",
                                                              "s-01.jsonl"]
    e = tmp_path / "e"
    e.mkdir()
    for n in ("s-2.jsonl", "s-10.jsonl"):
        (e / n).write_text('{"caption": "a"}\n')
    with pytest.raises(DataError, match=r"sort differently by name \(s-10\.jsonl first\)"):
        open_captions(e)
    f = tmp_path / "f"
    f.mkdir()
    (f / "s-0.jsonl").mkdir()
    with pytest.raises(DataError, match=r"s-0\.jsonl is a directory; expected a regular file"):
        open_captions(f)


def test_files_are_opened_for_reading_by_one_helper():
    """One implementation of the untrusted open (O_NONBLOCK, then fstat): aleph._io's
    open_regular, which readers.open_regular builds on; no module of aleph/data calls
    os.open to read a file by itself."""
    data = Path(readers.__file__).parent
    own = [f"{p.name}:{n.lineno}" for p in sorted(data.glob("*.py"))
           for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
           if isinstance(n, ast.Call) and ast.unparse(n.func) == "os.open"
           and "O_RDONLY" in ast.unparse(n)]
    assert own == []


def test_caption_format_is_told_by_the_name():
    names = ("a.txt", "a.jsonl.gz", "a.json", "a.parquet", "a.txt.gz")
    assert [readers.caption_format(Path(n)) for n in names] == ["txt", "jsonl", "json",
                                                                "parquet", "txt"]
    with pytest.raises(DataError, match=r"a\.json\.gz: unsupported type"):
        readers.caption_format(Path("a.json.gz"))  # a .json list is parsed whole: never gzipped


def test_parquet_is_opened_by_one_reader():
    """readers.Parquet is aleph/data's one parquet opener (captions, flatten, align read
    through it), with the bounds that keep a row group's memory page-sized."""
    data = Path(readers.__file__).parent
    calls = {f"{p.name}": ast.unparse(n) for p in sorted(data.glob("*.py"))
             for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
             if isinstance(n, ast.Call) and ast.unparse(n.func).endswith(("ParquetFile",
                                                                          "read_metadata"))}
    assert list(calls) == ["readers.py"]
    assert "buffer_size=1 << 20" in calls["readers.py"] and "pre_buffer=False" in calls["readers.py"]


_BOMB_CHILD = """
import resource, sys
from aleph.data import readers
from aleph.errors import DataError
print("base_mib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)
try:
    rows = sum(b.num_rows for b in readers.Parquet(sys.argv[1], ["caption"]).batches(["caption"], 8192))
    print("rows", rows)
except DataError as e:
    print(e)
print("peak_mib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)
"""


@pytest.mark.slow  # a subprocess decoding up to GBs: tier 1, not the in-image suite
@pytest.mark.parametrize("value_bytes,rows,mib", [(readers.MAX_LINE_BYTES + 1, 256, 1280),
                                                  (1 << 20, 1024, 320)])
def test_a_parquet_dictionary_bomb_is_read_in_bounded_memory(tmp_path, value_bytes, rows, mib):
    """Under 1 KB of parquet (one dictionary value, `rows` indices) decodes to 4 GiB (values
    over the line bound: refused at row 0) or 1 GiB (values within it: streamed). Read whole
    batches of 8,192 rows, they took 6 GB and 2.5 GB; now READ_ROWS values at a time. The
    child runs under RLIMIT_DATA 2 GiB, so the old reader fails here without taking the box."""
    import resource

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bomb.parquet"
    one = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["a" * value_bytes]))
    pq.write_table(pa.table({"caption": one}), path, compression="zstd", store_schema=False)
    assert path.stat().st_size < 1024
    limit = 2 << 30
    r = subprocess.run([sys.executable, "-c", _BOMB_CHILD, str(path)], capture_output=True,
                       text=True, timeout=120,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_DATA, (limit, limit)))
    out = r.stdout.splitlines()
    assert r.returncode == 0 and len(out) == 3, (r.returncode, r.stdout, r.stderr[-2000:])
    if value_bytes > readers.MAX_LINE_BYTES:
        assert out[1] == (f"{path} column 'caption': row 0 is longer than 16,777,216 bytes; "
                          "expected one caption per value")
    else:
        assert out[1] == f"rows {rows}"
    grew = int(out[2].split()[1]) - int(out[0].split()[1])  # MiB above the imports
    assert grew < mib, out  # MiB; decoded: 4,096 / 1,024 MiB (measured: ~880 / ~170)
    print(out)


def _bomb(tmp_path: Path, write: str, child: str, limit: int, size_max: int) -> tuple[Path, list]:
    """The parquet `write` makes (pyarrow code on `p`, run by a child: a fork of a parent that
    held its values inherits that peak RSS), its size checked, then the lines `child` prints
    reading it under RLIMIT_DATA `limit`."""
    import resource

    path = tmp_path / "bomb.parquet"
    subprocess.run([sys.executable, "-c", "import sys, pyarrow as pa, pyarrow.parquet as pq; "
                    f"p = sys.argv[1]; {write}", str(path)], check=True, timeout=120)
    assert path.stat().st_size < size_max
    r = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True,
                       text=True, timeout=120,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_DATA, (limit, limit)))
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    return path, r.stdout.splitlines()


@pytest.mark.slow  # a subprocess decoding up to GBs: tier 1, not the in-image suite
@pytest.mark.parametrize("kind", ["dictionary-no-schema", "plain-page"])
def test_a_parquet_page_bomb_is_refused_before_it_is_decoded_many_times(tmp_path, kind):
    """Two bombs the dictionary check alone missed (review 3, F3): a 2 KB parquet whose
    dictionary page holds one 64 MiB value named by 32 rows, written without the Arrow
    schema (read as plain strings, pyarrow decoded 32 copies: 3.5 GB), and a small file of
    one 160 MiB zstd page (pyarrow allocated it, about 3 times). The page headers are read
    first: the first is decoded one row at a time, the second refused before any page."""
    write = ("col = pa.DictionaryArray.from_arrays(pa.array([0] * 32, pa.int32()), "
             "pa.array(['a' * (64 << 20)])); pq.write_table(pa.table({'caption': col}), p, "
             "compression='zstd', store_schema=False)" if kind == "dictionary-no-schema" else
             "pq.write_table(pa.table({'caption': pa.array(['a' * (160 << 20)])}), p, "
             "compression='zstd', use_dictionary=False)")
    path, out = _bomb(tmp_path, write, _BOMB_CHILD, 2 << 30, 64 << 10)
    assert len(out) == 3, out
    if kind == "dictionary-no-schema":
        assert out[1] == (f"{path} column 'caption': row 0 is longer than 16,777,216 bytes; "
                          "expected one caption per value")
    else:
        assert out[1].startswith(f"{path} column 'caption': row group 0 has a page of 167,772,"), out
        assert out[1].endswith(" bytes decoded; expected at most 134,217,728 (a caption is at "
                               "most 16,777,216)"), out
    grew = int(out[2].split()[1]) - int(out[0].split()[1])  # MiB above the imports
    assert grew < 400, out
    print(kind, out)


@pytest.mark.parametrize("header,why", [
    (b"\x15\x00\x15\x80\x80\x04\x15\x20" + b"\x1c" * 100, "nested deeper than a page header is"),
    (b"\x15\x00\x15\x80", "cut short"),
    (b"\x15\x00\x15\x80\x80\x04\x1d", "Thrift type 13"),
    (b"\x15\x00\x00", "has no valid sizes"),
])
def test_a_hostile_page_header_is_one_line(tmp_path, header, why):
    """The page headers are parsed here (Thrift compact), before pyarrow: a header that is
    deep, cut short, of an unknown type or without sizes is one BadPage, nothing decoded
    (readers.Parquet makes it the DataError `column 'caption' is not readable`)."""
    from aleph.data import pages

    path = tmp_path / "pages.bin"
    path.write_bytes(header)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(pages.BadPage) as e:
            pages.largest_page(fd, 0, len(header))
    finally:
        os.close(fd)
    assert str(e.value).startswith("the page header at byte 0 ")
    assert why in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("dictionary,fewest", [(True, 16), (False, 256)])
def test_page_headers_are_read_as_pyarrow_writes_them(tmp_path, dictionary, fewest):
    """An ordinary file reads whole and fast: its ~1 MiB dictionary page lets 30-odd rows
    be decoded at once (as before the page check), its ~100 KB plain pages hundreds."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "c.parquet"
    caps = [f"a photo {i} of a cat on a sofa number {i * 7}" for i in range(60_000)]
    pq.write_table(pa.table({"caption": caps}), path, row_group_size=20_000,
                   data_page_size=64 << 10, use_dictionary=dictionary)
    src = readers.Parquet(path, ["caption"])
    steps = [src._safe_rows(["caption"], g, 8192, 0) for g in range(3)]
    assert all(fewest <= n <= 8192 for n in steps), steps
    got = [c for b in src.batches(["caption"], 8192) for c in b.column(0).to_pylist()]
    assert got == caps


_WIDE_CHILD = """
import resource, sys
from aleph.data import readers
from aleph.errors import DataError
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
src = readers.Parquet(sys.argv[1])
try:
    sizes = [b.nbytes >> 20 for b in src.batches(src.names, 8192)]
    print("batches MiB", sizes)
except DataError as e:
    print(e)
print("grew_mib", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10) - base)
"""


@pytest.mark.slow  # a subprocess decoding up to GBs: tier 1, not the in-image suite
@pytest.mark.parametrize("kind", ["six-columns", "list-column"])
def test_a_read_is_bounded_across_columns_and_a_nested_column_is_refused(tmp_path, kind):
    """Review 3: six dictionary columns of one 15 MiB value in 32 rows (8 KB on disk) were
    read 32 rows at a time across all columns, a 2,880 MiB batch (4.3 GB); a list<string>
    column of 32 x 32 copies of a 1 MiB value (367 B) was decoded whole (2.9 GB) before its
    type was refused. Now the rows of a read share BATCH_BYTES across the columns, and a
    nested column is refused before a page of it is read."""
    write = ("d = pa.array(['a' * (15 << 20), 'b' * (17 << 20)]); "
             "col = pa.DictionaryArray.from_arrays(pa.array([0] * 32 + [1], pa.int32()), d); "
             "pq.write_table(pa.table({f'c{i}': col for i in range(6)}), p, compression='zstd')"
             if kind == "six-columns" else
             "leaves = pa.DictionaryArray.from_arrays(pa.array([0] * 1024, pa.int32()), "
             "pa.array(['a' * (1 << 20)])); col = pa.ListArray.from_arrays(pa.array("
             "[i * 32 for i in range(33)], pa.int32()), leaves); pq.write_table(pa.table("
             "{'caption': col}), p, compression='zstd', store_schema=False)")
    path, out = _bomb(tmp_path, write, _WIDE_CHILD, 3 << 30, 16 << 10)
    assert len(out) == 2, out
    if kind == "six-columns":
        assert out[0] == (f"{path} column 'c0': row 32 is longer than 16,777,216 bytes; "
                          "expected one caption per value"), out
    else:
        assert out[0] == (f"{path} column 'caption': row 0 is list (list<element: string>), "
                          "expected a string"), out
    # MiB above the imports (measured 1,470 and ~0: what is left is pyarrow's own buffers of
    # six 32 MiB dictionary pages, a few copies each; the old reader took 4.3 GB)
    assert int(out[1].split()[1]) < 2048, out
    print(kind, out)
