import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aleph.data import check_row_counts, load_captions
from aleph.errors import DataError

CAPS = ["a red dog", "  two spaces kept ", "unicode: café ☕", ""]


def test_text_file_one_caption_per_line(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("\n".join(CAPS) + "\n", encoding="utf-8")
    assert load_captions(p) == CAPS
    p.write_bytes("a\r\nb\u2028still b\n".encode())  # CRLF stripped; U+2028 is not a newline
    assert load_captions(p) == ["a", "b\u2028still b"]


def test_jsonl_and_json_read_the_caption_field(tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"caption": c, "x": 1}) + "\n"
                                              for c in CAPS))
    assert load_captions(tmp_path / "c.jsonl") == CAPS
    (tmp_path / "c.json").write_text(json.dumps([{"text": c} for c in CAPS]))
    assert load_captions(tmp_path / "c.json", column="text") == CAPS
    with pytest.raises(DataError, match=r"c\.json\[0\].*'caption' field.*\['text'\]"):
        load_captions(tmp_path / "c.json")
    (tmp_path / "bad.jsonl").write_text('{"caption": "ok"}\n{"caption": 3}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2.*'caption' is int"):
        load_captions(tmp_path / "bad.jsonl")


def test_parquet_column(tmp_path):
    p = tmp_path / "c.parquet"
    pq.write_table(pa.table({"caption_llava": CAPS, "id": list(range(4))}), p)
    assert load_captions(p, column="caption_llava") == CAPS
    with pytest.raises(DataError, match=r"no column 'caption'.*caption_llava"):
        load_captions(p)
    pq.write_table(pa.table({"caption": ["a", None]}), p)
    with pytest.raises(DataError, match="row 1 is NoneType"):
        load_captions(p)


def test_missing_or_unsupported_files(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_captions(tmp_path / "missing.parquet")
    (tmp_path / "c.csv").write_text("a\n")
    with pytest.raises(DataError, match="unsupported"):
        load_captions(tmp_path / "c.csv")
    (tmp_path / "d.txt").mkdir()  # a directory is a shard directory: this one has none
    with pytest.raises(DataError, match="holds no caption shards"):
        load_captions(tmp_path / "d.txt")


def test_row_count_mismatch_names_both_sides():
    check_row_counts(10, 10)
    with pytest.raises(DataError) as e:
        check_row_counts(31905615, 31905616, "tokens of cc12m.parquet", "targets/cc12m")
    msg = str(e.value)
    assert "31905615" in msg and "31905616" in msg
    assert "cc12m.parquet" in msg and "targets/cc12m" in msg


def test_hub_ids_offline_give_a_clear_error(tmp_path):
    """The hub code path, with downloads forbidden: both loaders say why, as a DataError."""
    code = (
        "from aleph.data import load_captions, load_tokenizer\n"
        "from aleph.errors import DataError\n"
        "for call in (lambda: load_captions('org/captions-that-are-not-here'),\n"
        "             lambda: load_tokenizer('bert-base-uncased')):\n"
        "    try:\n        call()\n    except DataError as e:\n        print('DataError:', e)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "ALEPH_WORK": str(tmp_path), "HF_HOME": str(tmp_path / "hf-home")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, cwd=os.getcwd())
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("DataError:")]
    assert len(lines) == 2, out.stdout + out.stderr
    assert "org/captions-that-are-not-here" in lines[0] and "network" in lines[0]
    assert "bert-base-uncased" in lines[1] and "network" in lines[1]
    # the tokenizer's offline error names the bundle a real run can use instead
    assert "aleph data fetch" in lines[1] and str(tmp_path / "data" / "offline") in lines[1]


@pytest.mark.parametrize("name,body", [("c.jsonl", b'{"caption": "a"}\n{"caption": "\xff"}\n'),
                                       ("c.json", b'[{"caption": "\xff"}]')])
def test_json_sources_that_are_not_utf8_are_data_errors(tmp_path, name, body):
    (tmp_path / name).write_bytes(body)
    with pytest.raises(DataError, match="not UTF-8"):
        load_captions(tmp_path / name)


def test_parquet_with_damaged_pages_is_a_data_error(tmp_path):
    p = tmp_path / "c.parquet"
    pq.write_table(pa.table({"caption": [f"caption number {i}" for i in range(1000)]}), p)
    data = bytearray(p.read_bytes())
    for i in range(4, 200):  # the first data page; the footer stays readable
        data[i] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"c\.parquet: column 'caption' is not readable") as e:
        load_captions(p)
    assert "\n" not in str(e.value)


def _lying_parquet(path, captions, claimed: int) -> None:
    """A parquet of `captions` whose footer (file and row group) says `claimed` rows."""
    import struct

    import pyarrow as pa
    import pyarrow.parquet as pq

    def zigzag(n: int) -> bytes:
        n, out = (n << 1) ^ (n >> 63), b""
        while n >= 0x80:
            out, n = out + bytes([(n & 0x7F) | 0x80]), n >> 7
        return out + bytes([n])

    pq.write_table(pa.table({"caption": captions}), path, compression="none")
    data = bytearray(path.read_bytes())
    start = len(data) - 8 - struct.unpack("<I", data[-8:-4])[0]
    old, new = b"\x16" + zigzag(len(captions)), b"\x16" + zigzag(claimed)
    assert len(old) == len(new)
    data[start:-8] = bytes(data[start:-8]).replace(old, new)
    path.write_bytes(bytes(data))


def test_a_parquet_footer_that_overstates_its_rows_is_refused_by_the_hash_pass(tmp_path):
    """The launch's row check must not trust a footer the hash pass saw lie: 4,095 captions
    counted as 4,096 passed against 4,096 targets and failed only after the run existed."""
    from aleph.data.captions import open_captions
    from aleph.errors import DataError

    path = tmp_path / "lie.parquet"
    _lying_parquet(path, [f"caption {i}" for i in range(95)], 96)
    src = open_captions(str(path))
    assert src.count_rows() == 96  # the footer
    with pytest.raises(DataError, match=r"column 'caption': 95 rows read but 96 counted before "
                                        r"reading \(a footer that overstates its rows"):
        src.sha256()
    _lying_parquet(tmp_path / "ok.parquet", [f"caption {i}" for i in range(95)], 95)
    honest = open_captions(str(tmp_path / "ok.parquet"))
    honest.sha256()  # no count taken before: the rows hashed become the count
    assert honest.count_rows() == 95
