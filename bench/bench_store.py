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
     number of bytes between two RAM buffers, both measured in rounds in this run
     (medians). Gather is reported per mapping state: cold (a fresh mapping's first
     pass, paying a minor fault per first-touched folio), warm (the same mapping
     again: the steady state of training), prefaulted (open_store(prefault=True)),
     and, for reference, the in_ram implementation (random rows from an anonymous
     tensor: what random access to RAM allows). Target >= 0.5x in the steady state.
Also printed: the largest system-wide Dirty figure (/proc/meminfo) seen during each
write, a rough witness that the build keeps dirty page cache bounded.

Run from the repository root with the venv of `./aleph-dev setup` (about 2 GB of chunks
+ 2 x 2 GB of stores on disk, about 4.5 GB of RAM for the in-RAM build):
    .venv/bin/python bench/bench_store.py                  # default 2 GB, 16 chunks
    .venv/bin/python bench/bench_store.py --size-gb 0.5 --chunks 8 --dir /some/fast/disk
    .venv/bin/python bench/bench_store.py --gather-only STORE_DIR   # gather figures only
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from peak import DirtyWatch  # bench/peak.py: the script's own directory is on sys.path

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


def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def bench_gather(store_dir: Path, batch: int, batches: int,
                 rounds: int) -> dict[str, list[tuple[float, float]]]:
    """{mode: [(bytes/s, minor faults per batch) per round]} for random `batch`-row gathers.

    The store is in page cache throughout (read once first, through its own mapping).
    Every round measures, each over `batches` fresh random batches:
      memcpy     : np.copyto of the same bytes per batch between two RAM buffers (a
                   contiguous copy from a source 64x the batch, so from RAM, not cache)
      cold       : a freshly opened streaming store's first pass (each page-cache folio's
                   first touch takes a minor fault)
      warm       : the same store's second pass: the steady state of a training run
      prefaulted : a streaming store opened with prefault=True (open time reported apart)
      in_ram     : the in_ram implementation (rows in one anonymous tensor): random rows
                   from RAM with no mapping at all, the reference for what RAM allows
    """
    sys.path.insert(0, str(REPO))
    from aleph.targets import open_store

    store = open_store(store_dir)
    for _ in store.scan(1 << 16):  # bring the store into page cache
        pass
    store.close()
    in_ram = open_store(store_dir, "in_ram")
    rng = np.random.default_rng(1)
    nbytes = batch * store.dim * store.dtype.itemsize
    src = np.ones(64 * nbytes, dtype=np.uint8)  # larger than caches: a RAM-to-RAM copy
    dst = np.empty(nbytes, dtype=np.uint8)
    res: dict = {k: [] for k in ("memcpy", "cold", "warm", "prefaulted", "in_ram", "open_s")}

    def timed(fn, items) -> tuple[float, float]:
        f0, t0 = _minflt(), time.perf_counter()
        for it in items:
            fn(it)
        seconds = time.perf_counter() - t0
        return len(items) * nbytes / seconds, (_minflt() - f0) / len(items)

    def batch_idx():
        return [rng.integers(0, store.rows, batch) for _ in range(batches)]

    def copy(s):
        np.copyto(dst, src[s:s + nbytes])

    in_ram.gather(batch_idx()[0])  # warm-up: the output allocation
    for _ in range(rounds):
        res["memcpy"].append(timed(copy, (rng.integers(0, 63, batches) * nbytes).tolist()))
        s = open_store(store_dir)
        res["cold"].append(timed(s.gather, batch_idx()))
        res["warm"].append(timed(s.gather, batch_idx()))
        s.close()
        t0 = time.perf_counter()
        s = open_store(store_dir, prefault=True)
        res["open_s"].append(time.perf_counter() - t0)
        res["prefaulted"].append(timed(s.gather, batch_idx()))
        s.close()
        res["in_ram"].append(timed(in_ram.gather, batch_idx()))
    res["prefault_how"] = s.prefaulted
    return res


def report_gather(store_dir: Path, args) -> None:
    r = bench_gather(store_dir, args.batch, args.batches, args.rounds)
    mem = [g for g, _ in r["memcpy"]]
    m = statistics.median(mem)
    print(f"gather   : random {args.batch}-row batches, {args.batches} per figure, median of "
          f"{args.rounds} rounds, store in page cache; ratio = median gather / median memcpy, "
          "both measured in this run")
    print(f"  {'memcpy (RAM->RAM, contiguous)':38s}{m / 1e9:6.2f} GB/s         "
          f"(min {min(mem) / 1e9:.2f}, max {max(mem) / 1e9:.2f})")
    labels = {
        "cold": "streaming, cold mapping",
        "warm": "streaming, warm mapping",
        "prefaulted": f"streaming, prefaulted ({r['prefault_how']})",
        "in_ram": "in_ram tensor (reference)",
    }
    for key, label in labels.items():
        g = [x for x, _ in r[key]]
        faults = statistics.median(f for _, f in r[key])
        mark = "  <- steady state: target >= 0.5x" if key == "warm" else ""
        print(f"  {label:38s}{statistics.median(g) / 1e9:6.2f} GB/s = {statistics.median(g) / m:.2f}x "
              f"(min {min(g) / 1e9:.2f}, max {max(g) / 1e9:.2f}; {faults:.0f} minor faults/batch){mark}")
    print(f"  prefault at open: median {statistics.median(r['open_s']):.2f} s for the whole store")


def _positive(kind):
    """argparse type: a number of `kind` above zero (a zero or negative size, count or
    round count has no meaningful figure; say so instead of failing deep inside)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
        return value
    parse.__name__ = kind.__name__
    return parse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=_positive(float), default=2.0,
                    help="store size in GB (1e9 bytes; default %(default)s)")
    ap.add_argument("--chunks", type=_positive(int), default=16, help="chunk files (default %(default)s)")
    ap.add_argument("--dim", type=_positive(int), default=768, help="row width (default %(default)s)")
    ap.add_argument("--batch", type=_positive(int), default=4096,
                    help="rows per gather batch (default %(default)s)")
    ap.add_argument("--batches", type=_positive(int), default=200,
                    help="batches per gather figure (default %(default)s)")
    ap.add_argument("--rounds", type=_positive(int), default=5,
                    help="gather rounds; figures are medians (default %(default)s)")
    ap.add_argument("--gather-only", metavar="STORE",
                    help="skip the build figures; measure gather on this existing store")
    ap.add_argument("--dir", help="scratch directory on the disk to measure (default: ./work "
                                   "of the repository; removed afterwards)")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.child and not args.gather_only:
        rows_per_chunk = int(args.size_gb * 1e9) // (args.dim * 2) // args.chunks
        if rows_per_chunk < 1:
            ap.error(f"--size-gb {args.size_gb} is less than one {args.dim}-wide fp16 row per chunk "
                     f"for --chunks {args.chunks}")
    if args.gather_only:
        store = Path(args.gather_only)
        if not (store / "manifest.json").is_file():
            ap.error(f"--gather-only {store}: not a target store (no manifest.json); "
                     "build one with `aleph targets build`")
    if args.child:
        return child_build(args.child[0], args.child[1], args.child[2:])
    if args.gather_only:
        return report_gather(Path(args.gather_only), args)
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
    report_gather(scratch / "stream", args)
    print(f"identical: streaming and in-RAM stores byte-identical: {same}")


if __name__ == "__main__":
    main()
