"""Consensus benchmark: the apply pass vs a plain chunked matmul + normalise, and peak RSS.

Teachers: k=5 directories of fp16 .npy chunks (rows x 768), random rotations of one truth
plus noise, made here. At two sizes (--rows, default 40,000 and 160,000 rows):
  1. apply: `consensus.apply_chunk` over every chunk (read the k chunks, one (n, kD) x (kD, D)
     matmul per block, normalise, fp16 chunk written and fsynced) vs the plain loop a user
     would write in the same run: np.load(mmap) of the k chunks, float32, concatenate,
     matmul, normalise, np.save + fsync, same maps. Ratio = plain seconds / apply seconds
     (goal >= 0.9x).
  2. memory: peak RSS of the whole `aleph targets consensus` in its own process (bench/peak.py)
     at the two sizes and at two --fit-rows: bounded by the fit's k^2 D^2 Gram sums and one
     block, not by the rows or the fit sample.
The fit is capped at --max-iter sweeps (default 3): this bench measures the apply pass and
memory (the Gram sums are allocated and filled in full whatever the sweep count); each
768-d sweep costs minutes on a loaded 2-core machine.

Run from the repository root with the venv of `./aleph-dev setup`:
    .venv/bin/python bench/bench_consensus.py [--rows 40000 160000] [--dir /fast/disk]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from peak import run_peak  # bench/peak.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aleph.targets.consensus import (  # noqa: E402
    ROTATIONS_FILE,
    apply_chunk,
    check_inputs,
    load_maps,
)

K, DIM, CHUNK = 5, 768, 20_000


def make_teachers(root: Path, rows: int) -> list[str]:
    g = torch.Generator().manual_seed(0)
    dirs = [root / f"t{i}" for i in range(K)]
    qs = [torch.linalg.qr(torch.randn(DIM, DIM, generator=g))[0] for _ in range(K)]
    for d in dirs:
        d.mkdir()
    for c, start in enumerate(range(0, rows, CHUNK)):
        n = min(CHUNK, rows - start)
        truth = torch.nn.functional.normalize(torch.randn(n, DIM, generator=g), dim=1)
        for d, q in zip(dirs, qs, strict=True):
            x = truth @ q + 0.02 * torch.randn(n, DIM, generator=g)
            np.save(d / f"chunk_{c:04d}.npy", torch.nn.functional.normalize(x, dim=1).half().numpy())
    return [str(d) for d in dirs]


def plain_apply(dirs: list[str], names: list[str], maps: torch.Tensor, bias: torch.Tensor,
                out: Path) -> None:
    """What one would write by hand: whole chunks, one matmul, normalise, save."""
    for name in names:
        x = np.concatenate([np.load(os.path.join(d, name), mmap_mode="r").astype(np.float32)
                            for d in dirs], axis=1)  # (n, kD)
        y = torch.nn.functional.normalize(torch.from_numpy(x) @ maps + bias, dim=1)
        path = out / name
        with open(path, "wb") as f:
            np.save(f, y.half().numpy())
            f.flush()
            os.fsync(f.fileno())


def consensus_cmd(dirs: list[str], out: Path, fit_rows: int, max_iter: int) -> list[str]:
    return [sys.executable, "-m", "aleph", "targets", "consensus", "--teachers", *dirs,
            "--out", str(out), "--fit-rows", str(fit_rows), "--max-iter", str(max_iter)]


def one_size(root: Path, rows: int, env: dict, max_iter: int) -> list[int]:
    dirs = make_teachers(root, rows)
    fit_rows = [rows // 8, rows // 2]
    peaks = []
    for f in fit_rows:
        r = run_peak(consensus_cmd(dirs, root / f"out{f}", f, max_iter), env, cwd=REPO)
        peaks.append(r["rss"])
        print(f"  rows {rows:,} fit-rows {f:,}: whole consensus {r['wall']:.1f} s, "
              f"peak RSS {r['rss'] / 2**20:,.0f} MiB")
    inp = check_inputs(dirs)
    maps, bias = load_maps(root / f"out{fit_rows[0]}" / ROTATIONS_FILE, K, "cpu")
    timings = {"apply": [], "plain": []}
    for rep in range(2):  # alternate, keep the faster of each (page cache warm for both)
        out = root / f"apply{rep}"
        out.mkdir()
        t0 = time.perf_counter()
        for c in range(len(inp.names)):
            apply_chunk(inp, c, maps, bias, out)
        timings["apply"].append(time.perf_counter() - t0)
        plain = root / f"plain{rep}"
        plain.mkdir()
        t0 = time.perf_counter()
        plain_apply(dirs, inp.names, maps, bias, plain)
        timings["plain"].append(time.perf_counter() - t0)
    a, p = min(timings["apply"]), min(timings["plain"])
    print(f"  rows {rows:,}: apply {rows / a:,.0f} rows/s, plain chunked matmul+normalise "
          f"{rows / p:,.0f} rows/s: ratio {p / a:.2f}x (goal >= 0.9x); peak RSS at fit-rows "
          f"{fit_rows[1]:,} / {fit_rows[0]:,}: {peaks[1] / peaks[0]:.2f}x")
    return peaks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs=2, default=[40_000, 160_000])
    ap.add_argument("--max-iter", type=int, default=3, help="sweeps of the fit (see above)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: the system temp)")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    print(f"consensus bench: k={K} teachers x {DIM} fp16, chunks of {CHUNK:,} rows, "
          f"torch threads {torch.get_num_threads()}")
    peaks = []
    for rows in args.rows:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            peaks.append(one_size(Path(tmp), rows, env, args.max_iter))
    print(f"peak RSS at {args.rows[1]:,} rows / at {args.rows[0]:,} rows (fit-rows rows/8): "
          f"{peaks[1][0] / peaks[0][0]:.2f}x (rows grew {args.rows[1] / args.rows[0]:.0f}x)")


if __name__ == "__main__":
    main()
