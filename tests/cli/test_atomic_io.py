"""aleph._io: atomic writes give files the ordinary umask mode; the durable writer."""

import hashlib
import os
import re
import stat

import pytest

from aleph._io import (
    DurableWriter,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_json,
    read_json_record,
)


def test_atomic_write_gets_the_umask_mode_not_mkstemps_0600(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x\n")
        atomic_write_json(tmp_path / "m.json", {"k": 1})
    finally:
        os.umask(old)
    for name in ("a.txt", "m.json"):  # readable by the other services of the work volume
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644
    assert read_json(tmp_path / "m.json") == {"k": 1}



def test_a_no_replace_write_never_overwrites_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "00000001.json"
    atomic_write_bytes(path, b"first", replace=False)
    with pytest.raises(FileExistsError):
        atomic_write_bytes(path, b"second", replace=False)
    assert path.read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000001.json"]
    atomic_write_bytes(path, b"third")  # the default replaces
    assert path.read_bytes() == b"third"


def test_durable_writer_writes_all_hashes_on_the_way_and_never_takes_over_a_path(tmp_path):
    data = os.urandom(3000)
    old = os.umask(0o022)
    try:
        with DurableWriter.create(tmp_path / "f.bin", len(data), flush_bytes=1024) as w:
            for i in range(0, len(data), 700):  # slices across several flushes
                w.write(data[i:i + 700])
            assert w.finish() == {"sha256": hashlib.sha256(data).hexdigest(), "size": 3000}
    finally:
        os.umask(old)
    assert (tmp_path / "f.bin").read_bytes() == data
    assert stat.S_IMODE((tmp_path / "f.bin").stat().st_mode) == 0o644
    target = tmp_path / "elsewhere"
    target.write_bytes(b"theirs")
    (tmp_path / "link").symlink_to(target)  # O_EXCL: neither followed nor replaced
    with pytest.raises(OSError, match=r"link: exists already, and is not replaced: move it away$"):
        DurableWriter.create(tmp_path / "link", 10)
    assert target.read_bytes() == b"theirs" and (tmp_path / "link").is_symlink()
    with DurableWriter.create(tmp_path / "short.bin", 8, error=ValueError) as w:
        w.write(b"1234")
        with pytest.raises(ValueError, match=r"short\.bin: 4 bytes written, expected 8$"):
            w.finish()


@pytest.mark.parametrize("text, message", [
    ("[1]", "a JSON list, expected an object with key, n, sha$"),
    ('{"key": "", "n": 1, "sha": "ab"}', "field 'key' is '', expected a non-empty string$"),
    ('{"key": "k", "n": true, "sha": "ab"}', "field 'n' is True, expected an integer >= 0$"),
    ('{"key": "k", "n": 1, "sha": "AB"}', "field 'sha' is 'AB', expected hex digits$"),
    ("[" * 50_000 + "]" * 50_000, r"invalid JSON \(JSON nested too deeply"),
    ("x" * 2000, "larger than the 1,024 B this input may have$"),
], ids=["a list", "empty string", "a bool", "no match", "deep", "large"])
def test_a_json_record_is_one_object_of_its_fields_or_one_line(tmp_path, text, message):
    fields = {"key": str, "n": int, "sha": (re.compile("[0-9a-f]+"), "hex digits")}
    (tmp_path / "r.json").write_text('{"key": "k", "n": 0, "sha": "ab", "more": []}')
    assert read_json_record(tmp_path / "r.json", 1024, fields)["more"] == []
    (tmp_path / "r.json").write_text(text)
    with pytest.raises(ValueError, match=message):
        read_json_record(tmp_path / "r.json", 1024 if len(text) < 50_000 else 1 << 20, fields)
