"""`aleph data fetch --captions` against a hostile server or a planted partial file (issue 32,
items 3-5): each case is the real command in a child process, its exit code, its one line,
its wall time and the bytes it wrote (/proc/self/io wchar) measured, and a victim file
outside --out whose bytes and size must not change."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys

import pytest

from aleph.data.fetch import CAPTIONS_FILE, CAPTIONS_REPO
from tests.data.test_fetch import COMMIT, _payload

SIZE = len(_payload())
PART = f"{CAPTIONS_FILE}.{hashlib.sha256(_payload()).hexdigest()[:16]}.part"
_CHILD = """import json, sys, time
from aleph.cli import main
t0 = time.monotonic()
rc = main(['data', 'fetch', '--captions', '--out', sys.argv[1], *sys.argv[3:]])
io = dict(line.split(': ') for line in open('/proc/self/io').read().splitlines())
counts = {k: int(io[k]) for k in ('rchar', 'wchar')}
open(sys.argv[2], 'w').write(json.dumps({**counts, 'main_s': time.monotonic() - t0,
                                         'end': time.time()}))
sys.exit(rc)
"""


def fetch(hub, dest, tmp_path, timeout=30, args=(), io=None, **limits):
    """(completed process, seconds in the command, bytes written) of the CLI in a child
    process (the seconds measured there, from the command's start: the interpreter's own
    start, slow on a loaded machine, is not the fetch's), its bytes read and written put in
    `io` when given; limits are ALEPH_FETCH_<NAME> values."""
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "PYTHONPATH": os.getcwd(),
           "PYTHONDONTWRITEBYTECODE": "1",
           **{f"ALEPH_FETCH_{k.upper()}": str(v) for k, v in limits.items()}}
    report = tmp_path / "io.json"
    r = subprocess.run([sys.executable, "-c", _CHILD, str(dest), str(report), *args],
                       capture_output=True, text=True, timeout=timeout, env=env)
    counts = json.loads(report.read_text())
    gets = [t for t, (m, p, _) in zip(hub.times, hub.requests, strict=True)
            if m == "GET" and "/resolve/" in p]
    counts["transfer_s"] = counts["end"] - gets[0] if gets else None  # first GET to exit
    counts["after_last_s"] = counts["end"] - hub.times[-1] if hub.times else None
    if io is not None:
        io.update(counts)
    return r, counts["main_s"], counts["wchar"]


def _one_line(r):
    assert r.returncode == 2 and r.stderr.count("\n") == 1, (r.returncode, r.stderr)
    return r.stderr.strip()


def _victim(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the user's own file\n")
    return victim


@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_a_linked_partial_is_refused_and_its_target_untouched(hub, tmp_path, link):
    """A hard link needs no O_NOFOLLOW to write through: its other name is the victim."""
    dest, victim = tmp_path / "e1", _victim(tmp_path)
    (dest / ".fetch").mkdir(parents=True)
    (os.symlink if link == "symbolic" else os.link)(victim, dest / ".fetch" / PART)
    r, _, _ = fetch(hub, dest, tmp_path)
    line = _one_line(r)
    print(line)
    kind = "a symbolic link" if link == "symbolic" else "a file with 2 hard links"
    assert f"partial download {dest / '.fetch' / PART} is {kind}" in line
    assert victim.read_bytes() == b"the user's own file\n"  # bytes and size unchanged
    assert (dest / ".fetch" / PART).is_symlink() == (link == "symbolic")  # not ours: left
    assert os.stat(victim).st_nlink == (2 if link == "hard" else 1)
    assert not any(m == "GET" and "/resolve/" in p for m, p, _ in hub.requests)  # refused before any transfer


def test_a_symlinked_partial_dir_is_refused(hub, tmp_path):
    dest, elsewhere = tmp_path / "e1", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / ".fetch").symlink_to(elsewhere)
    r, _, _ = fetch(hub, dest, tmp_path)
    assert "is not a directory this command made" in _one_line(r)
    assert list(elsewhere.iterdir()) == []


def test_a_fifo_partial_is_refused_at_once(hub, tmp_path):
    dest = tmp_path / "e1"
    (dest / ".fetch").mkdir(parents=True)
    os.mkfifo(dest / ".fetch" / PART)
    io: dict = {}
    r, _, _ = fetch(hub, dest, tmp_path, timeout=60, io=io)  # before: blocked in open() forever
    line = _one_line(r)
    print(line, f"(exit {io['after_last_s']:.2f} s after the file record's answer)")
    assert "is a FIFO; expected a regular file" in line and io["after_last_s"] < 5


def test_a_longer_body_is_cut_at_the_announced_size(hub, tmp_path):
    hub.extra = 16 << 20  # 16 MiB more than the file, no Content-Length
    dest = tmp_path / "e1"
    r, _, wrote = fetch(hub, dest, tmp_path)
    line = _one_line(r)
    print(line, f"(wrote {wrote:,} B for a {SIZE:,} B file)")
    assert "the body is longer than the announced 45,149 bytes" in line
    # everything the process wrote (partial, stderr, any cache) stays near the file's size;
    # before: the whole body, three times
    assert wrote < SIZE + (256 << 10)


def test_a_content_encoding_is_refused_never_decoded(hub, tmp_path):
    hub.encoded = gzip.compress(b"\0" * (64 << 20), compresslevel=1)  # 64 MiB inflated
    dest = tmp_path / "e1"
    r, _, wrote = fetch(hub, dest, tmp_path)
    line = _one_line(r)
    print(line, f"(wrote {wrote:,} B; the body inflates to {64 << 20:,} B)")
    assert "Content-Encoding 'gzip'" in line and wrote < SIZE + (256 << 10)
    gets = [r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]
    assert len(gets) == 1  # refused, not retried


def test_a_trickling_server_is_cut_at_the_deadline(hub, tmp_path):
    hub.trickle = 2.0  # one byte every 2 s: 45,149 bytes would take 25 hours
    dest = tmp_path / "e1"
    # each read returns within the 3 s window: only the one deadline for the transfer stops it
    io: dict = {}
    r, _, _ = fetch(hub, dest, tmp_path, timeout=60, io=io, deadline_s=4, rate_window_s=3,
                    min_rate=1000, attempts=10)
    line = _one_line(r)
    print(line, f"(first GET to exit: {io['transfer_s']:.1f} s)")
    assert "not done within the 4 s deadline" in line
    assert io["transfer_s"] < 4 + 2 + 3  # the deadline, one read, slack; before: 25 hours


def test_a_trickling_server_is_cut_below_the_minimum_rate(hub, tmp_path):
    hub.trickle = 2.0
    dest = tmp_path / "e1"
    io: dict = {}
    r, _, _ = fetch(hub, dest, tmp_path, timeout=60, io=io, rate_window_s=1, min_rate=1000,
                    attempts=2)
    line = _one_line(r)
    print(line, f"(first GET to exit: {io['transfer_s']:.1f} s)")
    assert "below the minimum 1,000 B/s" in line and "stopped at 2 of 45,149 bytes" in line
    assert io["transfer_s"] < 2 * 1 + 1 + 3  # two windows, a pause, slack


def test_headers_trickled_byte_by_byte_are_cut_at_the_deadline(hub, tmp_path):
    hub.trickle_head = 1.0  # each read returns within its timeout; the headers never end
    io: dict = {}
    r, _, _ = fetch(hub, tmp_path / "e1", tmp_path, timeout=60, io=io, head_timeout_s=2)
    line = _one_line(r)
    heads = [t for t, (m, _, _) in zip(hub.times, hub.requests, strict=True) if m == "HEAD"]
    took = io["end"] - heads[0]
    print(line, f"(HEAD to exit: {took:.1f} s)")
    assert "no answer within its deadline" in line and took < 2 + 1 + 3


@pytest.mark.parametrize("method", ["HEAD", "GET"])
def test_a_redirect_loop_sends_at_most_the_limit(hub, tmp_path, method):
    hub.self_redirect = method  # a relative 302 to the same path, forever
    dest = tmp_path / "e1"
    r, _, _ = fetch(hub, dest, tmp_path, timeout=40, redirects=3)
    line = _one_line(r)
    print(line)
    assert "more than 3 redirects" in line
    assert sum(1 for m, p, _ in hub.requests if m == method and "/resolve/" in p) == 4  # the first and 3 redirects


def test_a_negative_size_is_named(hub, tmp_path):
    hub.linked_size = "-5"
    r, _, _ = fetch(hub, tmp_path / "e1", tmp_path)
    line = _one_line(r)
    print(line)
    assert "size '-5' (X-Linked-Size) is not a size in bytes" in line and ".part" not in line


def test_bad_limit_values_are_one_line(hub, tmp_path):
    r, _, _ = fetch(hub, tmp_path / "e1", tmp_path, min_rate="fast")
    assert "ALEPH_FETCH_MIN_RATE='fast': expected a number > 0" in _one_line(r)


def test_the_token_goes_to_its_own_origin_only(hub, tmp_path, monkeypatch):
    """Kept from the first round, now that redirects are followed here: a GET redirected to
    another origin (a CDN, or a server someone else runs) does not carry HF_TOKEN."""
    from aleph.data.fetch import fetch_captions
    from tests.data.fake_dataset_hub import FakeDatasetHub

    hub.token = "hf_secret_token"
    monkeypatch.setenv("HF_TOKEN", hub.token)
    with FakeDatasetHub() as cdn:
        cdn.add(CAPTIONS_REPO, COMMIT, {CAPTIONS_FILE: _payload()})
        hub.redirect_gets = cdn.endpoint
        path = fetch_captions(tmp_path / "e1", endpoint=hub.endpoint)
        assert path.read_bytes() == _payload()
        assert cdn.requests and set(cdn.auth_seen) == {None}
    assert hub.auth_seen and set(hub.auth_seen) == {"Bearer hf_secret_token"}


def test_an_error_status_reads_a_bounded_part_of_its_body(hub, tmp_path):
    """A 500 whose body is 64 MiB (or endless): a few KiB of it are read, not all of it."""
    hub.error_body = 64 << 20
    r, _, _ = fetch(hub, tmp_path / "e1", tmp_path, timeout=120)
    line = _one_line(r)
    print(line, f"(the server sent {hub.error_sent} B)")
    # what the socket buffers took before the client hung up, never the whole body
    assert hub.error_sent and max(hub.error_sent) < 32 << 20, hub.error_sent
    assert "HTTP 500 Internal Server Error" in line and "run the same command again" in line
