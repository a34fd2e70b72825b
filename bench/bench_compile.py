"""Cold torch.compile time at the E1 shape on CPU, the long pole of gpu_check's budget.

Per arm: a fresh process-level compile cache (torch._dynamo.reset), then the first
compiled training forward + backward of the E1 model (12 x 512, batch --batch x 128,
dropout 0.1, fp32) with --backend (default aot_eager: dynamo's capture and AOTAutograd's
joint graph, the host-side part of every backend; inductor adds its code generation,
and on a GPU the Triton kernel builds, on top). Prints seconds per arm, and the eager
step time of the same batch for scale.

    .venv/bin/python bench/bench_compile.py --threads 1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aleph.model import ModelConfig, build_model  # noqa: E402


def cold_compile(arm: str, backend: str, batch: int) -> dict:
    """Seconds of the first compiled forward + backward, and of one eager one."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = build_model(ModelConfig(arm=arm, vocab_size=30522, dropout=0.1)).train()
    ids = torch.randint(5, 30522, (batch, 128))
    mask = torch.ones(batch, 128, dtype=torch.bool)
    mask[0, 100:] = False  # padding: the trainer's batches have it
    t0 = time.perf_counter()
    model(ids, mask).sum().backward()
    eager = time.perf_counter() - t0
    compiled = torch.compile(model, backend=backend)
    t0 = time.perf_counter()
    compiled(ids, mask).sum().backward()
    return {"arm": arm, "backend": backend, "compile_s": time.perf_counter() - t0 - eager,
            "first_call_s": time.perf_counter() - t0, "eager_step_s": eager}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="aot_eager")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--arms", nargs="+", default=["a1_anchored", "a2_dense"])
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, backend "
          f"{args.backend}, E1 shape, batch {args.batch} x 128")
    for arm in args.arms:
        r = cold_compile(arm, args.backend, args.batch)
        print(f"{arm:12s} cold compile ~{r['compile_s']:.1f} s (first compiled call "
              f"{r['first_call_s']:.1f} s, an eager forward + backward {r['eager_step_s']:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
