"""`aleph targets consensus` on inputs a stranger made: a width whose fit cannot fit in
memory, NaN teacher rows inside and outside the fit sample, state files that are not the
object they should be. Each is one line, exit 2, through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from targets_helpers import REPO

from aleph.targets.consensus import STATE_FILE

# The child runs under this address-space cap, so on a host with memory to spare the fit
# of a 30,000-wide pair (~72 GB) is still refused instead of allocated.
AS_CAP = 6 << 30
MAX_RSS_KIB = 1 << 20  # the refused child stays under 1 GiB (imports included)

RUN_CAPPED = """
import resource, subprocess, sys
def cap():
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
r = subprocess.run([sys.executable, "-m", "aleph", *sys.argv[2:]], preexec_fn=cap,
                   capture_output=True, text=True, timeout=120)
sys.stderr.write(r.stderr)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def consensus(*args: str, cap: int = AS_CAP) -> tuple[int, int, str]:
    """(exit code, the child's peak RSS in KiB, its stderr) of `aleph targets consensus`,
    measured by a wrapper whose only child it is."""
    r = subprocess.run([sys.executable, "-c", RUN_CAPPED, str(cap), "targets", "consensus",
                        *args], cwd=REPO, capture_output=True, text=True, timeout=180,
                       env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    code, rss = r.stdout.split()
    return int(code), int(rss), r.stderr


def teachers(root, rows: list[int], dim: int, seed: int = 0) -> list[str]:
    """Two teacher directories of fp16 unit rows, chunks chunk_000.npy ... of `rows` rows."""
    rng = np.random.default_rng(seed)
    dirs = []
    for t in range(2):
        d = root / f"teacher{t}"
        d.mkdir()
        for c, n in enumerate(rows):
            x = rng.standard_normal((n, dim)).astype(np.float32)
            np.save(d / f"chunk_{c:03d}.npy", (x / np.linalg.norm(x, axis=1, keepdims=True))
                    .astype(np.float16))
        dirs.append(str(d))
    return dirs


def one_line(code: int, err: str, *parts: str) -> str:
    """Exit 2 and one error line holding every part (the pass's `consensus: ...` progress
    lines aside), no traceback."""
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("consensus: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err[-3000:])
    for p in parts:
        assert p in lines[0], (p, lines[0])
    return lines[0]


def test_a_width_whose_fit_cannot_fit_is_refused_before_allocating(tmp_path):
    """2 rows x 30,000 dims per teacher (240 KB of input) would need ~72 GB for the Gram
    sums: refused in one line naming the need, with the child's peak RSS under 1 GiB."""
    dirs = teachers(tmp_path, [2], 30_000)
    out = tmp_path / "out"
    code, rss, err = consensus("--teachers", *dirs, "--out", str(out))
    line = one_line(code, err, "the consensus fit of 2 teachers of width 30,000 needs about",
                    "refused before allocating")
    print(line, f"(child peak RSS {rss / 1024:.0f} MiB)")
    assert rss < MAX_RSS_KIB, rss
    assert not out.exists()


@pytest.mark.parametrize("where", ["in the fit sample", "outside the fit sample"])
def test_a_nan_teacher_row_is_named_and_nothing_with_it_is_written(tmp_path, where):
    dirs = teachers(tmp_path, [40, 40], 8)
    # --fit-rows 10 over 80 rows samples every 8th row: 16 is in the sample, 17 is not
    row = 16 if where == "in the fit sample" else 17
    path = os.path.join(dirs[1], "chunk_001.npy")
    x = np.load(path)
    x[row] = np.nan
    np.save(path, x)
    out = tmp_path / "out"
    code, _, err = consensus("--teachers", *dirs, "--out", str(out), "--fit-rows", "10")
    line = one_line(code, err, f"teacher {dirs[1]}: chunk chunk_001.npy: row {row}",
                    "NaN or Inf")
    print(line)
    published = sorted(n for n in os.listdir(out)) if out.exists() else []
    assert "chunk_001.npy" not in published and "consensus.json" not in published
    assert not [n for n in published if n.endswith(".partial")]
    for name in published:  # what was published (chunk 0, before the bad one) is finite
        if name.endswith(".npy"):
            assert np.isfinite(np.load(out / name).astype(np.float32)).all()


@pytest.mark.parametrize("text", ["[]", "[" * 100_000 + "]" * 100_000, '{"key": 3}'],
                         ids=["a list", "nested 100k deep", "fields of the wrong type"])
def test_a_state_file_that_is_not_an_object_of_its_fields_is_one_line(tmp_path, text):
    dirs = teachers(tmp_path, [40], 8)
    out = tmp_path / "out"
    out.mkdir()
    (out / STATE_FILE).write_text(text)
    code, _, err = consensus("--teachers", *dirs, "--out", str(out))
    one_line(code, err, str(out / STATE_FILE), "choose a new --out")
    assert (out / STATE_FILE).read_text() == text and os.listdir(out) == [STATE_FILE]


def test_a_result_file_that_is_a_list_is_one_line(tmp_path):
    dirs = teachers(tmp_path, [40], 8)
    out = tmp_path / "out"
    out.mkdir()
    (out / "consensus.json").write_text(json.dumps([]))
    code, _, err = consensus("--teachers", *dirs, "--out", str(out))
    one_line(code, err, str(out / "consensus.json"), "expected an object")
