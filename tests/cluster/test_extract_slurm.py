"""The teacher extraction as a Slurm array of three shards plus the consensus job, on the
real two-node cluster, byte for byte equal to one unsharded extraction (CI's cluster tier).

The scripts are the ones `aleph campaign --on slurm --extract-shards 3` writes (only the
extraction and consensus jobs are submitted here: training is the other cluster cases').
The teachers are two tiny random ones (tests/targets/tiny_teachers.py) run in .venv-teachers;
the reference extraction runs on this host while the array runs on the nodes. Element 1 is
stopped mid-run by two SIGTERMs (as at a time limit), exits 76 and requeues itself alone
(the harness's requeue hold is 11 s); its rerun completes only its missing chunks.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
TEACHER_PY = REPO / ".venv-teachers" / "bin" / "python"
HELPER = REPO / "tests" / "targets" / "tiny_teachers.py"
ARCHS = ("tiny-bert", "tiny-roberta")
OPTS = "--chunk-rows 64 --batch-size 16 --max-length 32"
SHARDS, ROWS, N_CHUNKS = 3, 300, 5


def _run(argv: list[str], env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, **kw)


def _ok(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("chunk_*.npy"))}


def test_an_extraction_array_of_three_shards_and_the_consensus_equal_one_run(slurm):
    if not TEACHER_PY.is_file():
        pytest.skip(".venv-teachers absent: ./aleph-dev setup-teachers builds it")
    t0 = time.monotonic()
    work = slurm.work / f"x{time.monotonic_ns()}"
    work.mkdir()
    env = {**slurm.env, "ALEPH_WORK": str(work), "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    env.pop("ALEPH_FAULT", None)
    r = random.Random(2)
    words = "a dog cat runs on the green grass near big red house with a child at night".split()
    caps = work / "caps.txt"
    caps.write_text("\n".join(" ".join(r.choice(words) for _ in range(r.randint(2, 30)))
                              for _ in range(ROWS)) + "\n")
    _ok(_run([str(TEACHER_PY), str(HELPER), "build", str(work / "models"), str(caps)], env))
    teachers = ",".join(str(work / "models" / a) for a in ARCHS)
    out, targets = work / "teachers", work / "targets"
    dirs = " ".join(str(out / a) for a in ARCHS)
    p = subprocess.run([sys.executable, "-m", "aleph", "campaign", "--on", "slurm", "--name",
                        "extract", "--preset", "smoke", "--arms", "a2_dense", "--seeds", "0",
                        "--no-probes", "--partition", slurm.partition, "--python",
                        sys.executable, "--time", "10", "--signal-lead", "60",
                        "--extract-shards", str(SHARDS), "--extract-python", str(TEACHER_PY),
                        "--extract-args", f"--captions {caps} --out {out} --teachers "
                        f"{teachers} {OPTS}", "--consensus-args",
                        f"--teachers {dirs} --out {targets}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    sdir = work / "campaigns" / "extract" / "slurm"
    one_thread = "--export=ALL,OMP_NUM_THREADS=1"  # 2 CPUs a node, shared by its elements
    array = slurm.submit(sdir / "extract.sbatch", one_thread)
    cons = slurm.submit(sdir / "consensus.sbatch", one_thread, f"--dependency=afterok:{array}")
    print(f"extraction array {array} ({SHARDS} shards), consensus job {cons}")
    # Element 1 is stopped as a time limit would (SIGTERM twice) once it has begun; it
    # exits 76, requeues itself alone and its rerun finishes only the chunks it lacks.
    log1 = sdir / "logs" / f"extract-{array}_1.out"
    deadline = time.monotonic() + 120
    while "chunks of 5 in this process" not in (log1.read_text() if log1.exists() else ""):
        assert time.monotonic() < deadline, f"{log1}: never started; {slurm.job(f'{array}_1')}"
        time.sleep(0.1)
    for _ in range(2):
        slurm.run(["scancel", "--signal=TERM", f"{array}_1"])
    # The reference: one unsharded extraction and its consensus, here, meanwhile.
    ref = work / "ref"
    _ok(_run([str(TEACHER_PY), "-m", "aleph", "targets", "extract", "--captions", str(caps),
              "--out", str(ref), "--teachers", teachers, *OPTS.split(), "--consensus-out",
              str(work / "ref-targets")], env))
    slurm.wait_state(cons, "COMPLETED", timeout=240)
    hosts = {}
    for task in range(SHARDS):
        assert slurm.state(f"{array}_{task}") == "COMPLETED"
        log = (sdir / "logs" / f"extract-{array}_{task}.out").read_text()
        hosts[task] = re.search(r"shard \d+/\d+ on (\S+),", log)[1]
        print(f"array {array} element {task}: shard {task}/{SHARDS} on {hosts[task]}")
    text = log1.read_text()
    for line in text.splitlines():
        if "stopped by SIGTERM" in line or "aleph-slurm:" in line or "already done" in line:
            print(f"  {line.strip()[:400]}")
    assert "aleph targets extract: stopped by SIGTERM: shard 1/3:" in text
    assert "requeueing this element alone (requeue 1 of" in text
    assert "requeues so far 1 " in text
    clog = (sdir / "logs" / f"consensus-{cons}.out").read_text()
    chost = re.search(r"consensus job \d+ on (\S+),", clog)[1]
    print(f"consensus job {cons} on {chost}")
    assert set(hosts.values()) == set(slurm.nodes), hosts
    got, want = _files(out), _files(ref)
    assert sorted(got) == sorted(want) and len(want) == len(ARCHS) * N_CHUNKS
    same = sum(got[k] == want[k] for k in want)
    cgot, cwant = _files(targets), _files(work / "ref-targets")
    csame = sum(cgot.get(k) == cwant[k] for k in cwant)
    print(f"extraction: {same} of {len(want)} teacher chunk files byte-identical to one "
          f"unsharded run; consensus: {csame} of {len(cwant)} chunk files byte-identical "
          f"({time.monotonic() - t0:.0f} s)")
    assert same == len(want) and csame == len(cwant) == N_CHUNKS
    assert os.path.isfile(out / "extract.json")
