"""A directory destination written by someone else: links, FIFOs, devices, huge files and
odd names where the destination keeps objects and indexes. A push never deletes or writes
outside it, a pull never reads more than its index records, never blocks, and every refusal
is one line naming the destination and the entry (through the CLI: exit 2, no traceback)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aleph._io import atomic_write_json
from aleph.sync import pull, push
from aleph.sync.index import INDEX_MAX, run_path
from aleph.sync.local import DirDestination
from tests.sync.conftest import REPO, child_env

RUN = "runs/smoke/a2_dense-s9"
WEIGHTS_SIZE = 100_000  # the small run's largest file
FSIZE_LIMIT, AS_LIMIT = WEIGHTS_SIZE, 2 << 30
"""RLIMIT_FSIZE and RLIMIT_AS of a CLI child: no file it writes may grow past the largest size
an index here records, and it may map 2 GiB at most, so a pull that copied more than that from
/dev/zero or a huge file dies of SIGXFSZ, or one that read it into memory of MemoryError,
instead of filling disk or RAM."""


def small_run(work: Path) -> Path:
    """A run directory as the trainer leaves one (records and final weights; no resume state):
    enough for push and pull, built in milliseconds."""
    d = work / RUN
    atomic_write_json(d / "config.json", {"arm": "a2_dense", "seed": 9, "preset": "smoke"})
    atomic_write_json(d / "manifest.json", {"run_id": "a2_dense-s9", "launches": []})
    atomic_write_json(d / "metrics.json", {"step": 3, "total_steps": 3})
    (d / "weights" / "final").mkdir(parents=True)
    (d / "weights" / "final" / "model.safetensors").write_bytes(os.urandom(WEIGHTS_SIZE))
    atomic_write_json(d / "weights" / "final" / "model_config.json", {"d_model": 8})
    return d


@pytest.fixture
def pushed(tmp_path) -> tuple[Path, Path]:
    """(the bucket, the run at it) after one ordinary push of a small run."""
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    run_dir = small_run(tmp_path / "work")
    assert push(run_dir, DirDestination(bucket)).revision == "r1"
    return bucket, bucket / run_path(run_dir)


def cli(work: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -m aleph ARGS` capped at FSIZE_LIMIT and AS_LIMIT, killed after `timeout` s."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    return subprocess.run([sys.executable, "-m", "aleph", *args], cwd=REPO,
                          env=child_env(work, PYTHONDONTWRITEBYTECODE="1"),
                          capture_output=True, text=True, timeout=timeout, preexec_fn=cap)


def one_line_refusal(proc: subprocess.CompletedProcess, *parts: str) -> str:
    """The child refused with exit 2 and exactly one line on stderr holding every part."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])
    return lines[0]


def victim(tmp_path: Path) -> Path:
    """A directory outside the destination holding files a push must never touch."""
    v = tmp_path / "victim"
    v.mkdir()
    (v / "thesis.tex").write_text("years of work")
    (v / ("ab" * 32)).write_text("named like an object")
    return v


def obj(base: Path, snap_files: dict, rel: str) -> Path:
    sha = snap_files[rel]["sha256"]
    return base / "objects" / sha[:2] / sha


def index_of(base: Path) -> dict:
    return json.loads((base / "indexes" / "00000001.json").read_text())


# --- item 2: pruning never follows a link, never deletes a name that is not its own ----------

@pytest.mark.parametrize("where", ["objects/xx", "objects", "indexes"])
def test_a_push_never_deletes_through_a_link_in_the_destination(pushed, tmp_path, where):
    bucket, base = pushed
    v = victim(tmp_path)
    planted = base / where
    if where == "objects/xx":  # a link beside the object folders
        planted = base / "objects" / "zz"
        planted.symlink_to(v, target_is_directory=True)
    else:  # the folder itself replaced by a link to the victim
        os.rename(base / where, tmp_path / f"{where}-moved")
        planted.symlink_to(v, target_is_directory=True)
    work = tmp_path / "work"
    (work / RUN / "metrics.json").write_text('{"step": 3, "note": "changed"}')  # a push that prunes
    proc = cli(work, "runs", "push", str(work / RUN), "--to", str(bucket))
    one_line_refusal(proc, f"sync destination {bucket}", str(planted.relative_to(bucket)),
                     "symbolic link")
    assert sorted(p.name for p in v.iterdir()) == sorted(["thesis.tex", "ab" * 32])
    assert (v / "thesis.tex").read_text() == "years of work"


def test_a_push_refuses_foreign_entries_where_objects_live(pushed, tmp_path):
    bucket, base = pushed
    sub = next((base / "objects").iterdir())
    (sub / "notes.txt").write_text("someone else's")
    work = tmp_path / "work"
    (work / RUN / "metrics.json").write_text('{"step": 3, "note": "changed"}')
    proc = cli(work, "runs", "push", str(work / RUN), "--to", str(bucket))
    one_line_refusal(proc, f"sync destination {bucket}", f"{sub.name}/notes.txt",
                     "64 hex digits")
    assert (sub / "notes.txt").read_text() == "someone else's"
    assert DirDestination(bucket).latest(RUN).revision == "r1"  # nothing was published


def test_a_push_prunes_its_own_objects_and_leaves_nfs_leftovers_alone(pushed, tmp_path):
    bucket, base = pushed
    work = tmp_path / "work"
    old = obj(base, index_of(base)["files"], "metrics.json")
    silly = old.parent / ".nfs000000000012abcd00000001"  # a file removed while open, on NFS
    silly.write_text("open elsewhere")
    for n in range(2):  # two more snapshots: the first one's metrics object is unreferenced
        (work / RUN / "metrics.json").write_text(json.dumps({"step": 3, "n": n}))
        push(work / RUN, DirDestination(bucket))
    assert not old.exists() and silly.read_text() == "open elsewhere"
    assert sorted(p.name for p in (base / "indexes").iterdir()) == ["00000002.json",
                                                                      "00000003.json"]


# --- item 3: a pull reads no more than the index records, and never blocks ------------------

def _replace(path: Path, how: str, tmp_path: Path) -> None:
    path.unlink()
    if how == "dev-zero":
        path.symlink_to("/dev/zero")
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "huge":  # sparse: 64 GiB that take no room
        with open(path, "wb") as f:
            f.truncate(64 << 30)
    elif how == "link-to-copy":  # a link to a file with the right bytes is still a link
        copy = tmp_path / "elsewhere"
        copy.write_bytes(b"x")
        path.symlink_to(copy)


@pytest.mark.parametrize("how", ["dev-zero", "fifo", "huge", "link-to-copy"])
def test_a_pull_of_an_object_that_is_not_a_regular_file_of_its_size_is_refused(
        pushed, tmp_path, how):
    bucket, base = pushed
    rel = "weights/final/model.safetensors"
    target = obj(base, index_of(base)["files"], rel)
    _replace(target, how, tmp_path)
    into = tmp_path / "new-work"
    t0 = time.monotonic()
    proc = cli(into, "runs", "pull", str(bucket), "--into", str(into), timeout=30)
    assert time.monotonic() - t0 < 30
    expected = "a regular file of 100,000 B" if how != "huge" else "100,000 B"
    one_line_refusal(proc, f"sync destination {bucket}", target.name[:16], expected)
    assert not (into / "runs").exists()
    assert not list(into.glob(".aleph-pull-*"))


@pytest.mark.parametrize("how", ["dev-zero", "fifo", "huge"])
def test_a_pull_of_an_index_that_is_not_a_small_regular_file_is_refused(pushed, tmp_path, how):
    bucket, base = pushed
    index = base / "indexes" / "00000001.json"
    _replace(index, how, tmp_path)
    into = tmp_path / "new-work"
    t0 = time.monotonic()
    proc = cli(into, "runs", "pull", str(bucket), "--into", str(into), timeout=30)
    assert time.monotonic() - t0 < 30
    line = one_line_refusal(proc, f"sync destination {bucket}", "indexes/00000001.json")
    assert ("regular file" in line) if how != "huge" else (f"{INDEX_MAX:,} B" in line)
    assert not (into / "runs").exists()


# --- item 10 (directory parts): odd names are one line, not a traceback ---------------------

def test_an_index_named_with_a_non_ascii_digit_is_one_line(pushed, tmp_path):
    bucket, base = pushed
    (base / "indexes" / "\u00b2.json").write_text("{}")  # '²'.isdigit() is True
    into = tmp_path / "new-work"
    proc = cli(into, "runs", "pull", str(bucket), "--into", str(into))
    one_line_refusal(proc, f"sync destination {bucket}", "'\u00b2.json'", "8 ASCII digits")
    proc = cli(tmp_path / "work", "runs", "push", str(tmp_path / "work" / RUN), "--to", str(bucket))
    one_line_refusal(proc, f"sync destination {bucket}", "'\u00b2.json'")


def test_a_nul_byte_in_an_index_path_is_one_line(pushed, tmp_path):
    bucket, base = pushed
    index = index_of(base)
    index["files"]["config\u0000.json"] = index["files"]["config.json"]
    (base / "indexes" / "00000001.json").write_text(json.dumps(index))
    into = tmp_path / "new-work"
    proc = cli(into, "runs", "pull", str(bucket), "--into", str(into))
    one_line_refusal(proc, "indexes/00000001.json", "'config\\x00.json'", "plain relative path")
    assert not (into / "runs").exists()


# --- item 8: a live pull's staging is judged by its lock, not its pid -----------------------

def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_live_pull_keeps_its_staging_whatever_its_recorded_pid(pushed, tmp_path):
    from aleph.sync.dest import PAUSE_ENV

    bucket, _ = pushed
    into = tmp_path / "new-work"
    live = subprocess.Popen([sys.executable, "-m", "aleph", "runs", "pull", str(bucket),
                             "--into", str(into)], cwd=REPO,
                            env=child_env(into, **{PAUSE_ENV: "1"}), stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 60
        while "sync pause hook" not in live.stderr.readline():
            assert time.monotonic() < deadline and live.poll() is None
        (staging,) = into.glob(".aleph-pull-*")
        # As seen from another PID namespace the live pull's pid means nothing: here, dead.
        renamed = staging.with_name(f".aleph-pull-{_dead_pid()}-{staging.name.split('-')[-1]}")
        os.rename(staging, renamed)
        (res,) = pull(DirDestination(bucket), into)  # a second pull, its cleanup included
        assert res.path == into / RUN
        assert renamed.is_dir() and any(renamed.rglob("*.json")), "a live pull's staging removed"
    finally:
        live.kill()
        live.wait(30)
    (into / RUN).rename(tmp_path / "moved-aside")  # now its lock is free: the next pull clears it
    pull(DirDestination(bucket), into)
    assert not list(into.glob(".aleph-pull-*"))


def test_cleanup_leaves_a_link_and_a_lockless_staging_alone(pushed, tmp_path):
    bucket, _ = pushed
    into = tmp_path / "new-work"
    into.mkdir()
    v = victim(tmp_path)
    (into / f".aleph-pull-{_dead_pid()}-aaaaaaaa").symlink_to(v, target_is_directory=True)
    foreign = into / f".aleph-pull-{_dead_pid()}-bbbbbbbb"
    foreign.mkdir()
    (foreign / "data.bin").write_text("not written by a pull that locks")
    pull(DirDestination(bucket), into)
    assert (v / "thesis.tex").read_text() == "years of work"
    assert (foreign / "data.bin").is_file()


@pytest.mark.parametrize("planted", ["runs/smoke/a2_dense-s9/checkpoints/step-00000090",
                                     "runs/mine/inner"])
def test_a_pull_never_writes_into_a_run_directory_you_have(tmp_path, planted):
    """A destination's "run" whose path lies inside one of your runs (its resume state, its
    weights) is refused whole: your run is left exactly as it was."""
    from aleph.sync.index import SyncError

    bucket = tmp_path / "bucket"
    bucket.mkdir()
    if planted.endswith("inner"):
        mine = tmp_path / "work" / "runs" / "mine"
        atomic_write_json(mine / "config.json", {"arm": "a2_dense", "seed": 1, "preset": "smoke"})
    else:
        mine = small_run(tmp_path / "work")
    before = sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*"))
    stranger = small_run(tmp_path / "src")
    nested = tmp_path / "other" / planted
    nested.parent.mkdir(parents=True, exist_ok=True)
    os.rename(stranger, nested)
    push(nested, DirDestination(bucket))
    with pytest.raises(SyncError, match="a pull never writes into a run directory|is not a run "
                                        "path") as e:
        pull(DirDestination(bucket), tmp_path / "work", run=planted)
    assert "nothing was pulled" in str(e.value)
    with pytest.raises(SyncError):  # every run: the planted one is refused or not listed
        pull(DirDestination(bucket), tmp_path / "work")
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*")) == before


@pytest.mark.parametrize("own", [False, True], ids=["foreign", "the-source"])
def test_a_pulled_config_does_not_choose_where_your_run_is_pushed(tmp_path, monkeypatch, capsys,
                                                                  own):
    """The sync_to a pulled config.json came with was written by whoever writes the
    destination: a bare relaunch does not adopt it and `runs push` without --to refuses it;
    the source itself (a lost VM resuming from its bucket) stays the run's destination."""
    from aleph.cli import main
    from aleph.train.command import _recorded

    bucket, attacker = tmp_path / "bucket", tmp_path / "attacker"
    bucket.mkdir()
    attacker.mkdir()
    run_dir = small_run(tmp_path / "work")
    sync_to = str(bucket if own else attacker)
    atomic_write_json(run_dir / "config.json", {"format_version": 1, "arm": "a2_dense", "seed": 9,
                                                "preset": "smoke", "sync_to": sync_to})
    push(run_dir, DirDestination(bucket))
    work = tmp_path / "pulled"
    pull(DirDestination(bucket), work)
    monkeypatch.setenv("ALEPH_WORK", str(work))
    fields = _recorded("smoke", "a2_dense", 9, None)
    out = capsys.readouterr().out
    assert (fields.get("sync_to") == sync_to) is own
    assert (f"was pulled from {bucket}; the sync_to its config came with ({sync_to}) is not "
            "used" in out) is not own
    rc = main(["runs", "push", "smoke/a2_dense-s9"])
    err = capsys.readouterr().err
    assert rc == (0 if own else 2), err
    if not own:
        assert f"pulled from {bucket}; the sync_to its config.json came with ({sync_to}) was " \
               "chosen there" in err and err.count("\n") == 1
    assert list(attacker.iterdir()) == []


def test_a_deep_planted_tree_and_the_last_index_number_are_one_line_each(pushed, tmp_path):
    """A folder 1,100 levels deep under runs/ was a RecursionError on `runs pull`; a planted
    indexes/99999999.json made the next push write a 9-digit name its own reader refuses."""
    bucket, at = pushed
    fds = [os.open(bucket / "runs", os.O_RDONLY)]
    for _ in range(1100):  # a level at a time: a path this long is past PATH_MAX
        os.mkdir("d", dir_fd=fds[-1])
        fds.append(os.open("d", os.O_RDONLY, dir_fd=fds[-1]))
    try:
        [got] = pull(DirDestination(bucket), tmp_path / "pulled")  # the real run, nothing else
    finally:  # removed bottom up: pytest's recursive cleanup could not
        os.close(fds.pop())
        while len(fds) > 0:
            os.rmdir("d", dir_fd=fds[-1])
            os.close(fds.pop())
    assert got.run == RUN
    (at / "indexes" / "99999999.json").write_bytes((at / "indexes" / "00000001.json").read_bytes())
    before = sorted(p.name for p in (at / "indexes").iterdir())
    atomic_write_json(tmp_path / "work" / RUN / "metrics.json", {"step": 4, "total_steps": 4})
    from aleph.sync.index import SyncError

    with pytest.raises(SyncError, match=r"snapshot numbers used up \(the newest is "
                                        r"99999999\.json\)"):
        push(tmp_path / "work" / RUN, DirDestination(bucket))
    assert sorted(p.name for p in (at / "indexes").iterdir()) == before
