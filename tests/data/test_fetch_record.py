"""The fetch record of `aleph data fetch --captions` (issue 32, item 9): offline it proves
only that the file matches the record, and says so; an expected sha256 (`--sha256`) that a
forger cannot set refuses a forged pair, a hub that answers another digest, and is what the
line names; a record that is a list, lacks a field, is 400 MB, nested 100k deep, a FIFO or
a link is one line, read bounded (the child's bytes read measured)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from aleph.data.fetch import CAPTIONS_FILE, fetch_captions
from aleph.errors import DataError
from tests.data.test_fetch import COMMIT, _payload
from tests.data.test_fetch_hostile import _one_line, fetch

REAL = hashlib.sha256(_payload()).hexdigest()
OFFLINE = "http://127.0.0.1:9"


def _forged(dest):
    """A 65-byte file beside a record that claims E1's revision, a commit and its sha256."""
    dest.mkdir(parents=True)
    data = b"not the captions, but its own record says it is: 65 bytes of it!\n"
    assert len(data) == 65
    (dest / CAPTIONS_FILE).write_bytes(data)
    record = {"repo": "CaptionEmporium/conceptual-captions-cc12m-llavanext",
              "file": CAPTIONS_FILE, "revision": "1c24bdb", "commit": COMMIT, "size": 65,
              "sha256": hashlib.sha256(data).hexdigest(), "licence": "CC-BY-SA-4.0"}
    (dest / f"{CAPTIONS_FILE}.fetch.json").write_text(json.dumps(record))
    return data


def test_offline_the_record_proves_only_a_match_and_says_so(tmp_path):
    dest = tmp_path / "e1"
    _forged(dest)
    lines: list[str] = []
    fetch_captions(dest, endpoint=OFFLINE, say=lines.append)
    print(lines[0])
    assert "matches its record" in lines[0] and "cannot prove it" in lines[0]
    assert "verified" not in lines[0]


def test_an_expected_sha256_refuses_a_forged_pair(hub, tmp_path):
    dest = tmp_path / "e1"
    data = _forged(dest)
    hub.endpoint = OFFLINE  # offline: only the expected digest can tell
    r, _, _ = fetch(hub, dest, tmp_path, args=["--sha256", REAL])
    line = _one_line(r)
    print(line)
    assert f"records sha256 {hashlib.sha256(data).hexdigest()}, not the expected {REAL} " \
           "(--sha256)" in line
    assert (dest / CAPTIONS_FILE).read_bytes() == data  # refused, not removed


def test_an_expected_sha256_is_checked_against_the_hub_before_any_download(hub, tmp_path):
    dest = tmp_path / "e1"
    with pytest.raises(DataError, match=rf"gives sha256 {REAL} .*not the expected {'0' * 64} "
                                        r"\(--sha256\); refused, nothing downloaded"):
        fetch_captions(dest, endpoint=hub.endpoint, expect_sha256="0" * 64)
    assert not any(m == "GET" and "/resolve/" in p for m, p, _ in hub.requests)
    lines: list[str] = []
    fetch_captions(dest, endpoint=hub.endpoint, expect_sha256=REAL.upper())
    fetch_captions(dest, endpoint=OFFLINE, expect_sha256=REAL, say=lines.append)
    assert f"sha256 {REAL}, the expected digest (--sha256)" in lines[0]
    with pytest.raises(DataError, match=r"--sha256 'abc': expected 64 hex digits"):
        fetch_captions(dest, endpoint=OFFLINE, expect_sha256="abc")


def _record(path, text: str | bytes):
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


@pytest.mark.parametrize("content, message", [
    ("[1, 2]", "a JSON list, expected an object with repo, file, revision"),
    (json.dumps({"repo": "r", "file": "f", "revision": "v", "commit": "c" * 40,
                 "size": 3}), "field 'sha256' is None, expected hex digits"),
    (json.dumps({"repo": "r", "file": "f", "revision": "v", "commit": "c" * 40,
                 "size": -3, "sha256": "0" * 64}), "field 'size' is -3, expected a size in bytes"),
    ("[" * 100_000 + "]" * 100_000, "larger than the 65,536 B this input may have"),
    ("[" * 30_000 + "]" * 30_000, "JSON nested too deeply to parse"),  # within the size bound
    ('{"repo": "r"}'.encode("utf-16"), "not UTF-8 text"),
])
def test_a_malformed_record_is_one_line(tmp_path, content, message):
    dest = tmp_path / "e1"
    dest.mkdir()
    path = dest / f"{CAPTIONS_FILE}.fetch.json"
    _record(path, content)
    with pytest.raises(DataError, match=rf"fetch record {path}: .*{message}") as e:
        fetch_captions(dest, endpoint=OFFLINE)
    assert "\n" not in str(e.value)


def test_a_400_mb_record_is_refused_reading_64_kib(hub, tmp_path):
    dest = tmp_path / "e1"
    dest.mkdir()
    record = dest / f"{CAPTIONS_FILE}.fetch.json"
    with open(record, "wb") as f:  # sparse: 400 MB that take no disk
        f.write(b'{"repo": "' + b" " * 1000)
        f.truncate(400 << 20)
    io: dict = {}
    r, _, _ = fetch(hub, dest, tmp_path, io=io)
    line = _one_line(r)
    print(line, f"(read {io['rchar']:,} B in all)")
    assert "larger than the 65,536 B this input may have" in line
    assert io["rchar"] < 64 << 20  # the interpreter's own files, and 64 KiB of the record


def test_a_fifo_or_linked_record_is_one_line(tmp_path):
    from aleph.data.fetch import read_record

    fifo = tmp_path / "fifo.fetch.json"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match=r"fifo.fetch.json: not a regular file \(a FIFO\)"):
        read_record(fifo)
    link = tmp_path / "link.fetch.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text("{}")
    with pytest.raises(DataError, match=r"link.fetch.json: not a regular file \(a symbolic link\)"):
        read_record(link)
