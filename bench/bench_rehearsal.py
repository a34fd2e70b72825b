"""Full-size rehearsal of the E1 data path at a fraction of its rows, extrapolated to E1.

E1: 31,905,616 caption rows, targets as 66 chunk files (.pt, fp16, 768-d), 4 epochs, under
the seed's container quota of 110,999,998,464 B. For each --fraction f (rows = f x E1):
  0. inputs: synthetic E1-shaped captions (parquet, ~580 chars a row; bench/synth.py) and
     66 target chunk files of fp16 unit rows, the rows split as evenly as E1's total allows
     (the seed records the total and the chunk count, not each chunk's size);
  1. `aleph targets plan DIR --quota 110999998464`;
  2. `aleph targets build DIR` (the streaming store the trainer uses);
  3. `aleph data tokens --captions C.parquet` (captions hashed, then tokenised);
  4. `aleph train --preset e1 --arm a2_dense` on CPU for --steps optimiser steps (the e1
     model shape: 12 x 512, 8 heads, FFN 2048, L=128; --batch-size, default 32, because a
     CPU step at batch 256 needs ~18 GB of fp32 activations), finding both stores in the
     cache as a real launch does.
Every stage runs as its own process; printed per stage: wall time, peak RSS of that
process alone (bench/peak.py), bytes it added on disk. Then the extrapolation to 31,905,616
rows: disk bytes per row x E1 rows (for the stages whose output grows with the rows);
peak RSS as a + b x rows fitted through the two smallest fractions when two or more are
given, or the larger of the two when they differ by no more than run-to-run noise (with
one fraction: the measured value, flagged); the planner's own prediction for 66
full-size chunks; each against the quota. Wall times are this machine's (CPU count printed); the training
stage reports seconds per step, not an E1 duration.

Run from the repository root with the venv of `./aleph-dev setup`:
    .venv/bin/python bench/bench_rehearsal.py --fractions 0.01,0.05
Disk: about 3.9 KB per row in all (chunks 1.5 KB, target store 1.5 KB, token store 0.5 KB,
parquet 0.35 KB): 1% of E1 is ~1.25 GB. Everything lives under --dir (default
bench/out/rehearsal) and is removed afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

E1_ROWS = 31_905_616
E1_CHUNKS = 66
DIM = 768
QUOTA = 110_999_998_464
GB = 1e9
NOISE = 64 << 20  # peak RSS differences up to this are run-to-run noise, not growth


def chunk_rows(total: int, chunks: int = E1_CHUNKS) -> list[int]:
    base, extra = divmod(total, chunks)
    return [base + (1 if i < extra else 0) for i in range(chunks)]


def write_targets(d: Path, rows: int, seed: int = 0) -> list[Path]:
    """66 .pt chunks of fp16 L2-normalised rows (torch.save of a plain tensor, as shipped)."""
    import torch

    d.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    paths = []
    for i, n in enumerate(chunk_rows(rows)):
        t = torch.nn.functional.normalize(torch.randn(n, DIM, generator=g), dim=-1).half()  # (n, 768)
        p = d / f"cc12m-chunk-{i:03d}.pt"
        torch.save(t, p)
        paths.append(p)
    return paths


def du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def run_stage(cmd: list[str], env: dict) -> dict:
    """Run one stage as a child process: wall seconds, its own peak RSS bytes, output."""
    from peak import run_peak

    return run_peak(cmd, env, cwd=REPO)


def rehearse(base: Path, fraction: float, steps: int, batch: int, threads: int) -> dict:
    import synth

    rows = max(E1_CHUNKS, round(E1_ROWS * fraction))
    root = base / f"f{fraction:g}"
    shutil.rmtree(root, ignore_errors=True)
    work, data = root / "work", root / "data"
    data.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), ALEPH_WORK=str(work),
               OMP_NUM_THREADS=str(threads))
    py = [sys.executable, "-m", "aleph"]
    stages: dict[str, dict] = {}
    tok_dir = base / "tokenizer"
    if not (tok_dir / "tokenizer.json").is_file():
        synth.write_tokenizer(tok_dir)

    t0 = time.perf_counter()
    captions = synth.write_captions_parquet(data / "captions.parquet", rows)
    stages["inputs: captions parquet"] = {"wall": time.perf_counter() - t0, "rss": None,
                                          "bytes": du(captions)}
    t0 = time.perf_counter()
    write_targets(data / "targets", rows)
    stages["inputs: 66 target chunks"] = {"wall": time.perf_counter() - t0, "rss": None,
                                          "bytes": du(data / "targets")}
    os.sync()
    tdir = str(data / "targets")
    s = run_stage(py + ["targets", "plan", tdir, "--quota", str(QUOTA)], env)
    stages["targets plan"] = {**s, "bytes": 0}
    s = run_stage(py + ["targets", "build", tdir], env)
    stages["targets build (streaming)"] = {**s, "bytes": du(work / "cache" / "targets")}
    s = run_stage(py + ["data", "tokens", "--captions", str(captions), "--tokenizer", str(tok_dir),
                        "--max-len", "128"], env)
    stages["data tokens"] = {**s, "bytes": du(work / "cache" / "tokens")}
    before = du(work / "runs")
    s = run_stage(py + ["train", "--arm", "a2_dense", "--seed", "0", "--preset", "e1",
                        "--set", f"captions={captions}", "--set", f"targets={tdir}",
                        "--set", f"tokenizer={tok_dir}", "--set", f"max_steps={steps}",
                        "--set", f"batch_size={batch}", "--set", "warmup_steps=1",
                        "--set", "device=cpu", "--set", f"num_threads={threads}",
                        "--set", "log_every_steps=1", "--set", "progress_every_seconds=5"], env)
    stages[f"train e1 shape, {steps} steps"] = {**s, "bytes": du(work / "runs") - before}
    metrics = work / "runs" / "a2_dense-s0" / "metrics.json"
    m = json.loads(metrics.read_text()) if metrics.is_file() else {}
    result = {"fraction": fraction, "rows": rows, "stages": stages, "metrics": m,
              "plan_out": stages["targets plan"]["out"], "tokens_out": stages["data tokens"]["out"]}
    return result


def full_size_plan() -> str:
    """The planner's prediction for E1 itself: 66 fp16 chunks summing to 31,905,616 rows."""
    from aleph.targets import plan
    from aleph.targets.sources import ChunkInfo

    infos = [ChunkInfo(f"cc12m-chunk-{i:03d}.pt", n, DIM, "float16")
             for i, n in enumerate(chunk_rows(E1_ROWS))]
    return plan(infos, QUOTA).describe()


# how each stage's figures scale with the row count: (disk, wall)
SCALES = {"inputs": (True, False), "targets plan": (False, False),
          "targets build": (True, True), "data tokens": (True, True), "train": (False, False)}


def _scales(name: str) -> tuple[bool, bool]:
    return next(v for k, v in SCALES.items() if name.startswith(k))


def report(results: list[dict], steps: int, batch: int, threads: int) -> None:
    fr = ", ".join(f"{r['fraction']:.2%} ({r['rows']:,} rows)" for r in results)
    print(f"\nE1 rehearsal at {fr} of {E1_ROWS:,} rows; {os.cpu_count()} CPUs visible, "
          f"{threads} torch/tokenizer threads; quota {QUOTA:,} B")
    names = list(results[0]["stages"])
    head = f"{'stage':34s}" + "".join(f" | {'f=' + format(r['fraction'], 'g'):>30s}" for r in results)
    print(head + f" | {'at E1 size (31,905,616 rows)':>45s}")
    print(f"{'':34s}" + "".join(f" | {'wall s':>8s} {'peak RSS':>10s} {'disk':>10s}" for _ in results)
          + f" | {'peak RSS':>11s} {'of quota':>8s} {'disk':>10s} {'wall s':>10s}")
    xs = [r["rows"] for r in results]
    last = results[-1]
    total = 0.0
    for name in names:
        row = f"{name:34s}"
        for r in results:
            s = r["stages"][name]
            rss = f"{s['rss'] / 2**30:6.2f} GiB" if s["rss"] else f"{'-':>10s}"
            row += f" | {s['wall']:8.1f} {rss:>10s} {s['bytes'] / GB:7.2f} GB"
        big = last["stages"][name]
        disk_scales, wall_scales = _scales(name)
        disk = big["bytes"] / last["rows"] * E1_ROWS if disk_scales else big["bytes"]
        total += disk
        ys = [r["stages"][name]["rss"] for r in results]
        if ys[0] is None:
            rss = f"{'-':>11s} {'-':>8s}"
        else:
            if len(results) >= 2 and abs(ys[1] - ys[0]) <= max(0.05 * ys[0], NOISE):
                est, flag = max(ys), "="  # flat within the noise of one process's peak
            elif len(results) >= 2:
                slope = max((ys[1] - ys[0]) / (xs[1] - xs[0]), 0.0)
                est, flag = ys[0] + slope * (E1_ROWS - xs[0]), " "
            else:
                est, flag = ys[0], "*"
            rss = f"{est / 2**30:6.2f} GiB{flag} {est / QUOTA:8.1%}"
        if name.startswith("train"):
            wall = f"{big['wall'] / steps:.1f}/step"
        elif wall_scales:
            wall = f"{big['wall'] / last['rows'] * E1_ROWS:,.0f}"
        else:
            wall = "-"
        mark = "" if disk_scales else " (fixed)"
        row += f" | {rss} {disk / GB:7.1f} GB {wall:>10s}{mark}"
        print(row)
    print(f"disk at E1 size, all stages: {total / GB:.0f} GB (row-proportional stages scaled by "
          "bytes per row of the largest fraction; '(fixed)': as measured, not row-proportional)")
    print("peak RSS at E1 size: a + b x rows through the two smallest fractions (b >= 0); "
          f"= : the two differ by at most 5% or {NOISE >> 20} MiB (noise), the larger is shown; "
          "* = one fraction only, the measured value. The training stage's figure covers "
          f"{steps} steps: over an epoch, random gathers map in pages of both stores (page "
          "cache, clean and reclaimable, not in this figure).")
    print(f"wall at E1 size: this machine, scaled by rows; training: seconds per optimiser step "
          f"at batch {batch} on CPU ({E1_ROWS // 256:,} steps per epoch at E1's batch 256).")
    print("\nplanner's prediction for E1 itself (66 full-size fp16 chunks):")
    print(full_size_plan())
    print(f"\nplanner at f={last['fraction']:g}:\n{last['plan_out'].strip()}")
    print(f"tokens at f={last['fraction']:g}: {last['tokens_out'].strip().splitlines()[-1]}")
    if last["metrics"]:
        m = last["metrics"]
        keep = {k: m[k] for k in ("step", "samples_seen", "first_loss", "final", "samples_per_sec")
                if k in m}
        print(f"train metrics.json: {json.dumps(keep)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fractions", default="0.01,0.05",
                    help="comma list of fractions of E1's rows (default %(default)s)")
    ap.add_argument("--steps", type=int, default=3, help="training steps (default %(default)s)")
    ap.add_argument("--batch-size", type=int, default=32, help="training batch (default %(default)s)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads of the training stage (default: the CPUs this process may use)")
    ap.add_argument("--dir", default=str(REPO / "bench" / "out" / "rehearsal"))
    ap.add_argument("--keep", action="store_true", help="keep inputs, stores and runs")
    args = ap.parse_args()
    try:
        fractions = sorted(float(x) for x in args.fractions.split(",") if x.strip())
    except ValueError:
        ap.error(f"--fractions {args.fractions!r}: expected a comma list of numbers")
    if not fractions or not all(0 < f <= 1 for f in fractions):
        ap.error(f"--fractions {args.fractions!r}: expected numbers in (0, 1]")
    if args.steps < 1 or args.batch_size < 2:
        ap.error("--steps must be >= 1 and --batch-size >= 2")
    threads = args.threads or len(os.sched_getaffinity(0))
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    need = 3.9e3 * E1_ROWS * max(fractions) * 1.2
    free = shutil.disk_usage(base).free
    if need > free:
        ap.error(f"fraction {max(fractions)} needs ~{need / GB:.1f} GB under {base}, "
                 f"{free / GB:.1f} GB free: pick a smaller fraction")
    results = []
    try:
        for f in fractions:
            print(f"rehearsal at f={f:g} ...", flush=True)
            results.append(rehearse(base, f, args.steps, args.batch_size, threads))
            if not args.keep:
                shutil.rmtree(base / f"f{f:g}", ignore_errors=True)
    finally:
        if not args.keep:
            for f in fractions:
                shutil.rmtree(base / f"f{f:g}", ignore_errors=True)
    report(results, args.steps, args.batch_size, threads)


if __name__ == "__main__":
    main()
