"""Target inputs that are not what they claim: a FIFO (or a device) as a chunk file is
refused in one line instead of hanging the build, and --fail-on-nonfinite applies to a
cached store too (a store built earlier in warn mode recorded its NaN rows)."""

from __future__ import annotations

import os

import pytest
import torch
from targets_helpers import run_cli, save_chunk


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_chunk_that_is_not_a_regular_file_is_one_line_not_a_hang(tmp_path, make_chunks, kind):
    paths, _ = make_chunks(rows=(8, 8), suffixes=(".npy",))
    bad = tmp_path / "chunks" / "chunk_2.npy"
    if kind == "fifo":
        os.mkfifo(bad)
    elif kind == "device":
        bad.symlink_to("/dev/zero")
    else:
        bad.mkdir()
    proc = run_cli(["targets", "build", str(tmp_path / "chunks"), "--out", str(tmp_path / "store")])
    out, err = proc.communicate(timeout=60)  # a hang fails here, as TimeoutExpired
    assert proc.returncode == 2, out + err
    what = {"fifo": "a FIFO", "device": "a character device", "directory": "a directory"}[kind]
    want = f"chunk_2.npy: chunk file is {what}; expected a regular file"
    assert [ln for ln in err.splitlines() if ln.strip()] == [ln for ln in err.splitlines()
                                                            if want in ln], err
    assert not (tmp_path / "store").exists()


def test_fail_on_nonfinite_refuses_a_cached_store_that_recorded_nan_rows(tmp_path):
    d = tmp_path / "chunks"
    d.mkdir()
    t = torch.randn(16, 8).to(torch.float16)
    t[5, 2] = float("nan")
    save_chunk(t, d / "chunk_0.npy")
    store = tmp_path / "store"
    warn = run_cli(["targets", "build", str(d), "--out", str(store)])
    _, err = warn.communicate(timeout=120)
    assert warn.returncode == 0 and "1 row(s) contain NaN/Inf" in err, err
    fail = run_cli(["targets", "build", str(d), "--out", str(store), "--fail-on-nonfinite"])
    out, err = fail.communicate(timeout=120)
    assert fail.returncode == 2, out + err
    [line] = [ln for ln in err.splitlines() if ln.strip()]
    assert "the cached target store holds 1 row(s) with NaN/Inf" in line
    assert "store rows [5]" in line and "chunk_0.npy" in line
    assert (store / "manifest.json").is_file()  # the cached store itself is left as it was
