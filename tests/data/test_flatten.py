"""`aleph data captions`: CC12M-shaped records flattened in both orders, from one .jsonl.gz
and from shards, with the audit columns that name each row's record and field."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aleph.data import load_captions, open_captions
from aleph.data.flatten import META_KEY, flatten_captions
from aleph.errors import DataError

FIELDS = ["caption_llava", "caption_llava_short"]


def cc12m_records(n: int) -> list[dict]:
    """Records shaped like CaptionEmporium/conceptual-captions-cc12m-llavanext: every 5th
    short caption below 20 characters, every 7th long one missing, every 11th short null."""
    out = []
    for i in range(n):
        r = {"key": f"{i:09d}", "url": f"https://example.org/{i}.jpg", "status": "success",
             "caption_llava": f"A detailed picture number {i} showing a dog on a beach at dusk.",
             "caption_llava_short": f"dog {i}" if i % 5 == 0 else
             f"A dog running on a wide sandy beach in the evening, image {i}."}
        if i % 7 == 3:
            del r["caption_llava"]
        if i % 11 == 4:
            r["caption_llava_short"] = None
        out.append(r)
    return out


def expected(recs: list[dict], order: str, min_chars: int) -> list[tuple[str, int, str]]:
    def ok(v):
        return isinstance(v, str) and len(v) >= max(min_chars, 1)

    if order == "record":
        return [(r[f], i, f) for i, r in enumerate(recs) for f in FIELDS if ok(r.get(f))]
    return [(r[f], i, f) for f in FIELDS for i, r in enumerate(recs) if ok(r.get(f))]


def write_jsonl_gz(path, recs) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


def rows_of(path) -> list[tuple[str, int, str]]:
    t = pq.read_table(path)
    assert t.schema.field("source_row").type == pa.int64()
    return list(zip(*(t.column(c).to_pylist() for c in ("caption", "source_row", "field")),
                    strict=True))


@pytest.mark.parametrize("order", ["record", "field"])
def test_jsonl_gz_flattens_in_both_orders(tmp_path, order):
    recs = cc12m_records(300)
    src = tmp_path / "train.jsonl.gz"
    write_jsonl_gz(src, recs)
    out = tmp_path / f"{order}.parquet"
    res = flatten_captions(src, FIELDS, out, order=order, min_chars=20)
    want = expected(recs, order, 20)
    assert rows_of(out) == want and res.rows == len(want) and res.records == 300
    # the skips are counted by reason: 43 long captions missing; short ones null or short
    assert res.skipped["caption_llava"]["missing"] == sum(1 for i in range(300) if i % 7 == 3)
    assert res.skipped["caption_llava_short"]["missing"] == sum(1 for i in range(300) if i % 11 == 4)
    assert res.skipped["caption_llava_short"]["short"] == sum(
        1 for i in range(300) if i % 5 == 0 and i % 11 != 4)
    meta = json.loads(pq.read_metadata(out).metadata[META_KEY])
    assert meta["order"] == order and meta["fields"] == FIELDS and meta["rows"] == len(want)
    # the trainer and `aleph data tokens` read OUT's caption column as any parquet source
    assert load_captions(out) == [c for c, _, _ in want]


def test_shards_read_in_name_order_equal_one_file(tmp_path):
    recs = cc12m_records(250)
    one = tmp_path / "one.jsonl.gz"
    write_jsonl_gz(one, recs)
    d = tmp_path / "shards"
    d.mkdir()
    write_jsonl_gz(d / "train-00002.jsonl.gz", recs[200:])  # written first, read last
    (d / "train-00000.jsonl").write_text("".join(json.dumps(r) + "\n\n" for r in recs[:90]))
    pq.write_table(pa.Table.from_pylist(recs[90:200]), d / "train-00001.parquet")
    (d / "README.md").write_text("not a shard\n")
    for order in ("record", "field"):
        a = flatten_captions(one, FIELDS, tmp_path / f"a-{order}.parquet", order=order, min_chars=20)
        b = flatten_captions(d, FIELDS, tmp_path / f"b-{order}.parquet", order=order, min_chars=20)
        assert rows_of(tmp_path / f"b-{order}.parquet") == expected(recs, order, 20)
        assert (a.rows, a.records, a.kept) == (b.rows, b.records, b.kept)
    # a shard directory is also a caption source for one column, in the same order
    caps = open_captions(d, column="key")
    assert caps.count_rows() == 250 and list(caps) == [r["key"] for r in recs]
    assert caps.sha256() == open_captions(one, column="key").sha256()


def test_bad_records_and_outputs_are_refused_in_one_line(tmp_path):
    src = tmp_path / "c.jsonl.gz"
    write_jsonl_gz(src, cc12m_records(10))
    out = tmp_path / "o.parquet"
    with pytest.raises(DataError, match=r"field\(s\) \['caption'\] gave no caption in 10 records"):
        flatten_captions(src, ["caption_llava", "caption"], out)
    assert not out.exists() and list(tmp_path.iterdir()) == [src]  # no temp left behind
    out.write_bytes(b"earlier data")
    with pytest.raises(DataError, match="already exists; it is never replaced"):
        flatten_captions(src, FIELDS, out)
    assert out.read_bytes() == b"earlier data"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"caption_llava": "fine caption"}\n["a list"]\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: expected a JSON object"):
        flatten_captions(bad, FIELDS, tmp_path / "p.parquet")
    with pytest.raises(DataError, match="--order 'image'"):
        flatten_captions(src, FIELDS, tmp_path / "p.parquet", order="image")


def test_cli_prints_the_row_count_on_stdout(tmp_path):
    recs = cc12m_records(40)
    src = tmp_path / "train.jsonl.gz"
    write_jsonl_gz(src, recs)
    out = tmp_path / "flat.parquet"
    cmd = [sys.executable, "-m", "aleph", "data", "captions", str(src), "--fields",
           ",".join(FIELDS), "--order", "field", "--min-chars", "20", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{len(expected(recs, 'field', 20))}\n"
    assert "rows per field" in r.stderr
    first = out.read_bytes()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # the same flatten again
    assert r.returncode == 0 and r.stdout == f"{len(expected(recs, 'field', 20))}\n", r.stderr
    assert r.stderr.strip().endswith("the source is unchanged since): done, nothing written")
    assert out.read_bytes() == first
    r = subprocess.run([*cmd[:-3], "10", *cmd[-2:]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and "already exists" in r.stderr  # another recipe
    assert len(r.stderr.strip().splitlines()) == 1 and out.read_bytes() == first
    os.utime(src, ns=(out.stat().st_mtime_ns + 10**9,) * 2)  # the source changed since
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "already exists" in r.stderr


def test_e1_preset_choice_reads_from_and_writes_to_the_e1_data_dir(tmp_path):
    work = tmp_path / "work"
    (work / "data" / "e1").mkdir(parents=True)
    recs = cc12m_records(60)
    write_jsonl_gz(work / "data" / "e1" / "train.jsonl.gz", recs)
    env = {**__import__("os").environ, "ALEPH_WORK": str(work)}
    r = subprocess.run([sys.executable, "-m", "aleph", "data", "captions", "--e1"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    want = expected(recs, "record", 50)
    assert r.stdout == f"{len(want)}\n" and "E1's targets have 31,905,616" in r.stderr
    assert rows_of(work / "data" / "e1" / "captions.parquet") == want
    r = subprocess.run([sys.executable, "-m", "aleph", "data", "captions", "--e1"],
                       capture_output=True, text=True, timeout=120, env=env)  # rerun: done, exit 0
    assert r.returncode == 0 and r.stdout == f"{len(want)}\n" and "done, nothing written" in r.stderr
    r = subprocess.run([sys.executable, "-m", "aleph", "data", "captions", "--fields", "x"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "SRC, --out required" in r.stderr


def test_a_damaged_parquet_shard_is_one_line_naming_the_file_and_columns(tmp_path):
    # the reader captions use (readers.Parquet): the same one-line error for a page that
    # cannot be read after a readable footer, naming the columns asked for
    src = tmp_path / "s.parquet"
    recs = [{f: r.get(f) for f in FIELDS} for r in cc12m_records(1000)]  # their pages first
    pq.write_table(pa.Table.from_pylist(recs), src, compression="none")
    data = bytearray(src.read_bytes())
    for i in range(4, 400):  # the first data pages; the footer stays readable
        data[i] ^= 0xFF
    src.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"s\.parquet: columns \['caption_llava', "
                                        r"'caption_llava_short'\] are not readable") as e:
        flatten_captions(src, FIELDS, tmp_path / "o.parquet")
    assert "\n" not in str(e.value) and not (tmp_path / "o.parquet").exists()
    (tmp_path / "t.parquet").write_bytes(b"PAR1 not parquet PAR1")
    with pytest.raises(DataError, match=r"t\.parquet: not a readable parquet file \(\w+: "):
        flatten_captions(tmp_path / "t.parquet", FIELDS, tmp_path / "o.parquet")
