"""A hub repo written by someone else (the local stand-in hub): names that climb out of the
repo and files of another size than listed are refused in one line before any download,
through the CLI (exit 2, no traceback, token masked), and nothing is left behind."""

from __future__ import annotations

import json
import re
import time

import pytest

from aleph.sync import pull, push
from aleph.sync.hub import INDEX_NAME, HubDestination, PullLimits
from aleph.sync.index import INDEX_MAX, SyncError
from tests.sync.fake_hub import FakeHub
from tests.sync.test_hostile_dir import RUN, cli, one_line_refusal, small_run

TOKEN = "hf_aleph_hostile_hub_token_97531"
REPO_ID = "me/aleph-runs"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A hub holding one push of a small run; the CLI children reach it through HF_ENDPOINT."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with FakeHub(tmp_path / "hub", token=TOKEN) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        push(small_run(tmp_path / "work"), HubDestination(REPO_ID, endpoint=server.endpoint))
        yield server


def _head_files(hub: FakeHub) -> dict[str, str]:
    repo = hub.repos[REPO_ID]
    return repo["commits"][repo["head"]]


def _gets(hub: FakeHub, name: str) -> list:
    return [r for r in hub.requests if r[0] == "GET" and r[1].endswith(f"/{name}")]


@pytest.mark.parametrize("bad", [f"runs/../../evil/{INDEX_NAME}", f"../{INDEX_NAME}"])
def test_a_listing_with_a_climbing_name_is_one_line(hub, tmp_path, bad):
    files = _head_files(hub)
    files[bad] = files[f"{RUN}/{INDEX_NAME}"]
    into = tmp_path / "new-work"
    proc = cli(into, "runs", "pull", f"hf:{REPO_ID}", "--into", str(into))
    one_line_refusal(proc, f"sync destination hf:{REPO_ID}", repr(bad), "plain relative path")
    assert TOKEN not in proc.stderr
    assert not into.exists() or not any(into.iterdir())


def test_an_index_listed_above_the_cap_is_not_downloaded(hub, tmp_path):
    files = _head_files(hub)
    name = f"{RUN}/{INDEX_NAME}"
    files[name] = hub._put_blob(b" " * (INDEX_MAX + 1))  # valid JSON whitespace, just large
    into = tmp_path / "new-work"
    proc = cli(into, "runs", "pull", f"hf:{REPO_ID}", "--into", str(into))
    one_line_refusal(proc, f"sync destination hf:{REPO_ID}", name, f"at most {INDEX_MAX:,} B")
    assert _gets(hub, INDEX_NAME) == []


def test_a_file_listed_at_another_size_than_its_index_records_is_not_downloaded(hub, tmp_path):
    files = _head_files(hub)
    name = f"{RUN}/weights/final/model.safetensors"
    files[name] = hub._put_blob(b"\0" * 3_000_000)  # the index still records 100,000 B
    into = tmp_path / "new-work"
    proc = cli(into, "runs", "pull", f"hf:{REPO_ID}", "--into", str(into))
    one_line_refusal(proc, f"sync destination hf:{REPO_ID}", name, "listed as 3,000,000 B",
                     "100,000 B as its index records")
    assert _gets(hub, "model.safetensors") == []
    assert not (into / "runs").exists() and not list(into.glob(".aleph-pull-*"))


def _answer(handler, chunks, headers=(), etag="ab" * 20, status=200) -> None:
    """A hostile GET answer: the `headers`, then every chunk of `chunks` (an iterable of
    (bytes, seconds to wait first)) chunked, until the pull hangs up; 30 s at most."""
    handler.send_response(status)
    for k, v in (("ETag", f'"{etag}"'), ("X-Repo-Commit", "cd" * 20), *headers):
        handler.send_header(k, v)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    end = time.monotonic() + 30
    for data, wait in chunks:
        time.sleep(wait)
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        handler.wfile.flush()
        handler.sent = getattr(handler, "sent", 0) + len(data)
        if time.monotonic() > end:
            return


def _pull(hub: FakeHub, into, limits: PullLimits | None = None) -> str:
    """The one-line SyncError of an in-process pull (within 20 s, else the test fails)."""
    dest = HubDestination(REPO_ID, endpoint=hub.endpoint)
    if limits is not None:
        dest.limits = limits
    t0 = time.monotonic()
    with pytest.raises(SyncError) as e:
        pull(dest, into)
    assert time.monotonic() - t0 < 20
    assert not (into / "runs").exists() and not list(into.glob(".aleph-pull-*"))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_an_index_listed_without_a_size_is_not_downloaded(hub, tmp_path):
    hub.listed[f"{RUN}/{INDEX_NAME}"] = None
    msg = _pull(hub, tmp_path / "into")
    assert f"{RUN}/{INDEX_NAME}: listed without a size (None)" in msg and msg.endswith(
        "not downloaded")
    assert _gets(hub, INDEX_NAME) == []


def test_a_body_longer_than_listed_is_refused_at_its_first_byte_more(hub, tmp_path):
    """The listing and the index say 100,000 B; the GET sends 64 MiB (or would, forever)."""
    name = f"{RUN}/weights/final/model.safetensors"
    sent = []

    def endless(handler):
        try:
            _answer(handler, ((b"\0" * (1 << 20), 0) for _ in range(64)))
        finally:
            sent.append(getattr(handler, "sent", 0))
    hub.bodies[name] = endless
    msg = _pull(hub, tmp_path / "into")
    assert msg.endswith(f"downloading {name} at {_head_sha(hub)[:12]}: the body is longer than "
                        "the 100,000 B listed; refused at its first byte more, nothing pulled")
    time.sleep(0.5)
    assert sent and sent[0] < 32 << 20  # the pull hung up: the server could not send it all


@pytest.mark.parametrize("how", ["body", "headers"])
def test_a_trickling_answer_ends_at_the_minimum_rate_or_the_deadline(hub, tmp_path, how):
    """One byte every 0.1 s: the body is refused below the minimum rate; headers trickled
    byte by byte are ended by the deadline (each read alone would wait forever)."""
    name = f"{RUN}/{INDEX_NAME}"

    def trickle(handler):
        if how == "body":
            _answer(handler, ((b" ", 0.1) for _ in range(300)))
            return
        for byte in b"HTTP/1.1 200 OK\r\nX-Padding: " + b"x" * 300:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            time.sleep(0.1)
    hub.bodies[name] = trickle
    msg = _pull(hub, tmp_path / "into", PullLimits(min_rate=1000.0, window_s=1.0, answer_s=1.0))
    assert msg.startswith(f"sync destination hf:{REPO_ID}: downloading {name} at ")
    assert ("below the minimum 1,000 B/s; nothing pulled" if how == "body" else
            "not done within its deadline (1 s + ") in msg  # + the index's size / rate


def _head_sha(hub: FakeHub) -> str:
    return hub.repos[REPO_ID]["head"]


def _listing(hub: FakeHub, *extra) -> bytes:
    """The head's listing as the hub sends it, with `extra` siblings appended."""
    sha = _head_sha(hub)
    siblings = [{"rfilename": p, "size": hub.blob(b).stat().st_size}
                for p, b in sorted(_head_files(hub).items())]
    return json.dumps({"id": REPO_ID, "sha": sha, "siblings": [*siblings, *extra]}).encode()


_NOT_A_LISTING = "reading the repo failed: the hub's answer is not a repo listing ("


@pytest.mark.parametrize("answer, says", [
    ("<html>not json", _NOT_A_LISTING + "JSONDecodeError: Expecting value"),
    ("a sibling 5", _NOT_A_LISTING),
    ("a list as a name", "the repo lists a file: path ['x'] is not a plain relative path"),
    ("a name of 1 MB", "the repo lists a file: path '/xxx")])
def test_a_malformed_repo_listing_is_one_line_for_pull_push_and_latest(hub, tmp_path, answer,
                                                                        says):
    """Not a traceback from the listing's parser (JSONDecodeError, TypeError): one line
    naming the destination."""
    hub.listing = {"<html>not json": b"<html>not json", "a sibling 5": _listing(hub, 5),
                   "a list as a name": _listing(hub, {"rfilename": ["x"], "size": 1}),
                   "a name of 1 MB": _listing(hub, {"rfilename": "/" + "x" * 10**6})}[answer]
    into = tmp_path / "new-work"
    proc = cli(into, "runs", "pull", f"hf:{REPO_ID}", "--into", str(into))
    assert len(one_line_refusal(proc, f"sync destination hf:{REPO_ID}", says)) < 1000
    work = tmp_path / "work"
    proc = cli(work, "runs", "push", str(work / RUN), "--to", f"hf:{REPO_ID}")
    one_line_refusal(proc, f"sync destination hf:{REPO_ID}", says)
    with pytest.raises(SyncError, match=re.escape(says)):
        HubDestination(REPO_ID, endpoint=hub.endpoint).latest(RUN)


@pytest.mark.parametrize("how", ["trickled", "endless"])
def test_a_repo_listing_is_read_bounded_in_time_and_bytes(hub, tmp_path, how):
    """huggingface_hub reads a listing whole, with no timeout: a byte every 0.1 s kept a pull
    waiting, 64 MiB of whitespace before the listing were all read into memory."""
    def answer(handler):
        if how == "trickled":
            _answer(handler, ((b" ", 0.1) for _ in range(250)))
        else:
            _answer(handler, [*((b" " * (1 << 20), 0) for _ in range(64)), (_listing(hub), 0)])
            handler.wfile.write(b"0\r\n\r\n")
        handler.close_connection = True
    hub.listing = answer
    msg = _pull(hub, tmp_path / "into", PullLimits(min_rate=1000.0, window_s=1.0, answer_s=1.0)
                if how == "trickled" else None)
    assert msg.startswith(f"sync destination hf:{REPO_ID}: reading the repo")
    assert ("below the minimum 1,000 B/s" if how == "trickled" else
            "the body is longer than the 67,108,864 B a repo listing may have") in msg


@pytest.mark.parametrize("where", ["listing", "file"])
def test_an_error_answer_s_body_is_read_bounded(hub, tmp_path, where):
    """A 500 whose body is endless: huggingface_hub's status check read an error's body
    whole; the pull reads a little of it and hangs up."""
    sent = []

    def endless(handler):
        try:
            _answer(handler, ((b"x" * (1 << 20), 0) for _ in range(64)), status=500)
        finally:
            sent.append(getattr(handler, "sent", 0))
            handler.close_connection = True
    if where == "listing":
        hub.listing = endless
    else:
        hub.bodies[f"{RUN}/weights/final/model.safetensors"] = endless
    msg = _pull(hub, tmp_path / "into")
    time.sleep(0.5)
    assert sent and sent[0] < 32 << 20  # the pull hung up: the server could not send it all
    assert "failed: HfHubHTTPError: Server error '500" in msg and len(msg) < 1000, msg


@pytest.mark.parametrize("where", ["listing", "file"])
def test_an_error_answer_s_body_is_read_at_the_minimum_rate(hub, tmp_path, where):
    """A 500 whose body trickles (review 3 F4): the error body was read without the rate
    check, so only the listing's deadline (60 s + 64 MiB at the rate: 35 min) ended it."""
    def trickle(handler):
        try:
            _answer(handler, ((b"x", 0.1) for _ in range(300)), status=500)
        finally:
            handler.close_connection = True
    if where == "listing":
        hub.listing = trickle
    else:
        hub.bodies[f"{RUN}/weights/final/model.safetensors"] = trickle
    msg = _pull(hub, tmp_path / "into", PullLimits(min_rate=1000.0, window_s=1.0,
                                                   answer_s=1.0, listing_max=1 << 30))
    assert "below the minimum 1,000 B/s; nothing pulled" in msg, msg
