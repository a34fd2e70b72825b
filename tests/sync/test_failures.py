"""A destination that fails at push or pull time (disk full, a broken mount, a hub that
cannot be reached or refuses the token) is one error naming the destination and what was
not written, with the token masked: never a traceback, and never a damaged snapshot."""

from __future__ import annotations

import contextlib
import json
import resource
import signal
import socket

import pytest

from aleph.cli import main
from aleph.sync import SyncError, pull, push
from aleph.sync.hub import HubDestination
from aleph.sync.index import run_path
from aleph.sync.local import DirDestination
from tests.sync.fake_hub import FakeHub

TOKEN = "hf_aleph_failures_test_token_24680"


@contextlib.contextmanager
def _full_disk(room: int):
    """Writes of this process past `room` bytes per file fail with EFBIG, as on a full mount
    (RLIMIT_FSIZE with SIGXFSZ ignored: root-proof, and no planted entry at the destination,
    which a push now refuses before writing)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (room, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


def test_an_unwritable_directory_destination_is_one_error_naming_it(run_copy, tmp_path, capsys):
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    dest = DirDestination(bucket)
    run = run_path(run_copy)
    assert push(run_copy, dest).revision == "r1"
    (run_copy / "eval.json").write_text(json.dumps({"mean": 0.5, "pad": "x" * 200_000}))
    with _full_disk(100_000):
        assert main(["runs", "push", str(run_copy), "--to", str(bucket)]) == SyncError.exit_code
    err = capsys.readouterr().err
    assert err.startswith(f"aleph runs: error: sync destination {bucket}: "), err
    assert f"snapshot 2 of {run} not written; snapshot 1 is unchanged" in err
    assert "Traceback" not in err
    assert dest.latest(run).revision == "r1"
    (res,) = pull(dest, tmp_path / "new-work")  # the previous snapshot is whole
    assert (res.revision, res.step) == ("r1", 12)


class _MountLostAfterTheIndex(DirDestination):
    """The mount goes away at the worst moment for a push: its index is in place, the
    pruning of older snapshots has not started (the CI race in test_lost_vm)."""

    def _write_index(self, run: str, number: int, data: bytes) -> None:
        super()._write_index(run, number, data)
        if number == 2:
            self.root.rename(self.root.with_name("bucket-away"))
            self.root.write_text("the mount is gone")


def test_a_push_whose_pruning_fails_is_a_push_that_happened(run_copy, tmp_path):
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    dest = _MountLostAfterTheIndex(bucket)
    assert push(run_copy, dest).revision == "r1"
    (run_copy / "eval.json").write_text(json.dumps({"mean": 0.5}))
    res = push(run_copy, dest)  # snapshot 2 was written: recorded as the last sync
    assert res.revision == "r2"
    assert res.unpruned.startswith(f"sync destination {bucket}: Not a directory"), res.unpruned
    assert f"pruning the older snapshots of {run_path(run_copy)} failed" in res.unpruned
    assert "older snapshots kept, the next push prunes them" in res.line()
    away = DirDestination(tmp_path / "bucket-away")
    assert away.latest(run_path(run_copy)).revision == "r2"
    (got,) = pull(away, tmp_path / "new-work")
    assert json.loads((got.path / "eval.json").read_text()) == {"mean": 0.5}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_hub_that_cannot_be_reached_or_refuses_the_token_is_one_error(run_copy, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    gone = HubDestination("me/aleph-runs", endpoint=f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(SyncError, match=r"^sync destination hf:me/aleph-runs: reading the repo "
                       r"failed: ConnectError"):
        push(run_copy, gone)

    with FakeHub(tmp_path / "hub", token=TOKEN + "-other") as hub:
        refused = HubDestination("me/aleph-runs", endpoint=hub.endpoint)
        with pytest.raises(SyncError, match=r"reading the repo failed: .*401.* \(no access: is "
                           "HF_TOKEN set") as e:
            push(run_copy, refused)
        with pytest.raises(SyncError, match="no access"):
            pull(refused, tmp_path / "new-work")
    assert TOKEN not in str(e.value)
    assert not (tmp_path / "new-work").exists()


@pytest.mark.parametrize("route", ["create", "commit"])
def test_a_hub_that_never_answers_a_push_is_one_error_at_its_deadline(run_copy, tmp_path,
                                                                      monkeypatch, route):
    """huggingface_hub waits on a silent hub forever (no timeout on create_repo or
    create_commit): `aleph runs push` (the main thread) ends at the push's deadline."""
    import time

    from aleph.sync.hub import PullLimits

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with FakeHub(tmp_path / "hub", token=TOKEN) as hub:
        hub.hang.add(route)
        dest = HubDestination("me/aleph-runs", endpoint=hub.endpoint)
        dest.limits = PullLimits(answer_s=1.0, min_rate=1e9)
        t0 = time.monotonic()
        with pytest.raises(SyncError) as e:
            push(run_copy, dest)
        took = time.monotonic() - t0
    what = "creating the repo" if route == "create" else "the commit of "
    assert str(e.value).startswith(f"sync destination hf:me/aleph-runs: {what}"), e.value
    assert "not done within its deadline (1 s + " in str(e.value)
    assert took < 20, took  # 1 s asked; unbounded it waited forever
