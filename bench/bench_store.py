"""Target store benchmark: build throughput, builder peak RSS, gather throughput.

Every figure is a ratio against a baseline measured in the same run on the same disk:
  1. build: streaming build_store vs a dd-style copy of the same chunk bytes into one
     file (8 MiB blocks, one fdatasync at the end, like `dd bs=8M conv=fdatasync`),
     the faster of one copy before and one after the build. Both read the chunks from
     page cache. Target >= 0.8x.
  2. memory: peak RSS growth of a streaming build vs an in-RAM build, each in its own
     subprocess (peak reset through /proc/self/clear_refs after imports).
     Target: streaming <= one chunk + 64 MB.
  3. gather: random batch gather from the store (in page cache) vs memcpy of the same
     number of bytes between two RAM buffers. Target >= 0.5x.
Also printed: the largest system-wide Dirty figure (/proc/meminfo) seen during each
write, a rough witness that the build keeps dirty page cache bounded.

Run from the repository root (about 2 GB of chunks + 2 x 2 GB of stores on disk,
about 4.5 GB of RAM for the in-RAM build):
    python bench/bench_store.py                  # default 2 GB, 16 chunks
    python bench/bench_store.py --size-gb 0.5 --chunks 8 --dir /some/fast/disk
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BLOCK = 8 << 20


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child_build(impl: str, out: str, paths: list[str]) -> None:
    """Subprocess body: build once, print seconds and peak RSS growth as JSON."""
    sys.path.insert(0, str(REPO))
    from aleph.targets import build_store

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS: measure the build only
    base = _status_kb("VmRSS")
    t0 = time.perf_counter()
    store = build_store(paths, out, impl)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "base_kb": base, "hwm_kb": _status_kb("VmHWM"),
                      "bytes": store.byte_length}))


class DirtyWatch:
    """Samples the system-wide Dirty figure in a thread; `.peak` in bytes."""

    def __init__(self):
        self.peak, self._stop = 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("Dirty:"):
                        self.peak = max(self.peak, int(line.split()[1]) * 1024)
            time.sleep(0.05)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def make_chunks(d: Path, total: int, chunks: int, dim: int) -> list[str]:
    """fp16 chunk files (.npy) of finite random values, `total` bytes in all."""
    rows_total = total // (dim * 2)
    rng = np.random.default_rng(0)
    paths, rows_left = [], rows_total
    for i in range(chunks):
        n = rows_left // (chunks - i)
        # random finite fp16 bit patterns: exponent field below 0x1F
        bits = rng.integers(0, 0x7C00, size=(n, dim), dtype=np.uint16)
        bits |= (rng.integers(0, 2, size=(n, 1), dtype=np.uint16) << 15)
        path = d / f"chunk_{i:03d}.npy"
        np.save(path, bits.view(np.float16))
        paths.append(str(path))
        rows_left -= n
    return paths


def dd_copy(paths: list[str], out: Path) -> float:
    """Seconds to copy the chunks' bytes into one file, dd-style; file removed after."""
    t0 = time.perf_counter()
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for p in paths:
        with open(p, "rb") as f:
            while block := f.read(BLOCK):
                os.write(fd, block)
    os.fdatasync(fd)
    seconds = time.perf_counter() - t0
    os.close(fd)
    out.unlink()
    return seconds


def run_child(impl: str, out: Path, paths: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--child", impl, str(out), *paths]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode:
        raise SystemExit(f"{impl} build failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def bench_gather(store_dir: Path, batch: int, batches: int) -> tuple[float, float]:
    """(gather bytes/s, memcpy bytes/s) for random batches of `batch` rows."""
    sys.path.insert(0, str(REPO))
    from aleph.targets import open_store

    store = open_store(store_dir)
    for _ in store.scan(1 << 16):  # bring the store into page cache
        pass
    rng = np.random.default_rng(1)
    idx = [rng.integers(0, store.rows, batch) for _ in range(batches)]
    store.gather(idx[0])  # warm-up
    t0 = time.perf_counter()
    for i in idx:
        store.gather(i)
    gather_s = time.perf_counter() - t0
    nbytes = batch * store.dim * store.dtype.itemsize
    src = np.ones(64 * nbytes, dtype=np.uint8)  # larger than caches: a RAM-to-RAM copy
    dst = np.empty(nbytes, dtype=np.uint8)
    starts = rng.integers(0, 63, batches) * nbytes
    t0 = time.perf_counter()
    for s in starts:
        np.copyto(dst, src[s:s + nbytes])
    memcpy_s = time.perf_counter() - t0
    return batches * nbytes / gather_s, batches * nbytes / memcpy_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=2.0, help="store size in GB (1e9 bytes)")
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--batch", type=int, default=4096, help="rows per gather batch")
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--dir", help="scratch directory on the disk to measure (default: ./work)")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child_build(args.child[0], args.child[1], args.child[2:])
    base = Path(args.dir or REPO / "work")
    base.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-store-", dir=base))
    try:
        report(scratch, args)
    finally:
        shutil.rmtree(scratch)


def report(scratch: Path, args) -> None:
    total = int(args.size_gb * 1e9)
    paths = make_chunks(scratch, total, args.chunks, args.dim)
    nbytes = sum(os.path.getsize(p) for p in paths)
    chunk = max(os.path.getsize(p) for p in paths)
    print(f"store ~{nbytes / 1e9:.2f} GB in {args.chunks} chunks of ~{chunk / 2**20:.0f} MiB, dim {args.dim} fp16, on {scratch}")
    os.sync()  # the chunks' own dirty pages must not slow whichever phase runs first
    with DirtyWatch() as dd_dirty:
        dd_s = dd_copy(paths, scratch / "dd.bin")
    os.sync()
    with DirtyWatch() as st_dirty:
        stream = run_child("streaming", scratch / "stream", paths)
    os.sync()
    dd_s = min(dd_s, dd_copy(paths, scratch / "dd.bin"))  # baseline: the faster of two copies
    ram = run_child("in_ram", scratch / "ram", paths)
    same = (scratch / "stream" / "targets.bin").read_bytes() == (scratch / "ram" / "targets.bin").read_bytes()
    shutil.rmtree(scratch / "ram")
    d_rate, b_rate = nbytes / dd_s, nbytes / stream["seconds"]
    print(f"build    : streaming {b_rate / 1e6:8.1f} MB/s vs dd-style write {d_rate / 1e6:8.1f} MB/s "
          f"= {b_rate / d_rate:.2f}x (target >= 0.8x)")
    s_mb = (stream["hwm_kb"] - stream["base_kb"]) / 1024
    r_mb = (ram["hwm_kb"] - ram["base_kb"]) / 1024
    print(f"peak RSS : streaming +{s_mb:.0f} MiB vs in-RAM +{r_mb:.0f} MiB = {s_mb / r_mb:.3f}x; "
          f"bound one chunk + 64 MB = {chunk / 2**20 + 64:.0f} MiB: "
          f"{'met' if s_mb <= chunk / 2**20 + 64 else 'MISSED'}")
    print(f"dirty    : max system Dirty during streaming build {st_dirty.peak / 2**20:.0f} MiB, "
          f"during dd-style write {dd_dirty.peak / 2**20:.0f} MiB")
    g, m = bench_gather(scratch / "stream", args.batch, args.batches)
    print(f"gather   : {g / 1e9:.2f} GB/s random {args.batch}-row batches vs memcpy {m / 1e9:.2f} GB/s "
          f"= {g / m:.2f}x (target >= 0.5x)")
    print(f"identical: streaming and in-RAM stores byte-identical: {same}")


if __name__ == "__main__":
    main()
