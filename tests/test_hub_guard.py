"""A hub mirror that answers paths where the hub sends hashes (`aleph._hub`), in both
environments: its ETag of `../` segments, or its X-Repo-Commit, aimed at a victim path
outside HF_HOME, and repo listings naming `../x.json` or `/abs.json`. Every command that
downloads through huggingface_hub refuses in one line (exit 2) and the victim stays absent:
the E1 stack's (hub 1.x) tokenizer download and `runs pull`, the teacher set's (hub 0.36)
`targets extract` of a hub teacher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aleph._hub import HubAnswerRefused, check_etag, check_repo_name
from tests.hostile_hub import COMMIT, HostileHub

REPO = Path(__file__).resolve().parents[1]
TEACHER_PY = REPO / ".venv-teachers" / "bin" / "python"
FILES = {"config.json": b'{"model_type": "bert"}', "tokenizer_config.json": b"{}",
         "tokenizer.json": b"{}", "model.safetensors": b"\0" * 64,
         "runs/r/.aleph-sync.json": b"{}"}


def climbing(target: Path) -> str:
    """`../` segments enough to climb from any cache directory to / and down to `target`."""
    return "../" * 40 + str(target).lstrip("/")


def run(python, tmp_path: Path, hub: HostileHub, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf-home"),
           "ALEPH_WORK": str(tmp_path / "work"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    return subprocess.run([str(python), "-m", "aleph", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)


def one_line(r: subprocess.CompletedProcess, *parts: str) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (
        r.returncode, r.stderr[-3000:])
    for p in parts:
        assert p in lines[0], (p, lines[0])
    return lines[0]


def teacher_python() -> Path:
    if not TEACHER_PY.is_file():
        pytest.skip(".venv-teachers absent: ./aleph-dev setup-teachers builds it")
    return TEACHER_PY


@pytest.mark.parametrize("field", ["ETag", "commit"])
def test_e1_tokenizer_download_writes_nothing_where_the_mirror_points(tmp_path, field):
    victim = tmp_path / "victim"
    bad = climbing(victim)
    hub = HostileHub("me/teach", FILES, etag=bad if field == "ETag" else None,
                     commit=bad if field == "commit" else None)
    caps = tmp_path / "caps.txt"
    caps.write_text("a caption\n")
    with hub:
        r = run(sys.executable, tmp_path, hub, "data", "tokens", "--tokenizer", "me/teach",
                "--captions", str(caps))
    assert not victim.exists() and not Path(f"{victim}.lock").exists(), sorted(
        os.listdir(tmp_path))
    print(one_line(r, "tokenizer 'me/teach'", f"{field} '../../", "refused before"))


def test_e1_runs_pull_refuses_a_climbing_etag_naming_it(tmp_path):
    victim = tmp_path / "victim"
    with HostileHub("me/runs", FILES, etag=climbing(victim)) as hub:
        r = run(sys.executable, tmp_path, hub, "runs", "pull", "hf:me/runs", "--into",
                str(tmp_path / "into"))
    assert not victim.exists()
    print(one_line(r, "ETag '../../", "not a hex digest"))


def test_teacher_hub_download_writes_nothing_where_the_mirror_points(tmp_path):
    victim = tmp_path / "victim"
    caps = tmp_path / "caps.txt"
    caps.write_text("a caption\n")
    with HostileHub("me/teach", FILES, etag=climbing(victim)) as hub:
        r = run(teacher_python(), tmp_path, hub, "targets", "extract", "--captions",
                str(caps), "--out", str(tmp_path / "out"), "--teachers", "me/teach")
    assert not victim.exists() and not Path(f"{victim}.lock").exists(), sorted(
        os.listdir(tmp_path))
    print(one_line(r, "ETag '../../", "not a hex digest"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["../x.json", "/abs.json"])
def test_teacher_listing_naming_a_path_out_is_one_line(tmp_path, name):
    caps = tmp_path / "caps.txt"
    caps.write_text("a caption\n")
    with HostileHub("me/teach", FILES, extra_names=(name,)) as hub:
        r = run(teacher_python(), tmp_path, hub, "targets", "extract", "--captions",
                str(caps), "--out", str(tmp_path / "out"), "--teachers", "me/teach")
        gets = [p for m, p in hub.requests if "/resolve/" in p]
    print(one_line(r, "teacher me/teach@main", repr(name), "not a plain relative path"))
    assert gets == []  # refused from the listing, before any file was asked for


@pytest.mark.parametrize("name", ["../x", "/abs", "a//b", "a\\b", "a/./b", "", "a/\x00b"])
def test_a_listed_name_that_is_not_a_plain_relative_path_is_refused(name):
    with pytest.raises(HubAnswerRefused, match="not a plain relative path"):
        check_repo_name(name, "hub me/x")
    assert check_repo_name("sub/config.json", "hub me/x") == "sub/config.json"


@pytest.mark.parametrize("etag", ["../x", "abc/def0123", "", "W/", "0123456"])
def test_an_etag_that_is_not_hex_is_refused(etag):
    with pytest.raises(HubAnswerRefused, match="not a hex digest"):
        check_etag(etag)
    check_etag("0123456789abcdef" * 4)


def test_an_honest_mirror_still_serves_a_teacher_checked_and_linked_into_its_blobs(tmp_path):
    """The teacher download at the listing's commit, file by file, passes the directory
    check (its links lead into the repo's blobs) and records that commit."""
    code = ("import json, sys; from aleph.targets.extract import resolve;"
            "from aleph.targets.teachers import TeacherSpec;"
            "p, rec, cfg = resolve(TeacherSpec('me/teach'), {'bert'});"
            "print(json.dumps([p, rec, cfg]))")
    with HostileHub("me/teach", FILES) as hub:
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_ENDPOINT": hub.endpoint,
               "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
        env.pop("HF_HUB_OFFLINE", None)
        r = subprocess.run([str(teacher_python()), "-c", code], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    path, rec, cfg = json.loads(r.stdout.strip().splitlines()[-1])
    assert rec == {"name": "me/teach", "local": False, "revision": COMMIT}
    assert cfg == {"model_type": "bert"}
    assert sorted(os.listdir(path)) == ["config.json", "model.safetensors", "tokenizer.json",
                                        "tokenizer_config.json"]  # runs/... is not top level
    assert all(os.path.islink(os.path.join(path, n)) for n in os.listdir(path))
