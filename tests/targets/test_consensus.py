"""`aleph targets consensus`: rotation recovery, the record, bad inputs, resume after a kill.

The teachers here are independent random rotations of one ground truth plus noise, saved as
chunk directories of every accepted format; the consensus is read back through the target
store (`aleph targets build` of OUT, as the trainer reads it).
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch
from targets_helpers import run_cli, save_chunk, wait_for

from aleph._io import read_json, sha256_file
from aleph.cli import main
from aleph.errors import StoreError
from aleph.targets import build_store
from aleph.targets.consensus import RESULT_FILE, run_consensus
from aleph.targets.procrustes import polar
from aleph.targets.sources import chunk_files_in

ROWS = (700, 500, 600)  # three chunks per teacher
DIM = 24
NOISE = (0.35, 0.45, 0.55, 0.65, 0.75)  # per teacher, relative to a unit row
SUFFIXES = (".npy", ".pt", ".safetensors")


def unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x, dim=1)


def make_teachers(root, rows=ROWS, dim=DIM, noise=NOISE, seed=0):
    """(truth (N, dim), [teacher dirs]): teacher i = unit(truth @ Q_i + noise_i), fp16."""
    g = torch.Generator().manual_seed(seed)
    truth = unit(torch.randn(sum(rows), dim, generator=g))
    dirs = []
    for i, s in enumerate(noise):
        q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g))  # a random orthogonal map
        x = unit(truth @ q + s * torch.randn(sum(rows), dim, generator=g) / dim**0.5)
        d = root / f"teacher{i}"
        d.mkdir()
        start = 0
        dtype = torch.float32 if i == 1 else torch.float16  # one dtype per directory
        for c, n in enumerate(rows):  # every format, the same names in every directory
            save_chunk(x[start:start + n].to(dtype), d / f"chunk_{c:03d}{SUFFIXES[c % 3]}")
            start += n
        dirs.append(str(d))
    return truth, dirs


def cos_after_best_rotation(a: torch.Tensor, truth: torch.Tensor) -> float:
    """Mean cosine of a's rows with the truth's after the orthogonal map that fits best."""
    q = polar(a.double().T @ truth.double()).float()
    return float((unit(a @ q) * truth).sum(1).mean())


def read_store(out, tmp_path) -> torch.Tensor:
    store = build_store(chunk_files_in(out), tmp_path / "store")
    return torch.from_numpy(np.fromfile(store.store_dir / "targets.bin", dtype="<f2")
                            ).float().view(store.rows, store.dim)


def read_dir(d) -> torch.Tensor:
    from aleph.targets.chunkio import float_blocks
    from aleph.targets.sources import describe_sources

    return torch.cat([b for i in describe_sources(chunk_files_in(d)) for _, b in float_blocks(i)])


@pytest.mark.parametrize("whiten", ["none", "zca"])
def test_consensus_recovers_the_truth_better_than_any_teacher(tmp_path, whiten, capsys):
    truth, dirs = make_teachers(tmp_path)
    out = tmp_path / "out"
    result = run_consensus(dirs, out, fit_rows=1200, whiten=whiten)
    got = read_store(out, tmp_path)
    assert got.shape == truth.shape
    assert torch.allclose(got.norm(dim=1), torch.ones(len(got)), atol=2e-3)  # unit rows, fp16
    consensus = cos_after_best_rotation(got, truth)
    singles = [cos_after_best_rotation(read_dir(d), truth) for d in dirs]
    with capsys.disabled():
        print(f"\nwhiten={whiten}: consensus-vs-truth cos {consensus:.4f}, teachers "
              + " ".join(f"{s:.4f}" for s in singles))
    assert consensus > max(singles) + 0.01
    fit = result["fit"]
    assert fit["rows_used"] == 1200 and fit["converged"] and fit["iterations"] >= 1
    trace = fit["objective_trace"]
    assert all(b <= a + 1e-9 * a for a, b in zip(trace, trace[1:], strict=False))
    # the noisiest teacher sits farthest from the consensus
    assert np.argmax(fit["relative_residuals"]) == len(NOISE) - 1


def test_consensus_json_records_every_input_hash_and_the_outputs(tmp_path):
    _, dirs = make_teachers(tmp_path)
    out = tmp_path / "out"
    main(["targets", "consensus", "--teachers", *dirs, "--out", str(out), "--fit-rows", "900"])
    rec = read_json(out / RESULT_FILE)
    assert [t["dir"] for t in rec["teachers"]] == [os.path.realpath(d) for d in dirs]
    for t in rec["teachers"]:
        for c in t["chunks"]:
            assert c["sha256"] == sha256_file(os.path.join(t["dir"], c["name"]))
    names = [c["name"] for c in rec["output"]["chunks"]]
    assert names == [os.path.basename(p) for p in chunk_files_in(dirs[0])]
    assert sorted(os.listdir(out)) == sorted(names + [RESULT_FILE, ".consensus-state.json",
                                                      rec["rotations"]["file"]])
    assert rec["rotations"]["sha256"] == sha256_file(out / rec["rotations"]["file"])
    for c in rec["output"]["chunks"]:
        assert sha256_file(out / c["name"]) == c["sha256"]
    assert rec["rows"] == sum(ROWS) and rec["fit"]["rows_used"] == 900


def _cli_error(args, capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    return err


def test_mismatched_names_or_rows_are_one_line_and_nothing_is_written(tmp_path, capsys):
    _, dirs = make_teachers(tmp_path)
    out = tmp_path / "out"
    os.rename(os.path.join(dirs[1], "chunk_001.pt"), os.path.join(dirs[1], "chunk_009.pt"))
    err = _cli_error(["targets", "consensus", "--teachers", *dirs, "--out", str(out)], capsys)
    assert f"{dirs[1]}: chunk names differ" in err and "chunk_009.pt" in err
    assert not out.exists()
    os.rename(os.path.join(dirs[1], "chunk_009.pt"), os.path.join(dirs[1], "chunk_001.pt"))
    save_chunk(torch.zeros(5, DIM).half(), tmp_path / "teacher3" / "chunk_001.pt")
    err = _cli_error(["targets", "consensus", "--teachers", *dirs, "--out", str(out)], capsys)
    assert "teacher3/chunk_001.pt: 5 rows, expected 500" in err
    assert not out.exists()


def test_a_fifo_among_the_chunks_is_refused_without_opening_it(tmp_path, capsys):
    _, dirs = make_teachers(tmp_path, rows=(50, 40), noise=(0.3, 0.4))
    os.unlink(os.path.join(dirs[0], "chunk_000.npy"))
    os.mkfifo(os.path.join(dirs[0], "chunk_000.npy"))  # open() on it would block forever
    out = tmp_path / "out"
    err = _cli_error(["targets", "consensus", "--teachers", *dirs, "--out", str(out)], capsys)
    assert "chunk_000.npy: not a regular file" in err and not out.exists()


def test_an_unrelated_out_directory_is_refused(tmp_path):
    _, dirs = make_teachers(tmp_path, rows=(50, 40), noise=(0.3, 0.4))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("not ours")
    with pytest.raises(StoreError, match="not empty and not a consensus output"):
        run_consensus(dirs, out, fit_rows=60)
    assert (out / "keep.txt").read_text() == "not ours"


def test_killed_in_the_middle_of_a_chunk_it_resumes_without_redoing_finished_ones(tmp_path):
    _, dirs = make_teachers(tmp_path)
    clean = tmp_path / "clean"
    run_consensus(dirs, clean, fit_rows=1000)
    out, marker = tmp_path / "out", tmp_path / "marker"
    proc = run_cli(["targets", "consensus", "--teachers", *dirs, "--out", str(out),
                    "--fit-rows", "1000"],
                   {"ALEPH_FAULT": "consensus-block:1",
                    "ALEPH_FAULT_FILE": str(marker)})
    wait_for(marker, proc)  # chunk 0 published, chunk 1 half written
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert not (out / RESULT_FILE).exists() and not (out / "chunk_001.pt").exists()
    first = (out / "chunk_000.npy").stat()
    run_consensus(dirs, out, fit_rows=1000)
    again = (out / "chunk_000.npy").stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)  # not redone
    for name in ("chunk_000.npy", "chunk_001.pt", "chunk_002.safetensors"):
        assert (out / name).read_bytes() == (clean / name).read_bytes()
    assert not [n for n in os.listdir(out) if n.endswith((".partial", ".save"))]
