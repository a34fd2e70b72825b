"""The extraction plan written once by racing shards, bad `--shard` values, and a stopped
consensus (no teacher venv needed: the plan and the consensus are numpy/torch only)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time

import pytest
from targets_helpers import run_cli, wait_for
from test_consensus import make_teachers

from aleph.cli import main
from aleph.errors import EXIT_STOPPED, StoreError
from aleph.targets.consensus import RESULT_FILE, STATE_FILE, run_consensus
from aleph.targets.extract_plan import PLAN_FILE, publish_plan, require_extracted

PLAN = {"format": "aleph-extract", "rows": 300, "chunk_rows": 64,
        "teachers": [{"name": "/m/tiny-bert", "local": True}, {"name": "roberta-base"}]}


def _publish(args) -> bool:
    out, go = args
    while time.time() < go:  # every process starts at the same instant
        pass
    return publish_plan(out, PLAN)


def test_racing_shards_write_the_plan_once_and_all_accept_it(tmp_path):
    out = tmp_path / "out"
    go = time.time() + 1.0
    with multiprocessing.get_context("fork").Pool(8) as pool:
        wrote = pool.map(_publish, [(out, go)] * 8)
    print(f"8 racing shards: {sum(wrote)} wrote the plan, {wrote.count(False)} matched it")
    assert sum(wrote) == 1
    assert json.loads((out / PLAN_FILE).read_text()) == PLAN
    assert os.listdir(out) == [PLAN_FILE]  # no temporary file left behind


def test_a_plan_of_other_options_or_a_foreign_out_is_refused_and_untouched(tmp_path):
    out = tmp_path / "out"
    publish_plan(out, PLAN)
    before = (out / PLAN_FILE).read_bytes()
    with pytest.raises(StoreError, match=r"used other inputs or options \(chunk_rows differ\)"):
        publish_plan(out, {**PLAN, "chunk_rows": 32})
    assert (out / PLAN_FILE).read_bytes() == before
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match=r"not empty \(notes.txt\) and holds no extract-plan"):
        publish_plan(foreign, PLAN)
    assert os.listdir(foreign) == ["notes.txt"]


def test_the_consensus_names_the_first_chunk_a_shard_has_not_written(tmp_path):
    out = tmp_path / "ex"
    publish_plan(out, PLAN)
    for slug in ("tiny-bert", "roberta-base"):
        (out / slug).mkdir()
        for c in (0, 3):
            (out / slug / f"chunk_{c:05d}.npy").write_bytes(b"")
    with pytest.raises(StoreError, match=r"chunk chunk_00001.npy of teacher tiny-bert is "
                                         r"missing \(3 of 5 missing\)"):
        require_extracted([str(out / "tiny-bert"), str(out / "roberta-base")])
    require_extracted([str(tmp_path)])  # no plan beside it: not an extraction, not checked


@pytest.mark.parametrize("shard", ["3/3", "-1/2", "1/0", "a/b", "1", "1/2/3"])
def test_a_bad_shard_is_one_line_before_anything_is_read(shard, tmp_path, capsys):
    rc = main(["targets", "extract", "--captions", str(tmp_path / "absent.txt"), "--out",
               str(tmp_path / "out"), "--teachers", str(tmp_path), f"--shard={shard}"])
    err = capsys.readouterr().err
    print(err.strip())
    assert rc == 2 and err.count("\n") == 1
    assert f"--shard {shard!r}: expected I/N" in err and "0 <= I < N" in err
    assert not (tmp_path / "out").exists()


def test_a_consensus_stopped_by_repeated_signals_exits_76_and_resumes(tmp_path):
    _, dirs = make_teachers(tmp_path, rows=(300, 200, 250))
    clean = tmp_path / "clean"
    run_consensus(dirs, clean, fit_rows=500)
    out, marker = tmp_path / "out", tmp_path / "marker"
    proc = run_cli(["targets", "consensus", "--teachers", *dirs, "--out", str(out),
                    "--fit-rows", "500"],
                   {"ALEPH_FAULT": "consensus-block:1",
                    "ALEPH_FAULT_FILE": str(marker)})
    wait_for(marker, proc)  # chunk 0 published, chunk 1 half written
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGINT):
        proc.send_signal(sig)
        time.sleep(0.01)
    stdout, stderr = proc.communicate(timeout=60)
    line = stdout.strip().splitlines()[-1]
    print(f"exit {proc.returncode}: {line}")
    assert proc.returncode == EXIT_STOPPED and "Traceback" not in stderr, stderr
    assert f"stopped by SIGTERM: the fit and 1 finished chunk(s) in {out} kept" in line
    assert "resume with: aleph targets consensus --teachers" in line
    assert not [n for n in os.listdir(out) if n.endswith((".partial", ".save"))]
    assert (out / STATE_FILE).is_file() and not (out / RESULT_FILE).exists()
    first = (out / "chunk_000.npy").stat()
    proc = run_cli(["targets", "consensus", "--teachers", *dirs, "--out", str(out),
                    "--fit-rows", "500"])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    again = (out / "chunk_000.npy").stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    for name in ("chunk_000.npy", "chunk_001.pt", "chunk_002.safetensors"):
        assert (out / name).read_bytes() == (clean / name).read_bytes()


def test_a_signal_while_the_done_summary_prints_still_exits_0(tmp_path, monkeypatch, capsys):
    """The work is committed before the summary prints: a SIGTERM then (two, as Slurm sends)
    must not turn a complete consensus into 'stopped' (exit 76), nor kill the process."""
    _, dirs = make_teachers(tmp_path, rows=(300, 200))
    out, real_print = tmp_path / "out", print

    def print_under_signals(*a, **kw):
        if a and "float16 consensus of" in str(a[0]):  # the success summary
            signal.raise_signal(signal.SIGTERM)  # the handler runs before this returns
            signal.raise_signal(signal.SIGTERM)
        real_print(*a, **kw)

    monkeypatch.setattr("builtins.print", print_under_signals)
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        rc = main(["targets", "consensus", "--teachers", *dirs, "--out", str(out),
                   "--fit-rows", "500"])
        late = signal.getsignal(signal.SIGTERM)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    stdout = capsys.readouterr().out
    real_print(f"exit {rc}: {stdout.strip()}")
    assert rc == 0 and "stopped" not in stdout and "resume with" not in stdout, stdout
    assert f"{out}: 500 x 24 float16 consensus of 5 teachers" in stdout
    assert (out / RESULT_FILE).is_file()
    assert late == signal.SIG_IGN  # the process is ending: a later signal must not kill it
