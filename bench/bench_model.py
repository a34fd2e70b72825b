"""Model benchmark: samples/s of the trainer's own step for each arm, and model FLOPs utilisation.

  1. CPU, smoke shape (the `smoke` training preset: d_model 64, 2 layers, 4 heads,
     ffn 256 dense / 64 per expert, batch 64, captions of 8-32 tokens), fp32.
  2. CUDA (when present), E1 shape (d_model 512, 12 layers, 8 heads, ffn 2048 / 4 x 512,
     max_len 128, batch 256), bf16 autocast, eager and torch.compile (no per-block
     checkpointing: on torch 2.4 compile and checkpointing are exclusive).
One step = aleph.train.step.train_step, what training runs: forward under autocast, the
distillation loss outside it (on the fp32 embeddings), backward, gradient clipping, its one
host sync, the AdamW step (fused on CUDA) and the schedule. Batches have mixed lengths
(uniform in [--min-len, max_len] per row), trimmed to the batch's longest row as the token
store does, or padded to max_len when compiled (prefetch.fixed_length), as the trainer does.
MFU = 6 x (non-embedding parameters) x tokens + 12 x n_layers x L^2 x d_model per sample
(attention scores and values, forward + backward), over the GPU's dense bf16 peak
(table below, or --peak-tflops); the optimiser step is not counted as model FLOPs. The
bank runs every expert on every token, so its matmul FLOPs equal the dense FFN's; the
address (K=3 dot products) is not counted.

Run from the repository root with the venv of `./aleph-dev setup`:
    .venv/bin/python bench/bench_model.py                 # CPU smoke shape, then CUDA if available
    .venv/bin/python bench/bench_model.py --no-cuda --threads 2 --steps 20
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aleph.model import ARMS, ModelConfig, build_model  # noqa: E402
from aleph.train.config import resolve  # noqa: E402
from aleph.train.distributed import World  # noqa: E402
from aleph.train.prefetch import fixed_length  # noqa: E402
from aleph.train.step import train_step  # noqa: E402
from aleph.train.trainer import step_trainer  # noqa: E402

SMOKE = dict(vocab_size=400, max_len=32, d_model=64, n_layers=2, n_heads=4, ffn_dense=256,
             ffn_expert=64)
E1 = dict(vocab_size=30522, max_len=128)
# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, per GPU, from NVIDIA's data sheets
# (the sparse figure halved): "NVIDIA H100 Tensor Core GPU" (SXM 989, PCIe 756, NVL 835),
# "NVIDIA H200 Tensor Core GPU" (989), "NVIDIA A100 Tensor Core GPU" (312), "NVIDIA A40"
# (149.7), "NVIDIA L40 GPU" (181.05), "NVIDIA L40S GPU" (362.05), "NVIDIA A10" (125),
# "NVIDIA L4" (121), "GeForce RTX 4090" (165.2, fp32 accumulate at full rate). Matched
# against torch.cuda.get_device_name as substrings, in this order: more specific names
# first (an "H100 PCIe" is not an SXM H100, an "L40S" is not an "L40", an "A100" not an "A10").
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0,
                    "A100": 312.0, "A40": 149.7, "L40S": 362.05, "L40": 181.05, "A10": 125.0,
                    "L4": 121.0, "RTX 4090": 165.2}


def _batch(cfg: ModelConfig, b: int, min_len: int, g: torch.Generator, pad_to: int | None):
    """Host batch (ids, mask, target) with lengths uniform in [min_len, max_len]."""
    lengths = torch.randint(min_len, cfg.max_len + 1, (b,), generator=g)  # (B,)
    width = int(lengths.max())
    ids = torch.randint(5, cfg.vocab_size, (b, width), generator=g)  # (B, L)
    mask = torch.arange(width) < lengths[:, None]  # (B, L)
    ids = ids.masked_fill(~mask, 0)
    if pad_to:
        ids, mask = fixed_length(ids, mask, pad_to, 0)  # (B, max_len)
    target = torch.nn.functional.normalize(torch.randn(b, cfg.out_dim, generator=g), dim=-1)
    return ids, mask, target.half()


def flops_per_sample(cfg: ModelConfig, model, tokens: float, seq: float) -> float:
    non_emb = sum(p.numel() for n, p in model.named_parameters()
                  if not n.startswith(("tok.", "pos.")))
    return 6 * non_emb * tokens + 12 * cfg.n_layers * seq * seq * cfg.d_model


def measure(arm, shape, batch, steps, device, bf16=False, compile_=False, min_len=8):
    """Timed trainer steps (after 3 warm-up steps, which include compilation)."""
    torch.manual_seed(0)
    cfg = ModelConfig(arm=arm, **shape)
    # the preset's optimiser and loss settings (smoke_data: no data is read, only required)
    train_cfg = resolve("e1" if device.type == "cuda" else "smoke", arm=arm,
                        overrides=["smoke_data=true", "tokenizer=", f"bf16={str(bf16).lower()}"])
    model = build_model(cfg).to(device).train()
    run = torch.compile(model) if compile_ else model
    t = step_trainer(train_cfg, model, steps + 4, World(), device)
    t.net = run
    g = torch.Generator().manual_seed(0)
    pad = cfg.max_len if compile_ else None
    pin = device.type == "cuda"
    host = [_batch(cfg, batch, min_len, g, pad) for _ in range(4)]
    batches = [tuple((t.pin_memory() if pin else t).to(device) for t in b) for b in host]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(i: int) -> None:
        train_step(t, batches[i % 4])

    t0 = time.perf_counter()
    for i in range(3):  # warm-up (and compilation)
        step(i)
    sync()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(steps):
        step(3 + i)
    sync()
    dt = time.perf_counter() - t0
    tokens = sum(float(m.sum()) for _, m, _ in host) / (4 * batch)  # real tokens per sample
    seq = sum(m.shape[1] for _, m, _ in host) / 4  # padded width per batch
    flops = flops_per_sample(cfg, model, seq, seq)  # padding tokens cost compute too
    return {"arm": arm, "device": device.type, "batch": batch, "steps": steps,
            "dtype": "bfloat16" if bf16 else "float32", "step": "train_step",
            "compile": compile_, "samples_per_s": steps * batch / dt, "warmup_s": warm,
            "real_tokens_per_sample": tokens, "width": seq, "tflops": flops * steps * batch / dt / 1e12}


def _peak(name: str, override: float | None) -> float | None:
    if override:
        return override
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def _number(kind, minimum):
    """argparse type: a number of `kind` >= `minimum` (a zero batch or step count has no
    throughput; say so instead of failing deep inside)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: must be >= {minimum}")
        return value
    parse.__name__ = kind.__name__
    return parse


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=_number(int, 1), default=20,
                    help="timed CPU steps per arm (default %(default)s)")
    ap.add_argument("--cpu-batch", type=_number(int, 1), default=64,
                    help="CPU batch, smoke shape (default %(default)s)")
    ap.add_argument("--gpu-batch", type=_number(int, 1), default=256,
                    help="CUDA batch, E1 shape (default %(default)s)")
    ap.add_argument("--gpu-steps", type=_number(int, 1), default=20,
                    help="timed CUDA steps per arm and mode (default %(default)s)")
    ap.add_argument("--threads", type=_number(int, 0), default=0,
                    help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--no-cuda", action="store_true", help="CPU figures only")
    ap.add_argument("--no-compile", action="store_true", help="CUDA: eager only, no torch.compile")
    ap.add_argument("--peak-tflops", type=_number(float, 1e-9),
                    help="dense bf16 peak of the GPU in TFLOP/s (default: from the built-in table)")
    ap.add_argument("--min-len", type=_number(int, 1), default=8,
                    help="shortest caption in tokens; lengths are uniform up to max_len "
                         "(default %(default)s)")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--json", help="also write all results to this file")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    for arm in args.arms:
        r = measure(arm, SMOKE, args.cpu_batch, args.steps, torch.device("cpu"),
                    min_len=min(args.min_len, SMOKE["max_len"]))
        results.append(r)
        print(f"cpu  smoke  {arm:12s} fp32            {r['samples_per_s']:9.1f} samples/s "
              f"({r['tflops'] * 1e3:.2f} GFLOP/s, width {r['width']:.0f})")
    if torch.cuda.is_available() and not args.no_cuda:
        dev = torch.device("cuda")
        name = torch.cuda.get_device_name(dev)
        peak = _peak(name, args.peak_tflops)
        print(f"cuda: {name}, bf16 dense peak {peak} TFLOP/s")
        for arm in args.arms:
            for comp in (False,) if args.no_compile else (False, True):
                r = measure(arm, E1, args.gpu_batch, args.gpu_steps, dev, True, comp,
                            min_len=min(args.min_len, E1["max_len"]))
                r["gpu"], r["mfu"] = name, (r["tflops"] / peak if peak else None)
                results.append(r)
                mfu = f"MFU {r['mfu']:.1%}" if r["mfu"] is not None else "MFU n/a (--peak-tflops)"
                print(f"cuda E1     {arm:12s} bf16 {'compile' if comp else 'eager  '}  "
                      f"{r['samples_per_s']:9.1f} samples/s  {r['tflops']:7.1f} TFLOP/s  {mfu}  "
                      f"(warm-up {r['warmup_s']:.1f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
