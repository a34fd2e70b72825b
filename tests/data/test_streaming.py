"""Caption sources read in batches: same captions, same digest, same store as the list path,
row counts without the captions, and memory that does not grow with the row count."""

import gzip
import hashlib
import json
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aleph.data import captions as captions_mod
from aleph.data import check_row_counts, load_captions
from aleph.data.captions import CaptionSource, open_captions
from aleph.data.tokens import build_token_store, captions_sha256, open_token_store
from aleph.errors import DataError, StoreError

# newline inside a caption (parquet/json only), U+2028 and \x1c (not line breaks here),
# accents, an empty caption, surrounding spaces
CAPS = ["a red dog", "two\nlines", "  spaced  ", "", "caf\u00e9 \u2028 \x1c end", "last one"]
LINE_CAPS = [c for c in CAPS if "\n" not in c]


def old_digest(captions):
    """The digest as defined before streaming (per caption, then a newline)."""
    h = hashlib.sha256()
    for c in captions:
        h.update(c.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def write(tmp_path, kind, caps, column="caption"):
    p = tmp_path / f"c.{kind}"
    if kind in ("jsonl.gz", "shards"):  # gzipped JSONL; shards: three of them in a directory
        lines = [json.dumps({column: c, "n": i}) + "\n" for i, c in enumerate(caps)]
        n = len(lines)
        parts = [lines] if kind == "jsonl.gz" else [lines[k * n // 3:(k + 1) * n // 3]
                                                    for k in range(3)]
        if kind == "shards":
            p.mkdir()
        for k, part in enumerate(parts):
            out = p if kind == "jsonl.gz" else p / f"part-{k:03d}.jsonl.gz"
            out.write_bytes(gzip.compress("".join(part).encode(), compresslevel=1))
    elif kind == "txt":
        p.write_bytes("".join(c + "\n" for c in caps).encode())
    elif kind == "jsonl":
        p.write_text("".join(json.dumps({column: c, "n": i}) + "\n" for i, c in enumerate(caps)))
    elif kind == "json":
        p.write_text(json.dumps([{column: c} for c in caps]))
    else:
        pq.write_table(pa.table({column: caps}), p, row_group_size=4)  # several row groups
    return p


@pytest.mark.parametrize("kind", ["txt", "jsonl", "json", "parquet", "jsonl.gz", "shards"])
def test_streaming_equals_the_list_and_the_old_digest(tmp_path, kind):
    caps = (LINE_CAPS if kind == "txt" else CAPS) * 3
    src = open_captions(write(tmp_path, kind, caps))
    assert load_captions(src.name) == caps
    for rows in (1, 2, 5, 4096):  # batch size changes nothing
        batches = list(src.batches(rows))
        assert all(1 <= len(b) <= rows for b in batches)
        assert [c for b in batches for c in b] == caps
    assert src.count_rows() == len(caps)
    assert src.sha256() == captions_sha256(src) == captions_sha256(caps) == old_digest(caps)
    assert src.head(4) == caps[:4] and src.head(10_000) == caps


def test_text_blocks_keep_lines_whole_across_block_edges(tmp_path, monkeypatch):
    """Tiny read blocks: a line (multi-byte characters, CRLF) split between two reads is
    still one caption; an unterminated last line and blank lines are rows."""
    monkeypatch.setattr(captions_mod, "_BLOCK", 5)
    p = tmp_path / "c.txt"
    p.write_bytes("caf\u00e9 au lait\r\n\nsecond line \u2603\nno newline at end".encode())
    want = ["caf\u00e9 au lait", "", "second line \u2603", "no newline at end"]
    src = open_captions(p)
    assert list(src) == want and src.count_rows() == 4 and src.sha256() == old_digest(want)
    p.write_bytes(b"ok\n\xff bad\n")
    with pytest.raises(DataError, match=r"c\.txt:2: not UTF-8"):
        list(open_captions(p))
    p.write_bytes(b"")
    assert open_captions(p).count_rows() == 0 and list(open_captions(p)) == []


def test_jsonl_count_skips_exactly_the_lines_the_reader_skips(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"caption": "a"}\n\n   \n\t\r\n{"caption": "b"}\n \u3000\n{"caption": "c"}')
    src = open_captions(p)
    assert list(src) == ["a", "b", "c"] and src.count_rows() == 3


def test_parquet_errors_name_the_row_across_batches(tmp_path):
    p = tmp_path / "c.parquet"
    pq.write_table(pa.table({"caption": ["a", "b", "c", None, "e"]}), p, row_group_size=2)
    src = open_captions(p)
    assert src.count_rows() == 5
    for read in (lambda: list(src.batches(2)), src.sha256):
        with pytest.raises(DataError, match=r"c\.parquet column 'caption': row 3 is NoneType"):
            read()
    pq.write_table(pa.table({"caption": [1, 2]}), p)
    with pytest.raises(DataError, match="row 0 is int"):
        open_captions(p).sha256()
    with pytest.raises(DataError, match=r"no column 'text'.*\['caption'\]"):
        open_captions(p, column="text")  # checked on open, before any row is read


def test_hub_dataset_streams_from_its_arrow_cache(tmp_path, monkeypatch):
    """The hub path without the network: `datasets.load_dataset` answers with a local
    Dataset (what it returns after a download); batches, count and digest come from it."""
    import datasets

    calls = []

    def fake_load(name, split, cache_dir):
        calls.append((name, split))
        return datasets.Dataset.from_dict({"caption": CAPS * 2, "other": list(range(12))})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    src = open_captions("org/captions", cache_dir=tmp_path)
    assert src.kind == "hub" and not calls  # loaded on first read, not on open
    assert src.count_rows() == 12
    assert [c for b in src.batches(5) for c in b] == CAPS * 2
    assert src.sha256() == old_digest(CAPS * 2)
    assert calls == [("org/captions", "train")]  # loaded once
    with pytest.raises(DataError, match="no column 'text'"):
        open_captions("org/captions", column="text", cache_dir=tmp_path).count_rows()


def test_store_from_a_source_equals_the_store_from_the_list(tmp_path, smoke, smoke_tokenizer):
    caps = load_captions(smoke.captions)[:300] + ["", "word " * 100]
    p = tmp_path / "c.parquet"
    pq.write_table(pa.table({"caption": caps}), p, row_group_size=64)
    a = build_token_store(caps, smoke_tokenizer, tmp_path / "a", max_len=24, batch=50)
    b = build_token_store(open_captions(p), smoke_tokenizer, tmp_path / "b", max_len=24, batch=37,
                          flush_bytes=4096)  # many flushes
    assert a.manifest["files"] == b.manifest["files"]
    assert a.manifest["captions_sha256"] == b.manifest["captions_sha256"] == old_digest(caps)
    # the arrays are what np.save writes for them (same header as the former memmap build)
    for name in ("ids.npy", "lengths.npy"):
        arr = np.load(tmp_path / "b" / name)
        np.save(tmp_path / "ref.npy", arr)
        assert (tmp_path / "ref.npy").read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert open_token_store(tmp_path / "b", verify_hashes=True).rows == len(caps)
    # reuse: same source, same store; another source is refused
    assert build_token_store(open_captions(p), smoke_tokenizer, tmp_path / "b", max_len=24).rows
    pq.write_table(pa.table({"caption": caps[:-1] + ["changed"]}), p)
    with pytest.raises(StoreError, match="captions_sha256"):
        build_token_store(open_captions(p), smoke_tokenizer, tmp_path / "b", max_len=24)


def test_a_digest_that_does_not_match_the_captions_keeps_nothing(tmp_path, smoke_tokenizer):
    p = write(tmp_path, "txt", LINE_CAPS)
    with pytest.raises(DataError, match=r"c\.txt: sha256 [0-9a-f]{64} while tokenising, but "
                                        r"0{64} was expected"):
        build_token_store(open_captions(p), smoke_tokenizer, tmp_path / "s", max_len=16,
                          expect_sha256="0" * 64)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["c.txt"]  # no store, no staging
    ok = build_token_store(open_captions(p), smoke_tokenizer, tmp_path / "s", max_len=16,
                           expect_sha256=old_digest(LINE_CAPS))
    assert ok.manifest["captions_sha256"] == old_digest(LINE_CAPS)


def test_a_source_that_grows_while_read_keeps_nothing(tmp_path, smoke_tokenizer):
    p = write(tmp_path, "txt", LINE_CAPS)
    src = open_captions(p)
    src.count_rows()  # counted now (cached), then the file grows
    with open(p, "a") as f:
        f.write("one more\n")
    with pytest.raises(DataError, match=r"more rows than the 5 counted"):
        build_token_store(src, smoke_tokenizer, tmp_path / "s", max_len=16, batch=2)
    assert not (tmp_path / "s").exists()


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", ["parquet", "txt", "jsonl", "jsonl.gz", "shards"])
def test_memory_does_not_grow_with_the_row_count(tmp_path, smoke_tokenizer, kind, monkeypatch):
    """Count, hash and tokenise 1,500 and 12,000 rows (8x): Python's peak allocation stays
    about the same. The bound is one batch of captions (128 rows here) plus one read block
    of a text file (32 KiB here; 1 MiB by default), so both are set small against the
    data. Holding every caption (the former list path) would add ~2.8 MB at the larger
    size, four times the growth allowed here."""
    monkeypatch.setattr(captions_mod, "_BLOCK", 32 << 10)
    line = "a brown dog runs on the beach next to a red car in the afternoon light " * 3
    peaks, text = {}, {}
    for rows in (1_500, 12_000):
        caps = [f"{i} {line}" for i in range(rows)]
        text[rows] = sum(len(c) + 49 for c in caps)  # str objects: ~49 B header each
        d = tmp_path / str(rows)
        d.mkdir()
        src_path = write(d, kind, caps)

        def run(src_path=src_path, d=d, rows=rows):
            src = open_captions(src_path)
            assert src.count_rows() == rows
            digest = src.sha256(128)
            build_token_store(src, smoke_tokenizer, d / "store", max_len=16, batch=128,
                              expect_sha256=digest)

        peaks[rows] = _peak(run)
    grow = peaks[12_000] - peaks[1_500]
    assert grow < 0.25 * (text[12_000] - text[1_500]), (peaks, text)
    assert peaks[12_000] < 0.5 * text[12_000], (peaks, text)


def test_a_list_kept_whole_is_what_the_memory_test_catches(tmp_path, smoke_tokenizer):
    """The memory test's own check: materialising the captions (as `load_captions` did for
    every run) does exceed its bound at the larger size."""
    line = "a brown dog runs on the beach next to a red car in the afternoon light " * 3
    caps = [f"{i} {line}" for i in range(12_000)]
    p = write(tmp_path, "parquet", caps)
    text = sum(len(c) + 49 for c in caps)
    peak = _peak(lambda: build_token_store(load_captions(p), smoke_tokenizer, tmp_path / "s",
                                           max_len=16, batch=128))
    assert peak > 0.5 * text


def test_row_count_check_needs_no_captions_in_memory(tmp_path, work, smoke, monkeypatch):
    """`check_inputs` compares the caption rows (parquet footer) with the target rows before
    the run directory exists, without making one Python string of a caption, and names
    both counts in one line."""
    import torch

    from aleph.train.config import resolve
    from aleph.train.preflight import check_inputs

    p = tmp_path / "c.parquet"
    pq.write_table(pa.table({"caption": [f"caption {i}" for i in range(7)]}), p, row_group_size=3)
    tdir = tmp_path / "targets"
    tdir.mkdir()
    t = torch.nn.functional.normalize(torch.randn(8, 768), dim=-1).half()
    torch.save(t[:5].clone(), tdir / "chunk-000.pt")
    torch.save(t[5:].clone(), tdir / "chunk-001.pt")

    def no_strings(self, rows=0):
        raise AssertionError("captions were read as Python strings")

    monkeypatch.setattr(CaptionSource, "batches", no_strings)
    cfg = resolve("e1", overrides=[f"captions={p}", f"targets={tdir}",
                                   f"tokenizer={smoke.tokenizer_dir}"], arm="a2_dense")
    with pytest.raises(DataError) as e:
        check_inputs(cfg)
    msg = str(e.value)
    assert "\n" not in msg and "has 7 rows" in msg and "has 8" in msg and str(p) in msg
    with pytest.raises(DataError, match=r"captions c\.parquet has 7 rows but targets "
                                        r"has 8"):
        check_row_counts(open_captions(p).count_rows(), 8, "captions c.parquet", "targets")
