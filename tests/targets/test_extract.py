"""`aleph targets extract` end to end, with tiny random teachers of all five architectures.

The extraction runs in the teacher environment (.venv-teachers, lockfiles/teachers.txt), as
a subprocess of this suite: the tiny models (BertModel, ModernBertModel, RobertaModel,
AlbertModel, DistilBertModel from small configs, a WordPiece tokenizer trained on the
captions, no hub) are built there by tiny_teachers.py. Without that venv these tests skip,
naming the command that builds it; under CI (CI set) they fail instead, since .ci/run
builds it; inside the E1 image (ALEPH_IN_IMAGE=1) it is absent by design.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from targets_helpers import REPO, wait_for

from aleph.data.captions import check_row_counts, open_captions
from aleph.targets import build_store
from aleph.targets.consensus import run_consensus
from aleph.targets.sources import chunk_files_in

TEACHER_PY = REPO / ".venv-teachers" / "bin" / "python"
HELPER = Path(__file__).with_name("tiny_teachers.py")
ARCHS = ("tiny-albert", "tiny-bert", "tiny-distilbert", "tiny-modernbert", "tiny-roberta")
ROWS, CHUNK, MAXLEN = 300, 128, 32
CHECK = (0, 1, 150, 299)  # row i is caption i: vs the plain forward of caption i alone
OPTS = ["--chunk-rows", str(CHUNK), "--batch-size", "16", "--max-length", str(MAXLEN)]


def teacher_python() -> Path:
    if TEACHER_PY.is_file():
        return TEACHER_PY
    why = ".venv-teachers absent: ./aleph-dev setup-teachers builds it from lockfiles/teachers.txt"
    if os.environ.get("ALEPH_IN_IMAGE") == "1":
        pytest.skip(f"{why} (never in the E1 image)")
    if os.environ.get("CI", "").lower() in ("1", "true"):
        pytest.fail(f"CI: {why} (.ci/run builds it first)")
    pytest.skip(why)


def run_teacher(args: list[str], env: dict | None = None, **kw):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen([str(teacher_python()), *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def done(proc, timeout=600) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out, err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(captions file, comma-separated teacher dirs, a clean extraction's OUT, its stderr,
    the reference rows): the process that builds the teachers then reads them back and
    encodes the CHECK captions alone with the plain transformers forward (one start of the
    teacher environment, not two), before the extraction runs."""
    teacher_python()
    root = tmp_path_factory.mktemp("extract")
    r = random.Random(0)
    words = ("a dog cat runs on the green grass near big red house with small child playing "
             "ball in park under blue sky man woman rides bike street city night light").split()
    caps = root / "caps.txt"
    caps.write_text("\n".join(" ".join(r.choice(words) for _ in range(r.randint(2, 40)))
                              for _ in range(ROWS)) + "\n")
    built, _ = done(run_teacher([str(HELPER), "build-encode", str(root / "models"), str(caps),
                                 str(MAXLEN), *map(str, CHECK)]))
    ref = json.loads(built.splitlines()[-1])
    teachers = ",".join(str(root / "models" / a) for a in ARCHS)
    out = root / "clean"
    said, err = done(run_teacher(["-m", "aleph", "targets", "extract", "--captions", str(caps),
                                  "--out", str(out), "--teachers", teachers, *OPTS,
                                  "--consensus-out", str(root / "targets")]))
    assert f"{root / 'targets'}: {ROWS:,} x 32 float16 consensus targets of" in said, said
    return caps, teachers, out, err, ref


def load_teacher(out: Path, arch: str) -> np.ndarray:
    return np.concatenate([np.load(p) for p in chunk_files_in(out / arch)])


@pytest.mark.slow
def test_every_architecture_extracts_unit_fp16_rows_aligned_with_the_captions(tiny):
    caps, teachers, out, err, ref = tiny
    lines = err.splitlines()
    first_estimate = next(i for i, ln in enumerate(lines) if ln.startswith("estimate: "))
    first_progress = next(i for i, ln in enumerate(lines) if "rows/s, ETA" in ln)
    assert first_estimate < first_progress and "GPU-hours" in lines[first_estimate]
    assert sorted(ref) == list(ARCHS)
    for arch in ARCHS:
        names = sorted(os.listdir(out / arch))
        assert names == [f"chunk_{c:05d}.npy" for c in range(3)]
        rows = [np.load(out / arch / n, mmap_mode="r").shape for n in names]
        assert rows == [(CHUNK, 32), (CHUNK, 32), (ROWS - 2 * CHUNK, 32)]
        x = load_teacher(out, arch)
        assert x.dtype == np.float16
        assert np.allclose(np.linalg.norm(x.astype(np.float32), axis=1), 1, atol=2e-3)
        assert np.abs(x[list(CHECK)].astype(np.float32) - np.array(ref[arch])).max() < 2e-3, arch
    rec = json.loads((out / "extract.json").read_text())
    assert rec["rows"] == ROWS and rec["chunks"] == 3 and rec["precision"] == "float32"
    assert [t["local"] for t in rec["teachers"]] == [True] * 5
    assert all(len(t["files_sha256"]["model.safetensors"]) == 64 for t in rec["teachers"])


@pytest.mark.slow
def test_one_command_gives_a_target_store_aligned_with_the_captions(tiny, tmp_path):
    """--consensus-out ran the consensus in the teacher venv; the main venv's store reads it."""
    caps, _, out, _, _ = tiny
    targets = out.parent / "targets"
    result = json.loads((targets / "consensus.json").read_text())
    assert [t["dir"] for t in result["teachers"]] == [str(out / a) for a in ARCHS]
    store = build_store(chunk_files_in(targets), tmp_path / "store")
    check_row_counts(open_captions(caps).count_rows(), store.rows, f"captions {caps}",
                     f"targets {store.store_dir}")  # raises on a count mismatch
    assert store.rows == ROWS and store.dim == 32 and result["fit"]["converged"]
    # the same consensus computed here, in the main venv, is byte for byte the same
    run_consensus([str(out / a) for a in ARCHS], tmp_path / "again")
    for c in result["output"]["chunks"]:
        assert (tmp_path / "again" / c["name"]).read_bytes() == (targets / c["name"]).read_bytes()


@pytest.mark.slow
def test_killed_mid_chunk_it_resumes_redoing_no_finished_chunk(tiny, tmp_path):
    caps, teachers, clean, _, _ = tiny
    out, marker = tmp_path / "out", tmp_path / "marker"
    args = ["-m", "aleph", "targets", "extract", "--captions", str(caps), "--out", str(out),
            "--teachers", teachers, *OPTS]
    proc = run_teacher(args, {"ALEPH_FAULT": "extract-batch:1",
                              "ALEPH_FAULT_FILE": str(marker)})
    wait_for(marker, proc, timeout=300)  # chunk 0 of every teacher published, chunk 1 begun
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    finished = {p: os.stat(p) for a in ARCHS for p in chunk_files_in(out / a)}
    assert sorted(os.path.basename(p) for p in finished) == ["chunk_00000.npy"] * 5
    assert not (out / "extract.json").exists()
    _, err = done(run_teacher(args))
    assert "3 chunks of 3 in this process, 1 already done" in err
    for p, st in finished.items():
        again = os.stat(p)
        assert (again.st_ino, again.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), p
    for a in ARCHS:
        for c in range(3):
            name = f"chunk_{c:05d}.npy"
            assert (out / a / name).read_bytes() == (clean / a / name).read_bytes(), (a, name)
        assert not [n for n in os.listdir(out / a) if n.endswith(".partial")]


@pytest.mark.slow
def test_a_resume_with_other_options_is_one_line_and_touches_nothing(tiny):
    caps, teachers, clean, _, _ = tiny
    before = {p: os.stat(p).st_mtime_ns for a in ARCHS for p in chunk_files_in(clean / a)}
    proc = run_teacher(["-m", "aleph", "targets", "extract", "--captions", str(caps), "--out",
                        str(clean), "--teachers", teachers, *OPTS[:-1], "16"])
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2
    last = err.strip().splitlines()[-1]
    assert "extract-plan.json: the run in" in last and "max_length" in last
    assert before == {p: os.stat(p).st_mtime_ns for p in before}


def test_extract_in_the_e1_environment_is_one_line_before_anything_is_written(tmp_path):
    """Here (the E1 stack, transformers 5.x on torch 2.4.1) the model classes do not import:
    one line naming the teacher environment, exit 2, no OUT. Needs no teacher venv."""
    caps = tmp_path / "caps.txt"
    caps.write_text("a caption\n")
    r = subprocess.run([sys.executable, "-m", "aleph", "targets", "extract", "--captions",
                        str(caps), "--out", str(tmp_path / "out"), "--teachers", str(tmp_path)],
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=300)
    if r.returncode == 2 and "do not load in this environment" not in r.stderr:
        pytest.fail(r.stderr)
    if r.returncode != 2:  # an environment where transformers' models import: not E1's stack
        pytest.skip("transformers' model classes import here (not the E1 stack)")
    assert len(r.stderr.strip().splitlines()) == 1 and "./aleph-dev extract" in r.stderr
    assert not (tmp_path / "out").exists()


def test_importing_aleph_and_its_teacher_code_never_imports_transformers():
    code = ("import sys, aleph, aleph.cli.targets, aleph.targets.extract, aleph.targets.consensus;"
            "from aleph.cli import build_parser; build_parser('targets');"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_aleph_dev_runs_extract_in_the_teacher_venv_without_rebuilding_it():
    teacher_python()
    stamp = REPO / ".venv-teachers" / ".aleph-locks.sha256"
    before = stamp.stat().st_mtime_ns
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALEPH_")}
    r = subprocess.run([str(REPO / "aleph-dev"), "teachers", "python", "-c",
                        "import sys, transformers; print(sys.prefix, transformers.__version__)"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    prefix, version = r.stdout.split()
    assert Path(prefix).resolve() == (REPO / ".venv-teachers").resolve()
    assert version.startswith("4.") and ".venv-teachers is up to date" in r.stderr
    r = subprocess.run([str(REPO / "aleph-dev"), "extract", "--help"], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0 and "--consensus-out" in r.stdout, r.stderr
    assert stamp.stat().st_mtime_ns == before
