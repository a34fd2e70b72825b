"""Prefetch benchmark (CPU): does gathering step k+1 during step k hide the gather?

Builds a real token store and a real streaming target store (synthetic captions and
fp16 targets) in a temporary directory, then times, over the same batches of one data
order with the trainer's own pieces (aleph.train.prefetch, aleph.train.step.train_step):
  gather    BatchSource.host alone (token ids, masks, target rows), per batch;
  compute   train_step alone on batches gathered beforehand;
  serial    gather then train_step, one after the other (the trainer before prefetch);
  prefetch  Prefetcher.take then train_step (the trainer now).
Phases run in interleaved rounds; each figure is the median per-step time (robust to the
other processes of a shared machine). Prints each and the ratio of the prefetch step to max(gather, compute) (1.0
is perfect overlap) and to gather + compute (1.0 is no overlap at all).

--cold drops the target file's pages before each timed phase (POSIX_FADV_DONTNEED), so
the gather reads from disk as the first epoch after a store build does; without it the
gather is a random-row copy out of the page cache. torch uses --threads compute threads;
the prefetch worker needs a core of its own to overlap (on 2 cores: --threads 1).

    .venv/bin/python bench/bench_prefetch.py                     # warm page cache
    .venv/bin/python bench/bench_prefetch.py --cold --steps 30
    .venv/bin/python bench/bench_prefetch.py --cold --iops 2000 --rows 300000   # as root
"""

from __future__ import annotations

import argparse
import atexit
import mmap
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aleph.model import ModelConfig, build_model  # noqa: E402
from aleph.train.config import resolve  # noqa: E402
from aleph.train.distributed import World  # noqa: E402
from aleph.train.order import DataOrder  # noqa: E402
from aleph.train.prefetch import BatchSource, Prefetcher  # noqa: E402
from aleph.train.step import train_step  # noqa: E402
from aleph.train.trainer import step_trainer  # noqa: E402

WORDS = [f"w{i}" for i in range(400)]
DIM = 768  # the E1 targets' width


def build_stores(root: Path, rows: int, dim: int, max_len: int):
    """(token store, streaming target store, vocabulary size) of `rows` rows; captions of
    4..max_len words."""
    from aleph.data.tokenizer import load_tokenizer, train_wordpiece
    from aleph.data.tokens import build_token_store
    from aleph.targets import build_store

    rng = np.random.default_rng(0)
    lengths = rng.integers(4, max_len, rows)
    words = rng.integers(0, len(WORDS), (rows, max_len))
    captions = [" ".join(WORDS[w] for w in words[i, :lengths[i]]) for i in range(rows)]
    train_wordpiece(captions[:2000], root / "tok")
    tok = load_tokenizer(root / "tok")
    tokens = build_token_store(captions, tok, root / "tokens", max_len)
    chunk = root / "chunk_000.npy"
    bits = rng.integers(0, 0x7C00, size=(rows, dim), dtype=np.uint16)  # finite fp16 patterns
    np.save(chunk, bits.view(np.float16))
    targets = build_store([str(chunk)], root / "targets", "streaming")
    chunk.unlink()
    return tokens, targets, len(tok)


def drop_pages(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


PHASES = ("gather", "compute", "serial", "prefetch")


def trainer(vocab: int, args, cfg):
    """A factory of step functions, each on a freshly seeded model and optimiser: every
    phase computes exactly the same steps from the same weights."""
    cpu, world = torch.device("cpu"), World()

    def make():
        torch.manual_seed(0)
        model = build_model(ModelConfig(
            arm="a2_dense", vocab_size=vocab, max_len=args.max_len, d_model=args.d_model,
            n_layers=args.layers, n_heads=4, ffn_dense=4 * args.d_model, out_dim=DIM))
        t = step_trainer(cfg, model, args.steps + 1, world, cpu)
        return lambda b: train_step(t, b)
    return make


def reopen_cold(targets):
    """The same store reopened after its pages left the page cache (a mapped page cannot
    be dropped, so the old mapping is closed first)."""
    from aleph.targets import open_store

    store_dir, path = targets.store_dir, targets.path
    targets.close()
    drop_pages(path)
    store = open_store(store_dir)
    # No read-around: each row costs its own disk read, as on a store larger than RAM or
    # a disk with a small read_ahead_kb. Without this, a VM disk with a large read-ahead
    # (8 MiB here) pulls the whole file in during the first batch and "cold" lasts one step.
    store._mm._mmap.madvise(mmap.MADV_RANDOM)
    return store


def throttle_reads(path: Path, iops: int) -> str:
    """Cap this process's reads from the disk holding `path` at `iops` (cgroup v1 blkio,
    root only), as a cloud VM's network disk caps them; returns the line to print."""
    cg = Path("/sys/fs/cgroup/blkio") / f"aleph-bench-prefetch-{os.getpid()}"
    dev = os.stat(path).st_dev
    cg.mkdir(exist_ok=True)
    (cg / "blkio.throttle.read_iops_device").write_text(
        f"{os.major(dev)}:{os.minor(dev)} {iops}\n")
    (cg / "cgroup.procs").write_text(f"{os.getpid()}\n")
    atexit.register(_leave, cg)
    return f"reads capped at {iops} IOPS on device {os.major(dev)}:{os.minor(dev)} ({cg})"


def _leave(cg: Path) -> None:
    """Back to the parent group, then remove the one made here."""
    (cg.parent / "cgroup.procs").write_text(f"{os.getpid()}\n")
    cg.rmdir()


def timed(name: str, source: BatchSource, step, n: int) -> list[float]:
    """Per-step seconds of one phase over batches 0..n-1 of epoch 0."""
    out = []
    held = [source.host(0, b) for b in range(n)] if name == "compute" else None
    pf = Prefetcher(source, n) if name == "prefetch" else None
    try:
        for b in range(n):
            t = time.perf_counter()
            if name == "gather":
                source.host(0, b)
            elif name == "compute":
                step(held[b])
            elif name == "serial":
                step(source.to_device(source.host(0, b)))
            else:
                step(pf.take(0, b, b))
            out.append(time.perf_counter() - t)
    finally:
        if pf is not None:
            pf.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=100_000, help="store rows (default %(default)s)")
    ap.add_argument("--batch", type=int, default=256, help="batch (default %(default)s)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per phase and round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of all phases")
    ap.add_argument("--max-len", type=int, default=32, help="token store max_len")
    ap.add_argument("--d-model", type=int, default=64, help="model width (smoke: 64)")
    ap.add_argument("--layers", type=int, default=2, help="model depth (smoke: 2)")
    ap.add_argument("--threads", type=int, default=1, help="torch compute threads")
    ap.add_argument("--cold", action="store_true", help="drop the target pages before each phase")
    ap.add_argument("--iops", type=int, default=0,
                    help="with --cold: cap reads at this many IOPS (cgroup v1 blkio, root)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = resolve("smoke", arm="a2_dense")
    cpu, world = torch.device("cpu"), World()
    with tempfile.TemporaryDirectory(prefix="bench-prefetch-") as tmp:
        t0 = time.perf_counter()
        tokens, targets, vocab = build_stores(Path(tmp), args.rows, DIM, args.max_len)
        print(f"stores: {args.rows:,} rows, targets {targets.byte_length / 2**20:.0f} MiB "
              f"({'cold' if args.cold else 'warm'} page cache), built in "
              f"{time.perf_counter() - t0:.1f} s; torch {torch.__version__}, "
              f"{args.threads} compute thread(s), batch {args.batch}, "
              f"d_model {args.d_model} x {args.layers} layers")
        if args.cold and args.iops:
            print(throttle_reads(targets.path, args.iops))
        order = DataOrder(1, args.rows, args.batch)
        n = min(args.steps, order.steps_per_epoch)
        source = BatchSource(tokens, targets, order, world, cpu, False)
        fresh = trainer(vocab, args, cfg)
        fresh()(source.host(0, n))  # warm-up (allocator, kernels)
        times: dict[str, list[float]] = {k: [] for k in PHASES}
        for _ in range(args.rounds):  # interleaved rounds: machine noise hits every phase
            for name in PHASES:
                if args.cold:  # unmapped and dropped: the gather reads the disk again
                    source.targets = reopen_cold(source.targets)
                times[name] += timed(name, source, fresh(), n)
    med = {k: statistics.median(v) for k, v in times.items()}
    gather, compute, serial, overlap = (med[k] for k in PHASES)
    ms = lambda s: f"{s * 1e3:.2f} ms"  # noqa: E731
    print(f"median per step over {args.rounds} rounds of {n} steps:")
    print(f"gather   {ms(gather)} per batch")
    print(f"compute  {ms(compute)} per step")
    print(f"serial   {ms(serial)} per step (gather + step, no prefetch)")
    print(f"prefetch {ms(overlap)} per step")
    print(f"prefetch / max(gather, compute) = {overlap / max(gather, compute):.3f}   "
          f"prefetch / (gather + compute) = {overlap / (gather + compute):.3f}   "
          f"serial / (gather + compute) = {serial / (gather + compute):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
