"""A hub repo written by someone else (the local stand-in hub): names that climb out of the
repo and files of another size than listed are refused in one line before any download,
through the CLI (exit 2, no traceback, token masked), and nothing is left behind."""

from __future__ import annotations

import pytest

from aleph.sync import push
from aleph.sync.hub import INDEX_NAME, HubDestination
from aleph.sync.index import INDEX_MAX
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
