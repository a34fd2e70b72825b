"""`aleph data fetch --captions` through huggingface_hub against a stand-in hub on 127.0.0.1:
the short revision resolved and recorded, size and sha256 checked, an interrupted download
resumed with a Range request, a damaged one refused with nothing left claiming to be good,
a later resolution elsewhere refused, and a copied file verified with no network."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys

import pytest

from aleph.data.fetch import CAPTIONS_FILE, CAPTIONS_REPO, fetch_captions
from aleph.errors import DataError

COMMIT = "1c24bdb" + hashlib.sha1(b"e1").hexdigest()[7:]  # the short id's stand-in full id
OTHER = "1c24bdb" + "0" * 33  # another commit with that prefix


def _payload() -> bytes:
    lines = "".join(json.dumps({"key": f"{i:09d}", "caption_llava": f"caption {i} " * 8,
                                "caption_llava_short": f"short {i}"}) + "\n" for i in range(4000))
    return gzip.compress(lines.encode(), compresslevel=1, mtime=0)


def _files(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())


def test_first_fetch_resolves_records_and_verifies(hub, tmp_path):
    dest = tmp_path / "data" / "e1"
    lines: list[str] = []
    path = fetch_captions(dest, endpoint=hub.endpoint, say=lines.append)
    data = _payload()
    assert path == dest / CAPTIONS_FILE and path.read_bytes() == data
    record = json.loads((dest / f"{CAPTIONS_FILE}.fetch.json").read_text())
    assert record["revision"] == "1c24bdb" and record["commit"] == COMMIT
    assert (record["size"], record["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert record["licence"] == "CC-BY-SA-4.0"
    assert _files(dest) == [CAPTIONS_FILE, f"{CAPTIONS_FILE}.fetch.json"]  # no partials left
    assert any(m == "GET" and f"/resolve/{COMMIT}/" in p for m, p, _ in hub.requests)
    # later: verified against the record, no request at all (a copied file on a VM offline)
    n = len(hub.requests)
    lines.clear()
    assert fetch_captions(dest, endpoint="http://127.0.0.1:9", say=lines.append) == path
    assert len(hub.requests) == n and "matches its record" in lines[0] and "no download" in lines[0]
    # a copy that changed is refused, not replaced
    changed = data[:-1] + bytes([data[-1] ^ 1])
    path.write_bytes(changed)
    with pytest.raises(DataError, match=r"sha256 [0-9a-f]{64}, expected .*it is not replaced"):
        fetch_captions(dest, endpoint=hub.endpoint)
    assert path.read_bytes() == changed


def test_interrupted_download_resumes_with_a_range_request(hub, tmp_path):
    dest = tmp_path / "e1"
    hub.cut_gets, hub.cut_at = 3, 4_000  # as many cuts as one call makes attempts
    with pytest.raises(DataError, match=r"download of .* stopped at 12,000 of 45,149 bytes "
                                        r".*run the same command again to resume"):
        fetch_captions(dest, endpoint=hub.endpoint)
    assert not (dest / CAPTIONS_FILE).exists() and not any(dest.glob("*.fetch.json"))
    partial = list((dest / ".fetch").glob("*.part"))
    assert [p.stat().st_size for p in partial] == [12_000]
    hub.cut_gets = 0
    path = fetch_captions(dest, endpoint=hub.endpoint)
    assert path.read_bytes() == _payload()
    ranges = [r for m, _, r in hub.requests if m == "GET" and r]
    assert ranges == ["bytes=4000-", "bytes=8000-", "bytes=12000-"]  # never from 0 again


def test_damaged_download_is_refused_and_nothing_claims_to_be_good(hub, tmp_path):
    dest = tmp_path / "e1"
    hub.corrupt = True  # same size, one byte flipped, under the true sha256
    code = ("import sys\nfrom aleph.cli import main\n"
            "sys.exit(main(['data', 'fetch', '--captions', '--out', sys.argv[1]]))")
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "PYTHONPATH": os.getcwd()}
    r = subprocess.run([sys.executable, "-c", code, str(dest)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "is damaged: sha256" in r.stderr and "nothing kept" in r.stderr
    assert _files(dest) == []  # no file, no record, no partial
    hub.corrupt = False
    r = subprocess.run([sys.executable, "-c", code, str(dest)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert (dest / CAPTIONS_FILE).read_bytes() == _payload()


def test_a_revision_that_resolves_elsewhere_later_is_refused(hub, tmp_path):
    dest = tmp_path / "e1"
    fetch_captions(dest, endpoint=hub.endpoint)
    (dest / CAPTIONS_FILE).unlink()  # lost: the next call goes to the hub again
    hub.repos[CAPTIONS_REPO] = {OTHER: {CAPTIONS_FILE: b"other bytes"}}
    with pytest.raises(DataError, match=rf"revision 1c24bdb now resolves to commit {OTHER}.*"
                                        rf"recorded {COMMIT}.*refused"):
        fetch_captions(dest, endpoint=hub.endpoint)
    assert not (dest / CAPTIONS_FILE).exists()


def test_hub_unreachable_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with pytest.raises(DataError, match=r"cannot read the hub's record of .*needs network"):
        fetch_captions(tmp_path / "e1", endpoint="http://127.0.0.1:9")
