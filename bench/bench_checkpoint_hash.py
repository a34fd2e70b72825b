"""Resume-state verification cost for the E1 shape: hashing a checkpoint vs reading it.

Builds the `e1` preset's model on CPU (bert-base-uncased vocabulary, 30,522 tokens), takes
one AdamW step so the optimiser holds both moments, and saves a resume state exactly as the
trainer does (`aleph.train.checkpoint.save`). Then times, each the best of --rounds:
  1. verify: `checkpoint.verify_state` (what every resume runs on the newest state:
     sha256 of model.safetensors, trainer.pt and meta.json against the COMPLETE marker);
  2. read: the same bytes read without hashing (8 MiB blocks), the I/O floor; the ratio
     verify / read is the cost of the hash itself;
  3. save: the save that writes the marker (serialise, write, fsync, hash from memory).
Files are in page cache after the save (the usual case on resume after a stop; after a
reboot add one cold read of the same bytes).

    .venv/bin/python bench/bench_checkpoint_hash.py                    # a2_dense and a1_anchored
    .venv/bin/python bench/bench_checkpoint_hash.py --arm a2_dense --dir /some/disk
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aleph.model import build_model  # noqa: E402
from aleph.train import checkpoint as ckpt  # noqa: E402
from aleph.train.config import model_config, resolve  # noqa: E402
from aleph.train.optim import make_optimizer, make_scheduler  # noqa: E402

BERT_VOCAB, BERT_PAD = 30522, 0


def _read(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            n += len(block)
    return n


def _best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench(arm: str, root: Path, rounds: int) -> None:
    cfg = resolve("e1", overrides=["captions=x", "targets=y"], arm=arm)
    torch.manual_seed(0)
    model = build_model(model_config(cfg, BERT_VOCAB, BERT_PAD))
    opt = make_optimizer(model, cfg)
    sched = make_scheduler(opt, cfg, 1000)
    loss = sum(p.float().pow(2).sum() for p in model.parameters() if p.requires_grad)
    loss.backward()  # one step: AdamW now holds exp_avg and exp_avg_sq for every parameter
    opt.step()
    run_dir = root / arm
    pos = ckpt.Position(1, 0, 1, cfg.batch_size, 0.0)
    t0 = time.perf_counter()
    state = ckpt.save(run_dir, model, opt, sched, pos, [ckpt.rng_state()], "bench", keep=2)
    save_s = time.perf_counter() - t0
    sizes = {p.name: p.stat().st_size for p in state.iterdir()}
    total = sum(sizes.values())
    assert ckpt.verify_state(state).problem is None
    verify_s = _best(lambda: ckpt.verify_state(state), rounds)
    read_s = _best(lambda: [_read(state / n) for n in ckpt.FILES], rounds)
    params = sum(p.numel() for p in model.parameters())
    print(f"{arm}: {params:,} parameters; state {total:,} B "
          f"(model.safetensors {sizes['model.safetensors']:,}, trainer.pt {sizes['trainer.pt']:,})")
    print(f"  verify (sha256 of every file vs COMPLETE): {verify_s:.3f} s = "
          f"{total / verify_s / 1e9:.2f} GB/s; read only: {read_s:.3f} s "
          f"({verify_s / read_s:.1f}x); save incl. hashing: {save_s:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", choices=("a1_anchored", "a2_dense", "a3_random"), action="append")
    ap.add_argument("--dir", help="where to write the states (default: a temporary directory)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    try:
        for arm in args.arm or ["a2_dense", "a1_anchored"]:
            bench(arm, root, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
