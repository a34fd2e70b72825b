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


@pytest.mark.parametrize("plant", ["symlink", "hardlink"])
@pytest.mark.parametrize("suffix", [".npy", ".safetensors", ".pt"])
def test_a_chunk_is_never_written_through_a_link_planted_at_its_partial(tmp_path, plant, suffix):
    """Whoever can write OUT (a shared extraction directory) plants `.NAME.partial` before a
    resume: the writer refuses it, the file the link names is left as it was."""
    import torch

    from aleph._io import NotRegularFile
    from aleph.errors import StoreError
    from aleph.targets.chunkio import ChunkWriter

    victim = tmp_path / "victim.txt"
    victim.write_text("precious data")
    out = tmp_path / "out"
    out.mkdir()
    partial = out / f".chunk_00001{suffix}.partial"
    (os.symlink if plant == "symlink" else os.link)(victim, partial)
    with pytest.raises(NotRegularFile, match="a symbolic link|a file with 2 hard links"):
        ChunkWriter(str(out / f"chunk_00001{suffix}"), 4, 3)
    assert victim.read_text() == "precious data" and not (out / f"chunk_00001{suffix}").exists()
    partial.unlink()
    w = ChunkWriter(str(out / f"chunk_00001{suffix}"), 4, 3)  # swapped while being written
    w.write(slice(0, 4), torch.ones(4, 3))
    partial.unlink()
    os.symlink(victim, partial)
    if suffix == ".pt":  # published from its own .save file, written from the mapped rows
        w.commit()
        assert torch.load(out / "chunk_00001.pt", weights_only=True).sum() == 12
    else:
        with pytest.raises(StoreError, match="replaced by something else while this command "
                                             "wrote it; not published"):
            w.commit()
        w.discard()
        assert not (out / f"chunk_00001{suffix}").exists()
    assert victim.read_text() == "precious data" and partial.is_symlink()  # not ours: left
