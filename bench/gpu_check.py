"""GPU check: what the CPU suite cannot check, run once on a machine with an NVIDIA GPU.

One PASS / FAIL / SKIP line per item, then a summary naming what was skipped; exit 0 when
nothing failed, 1 when an item failed, 2 when it cannot run (no CUDA device: one line).
`--out FILE.json` is rewritten (atomically) after every item: each item's status, detail,
figures and duration, the environment (GPUs, driver, torch, CUDA, cuDNN), the budget; a
run cut off still leaves what it found. The work directory is kept when an item fails
(its path printed) or when --work names it; else removed.

One global deadline, --budget-s (default 8 minutes): an item starts only when its
expected time fits what is left (else SKIP, with the reason), and every item, subprocess
or in-process, times out at the deadline at the latest. Items run cheapest-decisive
first, so a short budget still gives the verdicts that matter most:

  step-path        in-process, E1 shape (12 x 512, 256 x 128 tokens over 30,522 ids,
                   dropout 0.1, bf16): fused AdamW in every param group; this device's RNG
                   state restored, per-rank streams derived from a CPU-saved state; pinned
                   prefetched batches; one host sync per train_step (torch.cuda sync debug mode)
  alloc-cap        in-process: the trainer's allocator cap (0.1 of the GPU) lets 1 GiB
                   through and refuses cap + 1 GiB
  bench-eager      bench/bench_model.py, E1 shape, bf16, eager: samples/s, MFU on slots and
                   on real tokens, every arm
  bench-compiled   the same compiled (--compile-arms, default a1, a2): each faster than
                   eager, a2's MFU >= 25% on an A40/A100/H100/H200-class GPU (goal 40%)
  cuda-tests       the suite's CUDA tests (pytest -m gpu): none may skip (but the
                   two-device RNG test on one GPU)
  train-header     a short launch on E1-shaped synthetic data (1,024 captions longer than
                   128 tokens, a 30,522-word tokenizer, alloc_cap_fraction 0.9): its header
                   has the allocator cap line, then the VRAM probe line with 'pass'
  compile-ckpt-refused  compile=true + checkpointing=true refused (exit 2, the torch-2.4
                   law's message), before anything is written
  ckpt-alone       checkpointing=true alone trains at the full E1 shape
  compile-alone    compile=true alone trains (E1 width, heads, FFN, L and batch, 2 blocks)
  gather-pin       the target store's gather(pin=True), streaming and in-RAM: page-locked,
                   equal to the plain gather; pinned vs plain host-to-device rows/s
  nccl-2proc       torchrun, 2 NCCL ranks, follows the 1-process loss trajectory (smoke
                   shape, fp32, dropout 0); needs 2 GPUs: else SKIP
  campaign         `aleph campaign` of two smoke arms on every visible GPU (device=cuda)

The expected times (NEEDS_S) are sized from a CPU measurement: a cold aot_eager compile of
the E1 a1 model (dynamo capture + AOTAutograd, the host side of every backend) took 73 s
on one loaded CPU thread (bench/bench_compile.py --threads 1, 2026-12-01); inductor adds
code generation and Triton builds, so bench-compiled (two cold compiles, a1 and a2) is
given 240 s, compile-alone (2 blocks) 90 s. Unmeasured on a GPU.

Bare machine (the venv of ./aleph-dev):  .venv/bin/python bench/gpu_check.py --out check.json
In the image (every GPU of the host):    docker compose run --rm campaign python3 /opt/aleph/bench/gpu_check.py
Options: --list, --only/--skip ITEM[,ITEM], --work DIR, --budget-s, --out, --peak-tflops
(GPUs missing from gpu_peaks.py's table), --compile-arms, --gpu-steps.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # aleph from this checkout (or /opt/aleph in the image)
sys.path.insert(0, str(REPO / "bench"))  # the gpu_* modules beside this file

import gpu_runs as R  # noqa: E402
from gpu_items import (  # noqa: E402, F401  (re-exported: the CPU tests use them from here)
    ARMS,
    CAMPAIGN_ARGV,
    LAUNCHES,
    Ctx,
    Result,
    check_cap,
    check_header,
    compare_losses,
    e1_data,
    judge_bench,
    run_id,
    train_argv,
)

ITEMS = {  # in the order they run
    "step-path": "fused AdamW groups, per-device RNG, pinned prefetch, one sync per step (E1)",
    "alloc-cap": "the allocator cap refuses an allocation above it",
    "bench-eager": "bench_model.py at the E1 shape, bf16 eager, samples/s and MFU",
    "bench-compiled": "bench_model.py at the E1 shape, bf16 compiled: faster, MFU pass mark",
    "cuda-tests": "the suite's CUDA tests (pytest -m gpu)",
    "train-header": "allocator cap and VRAM probe header lines of a short E1-shaped launch",
    "compile-ckpt-refused": "compile + checkpointing refused (torch 2.4 law)",
    "ckpt-alone": "checkpointing alone trains (E1 shape)",
    "compile-alone": "compile alone trains (E1-shaped batches, 2 blocks)",
    "gather-pin": "target store gather(pin=True)",
    "nccl-2proc": "2 NCCL ranks (torchrun) follow the 1-process trajectory",
    "campaign": "aleph campaign on the visible GPUs",
}
NEEDS_S = {"step-path": 40, "alloc-cap": 10, "bench-eager": 60, "bench-compiled": 240,
           "cuda-tests": 120, "train-header": 45, "compile-ckpt-refused": 10,
           "ckpt-alone": 45, "compile-alone": 90, "gather-pin": 20, "nccl-2proc": 60,
           "campaign": 90}
"""Expected seconds per item on one GPU: an item starts only when this fits the budget."""
BUDGET_S = 8 * 60
RUNNERS = {
    "step-path": R.item_step_path, "alloc-cap": R.item_alloc_cap,
    "bench-eager": R.item_bench_eager, "bench-compiled": R.item_bench_compiled,
    "cuda-tests": R.item_cuda_tests, "train-header": R.item_train_header,
    "compile-ckpt-refused": R.item_compile_ckpt_refused, "ckpt-alone": R.item_ckpt_alone,
    "compile-alone": R.item_compile_alone, "gather-pin": R.item_gather_pin,
    "nccl-2proc": R.item_nccl, "campaign": R.item_campaign,
}
item_compile_ckpt_refused = R.item_compile_ckpt_refused  # the CPU tests run it for real


def select(only: str | None, skip: str | None) -> dict[str, str | None]:
    """item -> None (run it) or the reason it is skipped; ValueError names an unknown item."""
    def names(text: str | None, flag: str) -> list[str]:
        got = [x.strip() for x in (text or "").split(",") if x.strip()]
        bad = [x for x in got if x not in ITEMS]
        if bad:
            raise ValueError(f"{flag} {bad[0]!r}: not an item; items: {', '.join(ITEMS)}")
        return got
    keep, drop = names(only, "--only"), names(skip, "--skip")
    out: dict[str, str | None] = {}
    for name in ITEMS:
        if keep and name not in keep:
            out[name] = "not in --only"
        elif name in drop:
            out[name] = "--skip"
        else:
            out[name] = None
    return out


def budget_reason(item: str, left: float) -> str | None:
    """Why `item` does not start with `left` seconds of the budget, or None."""
    need = NEEDS_S[item]
    if left < need:
        return f"budget: {max(left, 0):.0f} s left of --budget-s, the item needs about {need} s"
    return None


class Record:
    """The --out JSON, rewritten atomically after every change (None: nothing written)."""

    def __init__(self, path: Path | None, head: dict) -> None:
        self.path, self.data = path, {**head, "items": {}, "state": "running"}
        self.write()

    def item(self, name: str, r: Result, seconds: float | None) -> None:
        self.data["items"][name] = {"status": r.status, "detail": r.detail,
                                    "figures": r.figures, "duration_s": seconds}
        self.write()

    def finish(self, **fields) -> None:
        self.data.update(fields)
        self.write()

    def write(self) -> None:
        if self.path is not None:
            from aleph._io import atomic_write_json

            atomic_write_json(self.path, self.data)


def environment() -> dict:
    """GPUs, driver, torch, CUDA and cuDNN as this process sees them."""
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "cuda_visible_devices":
           os.environ.get("CUDA_VISIBLE_DEVICES"), "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["cudnn"] = torch.backends.cudnn.version()
        env["driver"] = _driver()
    return env


def _driver() -> str | None:
    """The NVIDIA driver version (nvidia-smi), or None without nvidia-smi."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.splitlines()[0].strip() if p.returncode == 0 and p.stdout else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="gpu_check.py", description=__doc__.split("\n")[0],
        epilog="Items: " + ", ".join(ITEMS))
    ap.add_argument("--list", action="store_true", help="print the items and exit")
    ap.add_argument("--only", help="comma list of items to run (the others are skipped)")
    ap.add_argument("--skip", help="comma list of items to skip")
    ap.add_argument("--work", type=Path, help="work root for the launches (kept); default: a "
                    "temporary directory, removed at the end unless an item failed")
    ap.add_argument("--out", type=Path, help="JSON record, rewritten after every item")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S,
                    help="global deadline in seconds (default %(default)s)")
    ap.add_argument("--peak-tflops", type=float, help="dense bf16 peak of the GPU (TFLOP/s), for "
                    "GPUs missing from gpu_peaks.py's table")
    ap.add_argument("--compile-arms", nargs="+", default=["a1_anchored", "a2_dense"], choices=ARMS,
                    help="arms bench-compiled compiles (default a1_anchored a2_dense)")
    ap.add_argument("--gpu-steps", type=int, default=20, help="timed bench steps (default 20)")
    args = ap.parse_args(argv)
    try:
        args.selection = select(args.only, args.skip)
    except ValueError as e:
        ap.error(str(e))
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        ap.error(f"--peak-tflops {args.peak_tflops}: expected a number > 0")
    if args.gpu_steps < 1:
        ap.error(f"--gpu-steps {args.gpu_steps}: expected an integer >= 1")
    if not args.budget_s > 0:
        ap.error(f"--budget-s {args.budget_s}: expected a number of seconds > 0")
    return args


def cuda_or_reason() -> tuple[int, str] | str:
    """(GPU count, first GPU's name), or the one-line reason there is no CUDA device."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        return (f"no CUDA device visible (torch {torch.__version__}, built for CUDA "
                f"{torch.version.cuda}; CUDA_VISIBLE_DEVICES={cvd!r}): nothing to check; run it "
                "on a machine with an NVIDIA GPU and driver >= 550.54.15")
    return torch.cuda.device_count(), torch.cuda.get_device_name(0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, what in ITEMS.items():
            print(f"{name:22s} {what} (~{NEEDS_S[name]} s)")
        return 0
    t0 = time.monotonic()
    head = {"budget_s": args.budget_s, "started_unix": time.time(), "environment": environment()}
    found = cuda_or_reason()
    if isinstance(found, str):
        rec = Record(args.out, head)
        for item in ITEMS:
            rec.data["items"][item] = {"status": "SKIP", "detail": "not run: no CUDA device",
                                       "figures": {}, "duration_s": None}
        rec.finish(state="cannot run", reason=found, exit=2)
        print(f"gpu_check: FAIL: {found}", flush=True)
        return 2
    gpus, name = found
    work = args.work or Path(tempfile.mkdtemp(prefix="aleph-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(work.absolute(), gpus, name, args, deadline=t0 + args.budget_s)
    rec = Record(args.out, {**head, "work_dir": str(ctx.work)})
    print(f"gpu_check: {gpus} x {name}; work root {ctx.work}; budget {args.budget_s:.0f} s",
          flush=True)
    results: dict[str, Result] = ctx.results
    try:
        for item, reason in args.selection.items():
            if reason is None and item == "nccl-2proc" and gpus < 2:
                reason = f"{gpus} GPU: NCCL needs two GPUs for two ranks"
            reason = reason or budget_reason(item, ctx.deadline - time.monotonic())
            took = None
            if reason is not None:
                results[item] = Result("SKIP", reason)
            else:
                t = time.monotonic()
                try:
                    results[item] = RUNNERS[item](ctx)
                except Exception as e:  # an item's own failure must not end the others
                    results[item] = Result("FAIL", f"{type(e).__name__}: {e}")
                took = time.monotonic() - t
                results[item].detail += f" ({took:.0f} s)"
            r = results[item]
            rec.item(item, r, took)
            print(f"{r.status:4s} {item:22s} {r.detail}", flush=True)
    finally:
        failed = [k for k, r in results.items() if r.status == "FAIL"]
        keep = args.work is not None or failed or len(results) < len(ITEMS)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
        elif args.work is None:
            print(f"gpu_check: work directory kept: {ctx.work}", flush=True)
    total = time.monotonic() - t0
    count = {s: [k for k, r in results.items() if r.status == s] for s in ("PASS", "FAIL", "SKIP")}
    line = (f"gpu_check: {len(count['PASS'])} passed, {len(count['FAIL'])} failed, "
            f"{len(count['SKIP'])} skipped in {total:.0f} s on {gpus} x {name}")
    if count["FAIL"]:
        line += f"; failed: {', '.join(count['FAIL'])}"
    if count["SKIP"]:
        line += f"; skipped: {', '.join(f'{k} ({results[k].detail})' for k in count['SKIP'])}"
    print(line, flush=True)
    code = 1 if count["FAIL"] else 0
    rec.finish(state="done", summary=line, exit=code, duration_s=total,
               kept_work_dir=str(ctx.work) if (failed or args.work) else None)
    return code


if __name__ == "__main__":
    sys.exit(main())
