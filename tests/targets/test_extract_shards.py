"""`aleph targets extract --shard I/N` and its stops, with tiny random teachers (teacher venv).

Two tiny teachers (BERT and RoBERTa, built by tiny_teachers.py), 300 captions in chunks of
64 rows: five chunks, so with three shards shard 0 owns chunks 0 and 3, shard 1 chunks 1
and 4, shard 2 chunk 2. Every shard is its own process, as on a cluster.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from targets_helpers import REPO, wait_for
from test_extract import HELPER, done, run_teacher, teacher_python

from aleph.errors import EXIT_STOPPED
from aleph.targets.consensus import run_consensus
from aleph.targets.sources import chunk_files_in

pytestmark = pytest.mark.slow
ROWS, CHUNK, N_CHUNKS = 300, 64, 5
ARCHS = ("tiny-bert", "tiny-roberta")
OPTS = ["--chunk-rows", str(CHUNK), "--batch-size", "16", "--max-length", "32"]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """(captions, teachers argument, the OUT of one unsharded extraction)."""
    teacher_python()
    root = tmp_path_factory.mktemp("shards")
    r = random.Random(1)
    words = "a dog cat runs on the green grass near big red house with a child at night".split()
    caps = root / "caps.txt"
    caps.write_text("\n".join(" ".join(r.choice(words) for _ in range(r.randint(2, 30)))
                              for _ in range(ROWS)) + "\n")
    done(run_teacher([str(HELPER), "build", str(root / "models"), str(caps)]))
    teachers = ",".join(str(root / "models" / a) for a in ARCHS)
    clean = root / "clean"
    done(run_teacher(extract_args(caps, clean, teachers)))
    return caps, teachers, clean


def extract_args(caps, out, teachers, *extra: str) -> list[str]:
    return ["-m", "aleph", "targets", "extract", "--captions", str(caps), "--out", str(out),
            "--teachers", teachers, *OPTS, *extra]


def chunks(out) -> dict[str, bytes]:
    return {f"{a}/{os.path.basename(p)}": open(p, "rb").read()
            for a in ARCHS for p in chunk_files_in(out / a)}


def consensus_cli(out, dest) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aleph", "targets", "consensus", "--teachers",
                           *[str(out / a) for a in ARCHS], "--out", str(dest), "--fit-rows",
                           "200"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})


def test_three_shard_processes_give_the_bytes_of_one_run_and_consensus_waits_for_all(two,
                                                                                   tmp_path):
    caps, teachers, clean = two
    out = tmp_path / "sharded"
    first, _ = done(run_teacher(extract_args(caps, out, teachers, "--shard", "0/3")))
    assert f"{out}: shard 0/3 done: its 2 chunk(s) of every teacher in place" in first, first
    early = consensus_cli(out, tmp_path / "early")
    print(f"consensus after shard 0/3 only: exit {early.returncode}: {early.stderr.strip()}")
    assert early.returncode == 2 and early.stderr.count("\n") == 1, early.stderr
    assert "chunk_00001.npy of teacher tiny-bert is missing (3 of 5 missing)" in early.stderr
    assert not (tmp_path / "early").exists()
    procs = [run_teacher(extract_args(caps, out, teachers, "--shard", f"{i}/3")) for i in (1, 2)]
    outs = [done(p)[0] for p in procs]
    assert sum("next: aleph targets consensus" in o for o in outs) >= 1, outs
    got, want = chunks(out), chunks(clean)
    assert sorted(got) == sorted(want) and len(want) == len(ARCHS) * N_CHUNKS
    same = [k for k in want if got[k] == want[k]]
    print(f"3 shards vs one unsharded run: {len(same)} of {len(want)} chunk files byte-identical")
    assert len(same) == len(want)
    assert (out / "extract.json").is_file()
    run_consensus([str(clean / a) for a in ARCHS], tmp_path / "c1", fit_rows=200)
    after = consensus_cli(out, tmp_path / "c2")
    assert after.returncode == 0, after.stderr
    for p in chunk_files_in(tmp_path / "c1"):
        assert open(p, "rb").read() == (tmp_path / "c2" / os.path.basename(p)).read_bytes()


def test_a_shard_stopped_by_repeated_sigterms_keeps_its_chunks_and_resumes_the_rest(two,
                                                                                  tmp_path):
    caps, teachers, clean = two
    out, marker = tmp_path / "out", tmp_path / "marker"
    args = extract_args(caps, out, teachers, "--shard", "1/3")
    proc = run_teacher(args, {"ALEPH_FAULT": "extract-batch:4",
                              "ALEPH_FAULT_FILE": str(marker)})
    wait_for(marker, proc, timeout=300)  # chunk 1 of both teachers done, chunk 4 begun
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
        proc.send_signal(sig)  # as Slurm does at a time limit: several within milliseconds
        time.sleep(0.01)
    stdout, stderr = proc.communicate(timeout=120)
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    print(f"exit {proc.returncode}: {line}")
    assert proc.returncode == EXIT_STOPPED, stderr[-2000:]
    assert ("stopped by SIGTERM: shard 1/3: 1 of 2 chunks of teacher tiny-bert complete, 1 of 2 "
            "chunks of teacher tiny-roberta complete, kept") in line
    assert line.endswith("--shard 1/3") and "resume with: aleph targets extract" in line
    assert "Traceback" not in stderr
    kept = {p: os.stat(p) for a in ARCHS for p in chunk_files_in(out / a)}
    assert sorted(os.path.basename(p) for p in kept) == ["chunk_00001.npy"] * 2
    assert not [n for a in ARCHS for n in os.listdir(out / a) if n.endswith(".partial")]
    _, err = done(run_teacher(args))
    assert "2 chunks of 5 in this process, 1 already done" in err
    for p, st in kept.items():
        again = os.stat(p)
        assert (again.st_ino, again.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), p
    got, want = chunks(out), chunks(clean)
    assert sorted(got) == [f"{a}/chunk_{c:05d}.npy" for a in ARCHS for c in (1, 4)]
    assert all(got[k] == want[k] for k in got)
