"""The hub destination through huggingface_hub itself, against the local stand-in hub."""

from __future__ import annotations

import json

import pytest

from aleph._io import sha256_file
from aleph.record.layout import SYNC_STATE as STATE_FILE
from aleph.sync import SyncError, pull, push
from aleph.sync.hub import HubDestination
from aleph.sync.index import run_path
from tests.sync.fake_hub import FakeHub

TOKEN = "hf_aleph_sync_test_token_0123456789"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # nothing of ~/.cache is touched
    with FakeHub(tmp_path / "hub", token=TOKEN) as server:
        yield server


def test_hub_roundtrip_one_commit_per_push_only_changed_files(hub, run_copy, tmp_path):
    dest = HubDestination("me/aleph-runs", endpoint=hub.endpoint)
    first = push(run_copy, dest)
    assert first.sent == first.files and first.step == 12
    repo = hub.repos["me/aleph-runs"]
    assert len(repo["commits"]) == 2  # the repo's initial commit, then the push
    assert push(run_copy, dest).sent == 0 and len(repo["commits"]) == 2  # nothing to commit

    (run_copy / "eval.json").write_text(json.dumps({"mean": 0.5}))
    third = push(run_copy, dest)
    assert third.sent == 1 and third.files == first.files + 1 and len(repo["commits"]) == 3
    assert third.revision == repo["head"]

    into = tmp_path / "new-work"
    (res,) = pull(HubDestination("me/aleph-runs", endpoint=hub.endpoint), into)
    assert res.revision == repo["head"] and res.step == 12
    for rel in ("eval.json", "weights/final/model.safetensors",
                "checkpoints/step-00000012/trainer.pt"):
        assert sha256_file(res.path / rel) == sha256_file(run_copy / rel)
    # the token travelled as a header only: it is in no file on either side
    written = [*res.path.rglob("*"), *run_copy.rglob("*"), *(tmp_path / "hub").rglob("*")]
    assert not [p for p in written if p.is_file() and TOKEN.encode() in p.read_bytes()]
    assert not (tmp_path / "hf-home").exists() or not any((tmp_path / "hf-home").rglob("token"))


def test_hub_pull_rejects_a_damaged_file(hub, run_copy, tmp_path):
    dest = HubDestination("me/aleph-runs", endpoint=hub.endpoint)
    push(run_copy, dest)
    files = hub.repos["me/aleph-runs"]["commits"][hub.repos["me/aleph-runs"]["head"]]
    blob = hub.blob(files[f"{run_path(run_copy)}/config.json"])
    blob.write_bytes(blob.read_bytes().replace(b"a2_dense", b"a1_dense"))
    into = tmp_path / "new-work"
    with pytest.raises(SyncError, match="hf:me/aleph-runs: runs/.*/config.json: sha256 .*damaged"):
        pull(dest, into)
    assert not (into / "runs").exists()
    # push --verify downloads and hashes every file (the generic check) and commits the
    # damaged one again; the pull then restores the run
    line = push(run_copy, dest, verify=True).line()
    assert "1 of them damaged at the destination and sent again" in line
    (res,) = pull(dest, into)
    assert sha256_file(res.path / "config.json") == sha256_file(run_copy / "config.json")


def test_hub_without_the_token_fails_clearly(hub, run_copy, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(Exception, match="401"):
        push(run_copy, HubDestination("me/aleph-runs", endpoint=hub.endpoint))
    assert "me/aleph-runs" not in hub.repos
    assert not (run_copy / STATE_FILE).exists() or "hf:" not in (run_copy / STATE_FILE).read_text()
