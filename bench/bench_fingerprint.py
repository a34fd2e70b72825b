"""Cost of the executed-code fingerprint (aleph.record.fingerprint) on a smoke run.

Runs `python -m aleph train --preset smoke` (the default smoke run: 4,096 rows, 128
steps, one thread) --rounds times with the tracer on and --rounds times with it switched
off (ALEPH_EXECUTED_TRACE=off), alternating, each in a fresh run directory of one work
root (the smoke data, the stores and the cache of scope hashes are built once, before the
first timed round: the timed rounds are the warm case, any launch after the first of a code
version). Prints the median wall time and the median CPU time (user + sys of the launch, less
sensitive to other load on the machine) of each, and the overhead in percent:
(on - off) / off. The cold case (the first launch of a code version in a work root, which
hashes the executed functions' source) is timed once each way, in fresh work roots.

    .venv/bin/python bench/bench_fingerprint.py               # 5 rounds each
    .venv/bin/python bench/bench_fingerprint.py --rounds 3 --arm a1_anchored
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _launch(work: Path, arm: str, trace: bool) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one smoke launch; scope hashes cached in the work root."""
    shutil.rmtree(work / "runs", ignore_errors=True)
    env = dict(os.environ, ALEPH_WORK=str(work), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
               ALEPH_CODE_CACHE=str(work / "code-scopes"))
    env.pop("ALEPH_EXECUTED_TRACE", None)
    if not trace:
        env["ALEPH_EXECUTED_TRACE"] = "off"
    t0, c0 = time.perf_counter(), _children_cpu()
    p = subprocess.run([sys.executable, "-m", "aleph", "train", "--arm", arm, "--preset", "smoke"],
                       cwd=REPO, env=env, capture_output=True, text=True)
    took = (time.perf_counter() - t0, _children_cpu() - c0)
    if p.returncode != 0:
        sys.exit(f"bench_fingerprint: the smoke run failed (exit {p.returncode}): "
                 f"{(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    return took


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _pct(on: float, off: float) -> str:
    return f"{100 * (on - off) / off:+.1f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="timed runs per mode (default 5)")
    ap.add_argument("--arm", default="a2_dense", choices=("a1_anchored", "a2_dense", "a3_random"))
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds: {args.rounds}: expected a positive integer")
    with tempfile.TemporaryDirectory(prefix="aleph-bench-fp-") as tmp:
        cold = {}
        for trace in (True, False):  # fresh work roots: smoke data and stores built first
            work = Path(tmp) / f"cold-{trace}"
            _launch(work, args.arm, False)  # data and stores, no scope cache
            cold[trace] = _launch(work, args.arm, trace)
        work = Path(tmp) / "work"
        _launch(work, args.arm, True)  # smoke data, stores, scope cache: built once
        times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for _ in range(args.rounds):
            for trace in (True, False):
                times[trace].append(_launch(work, args.arm, trace))
    med = {t: [statistics.median(x[i] for x in times[t]) for i in (0, 1)] for t in times}
    print(f"smoke run ({args.arm}), warm, median of {args.rounds}: wall {med[True][0]:.2f} s on "
          f"vs {med[False][0]:.2f} s off ({_pct(med[True][0], med[False][0])}); CPU "
          f"{med[True][1]:.2f} s vs {med[False][1]:.2f} s ({_pct(med[True][1], med[False][1])})")
    print(f"cold (first launch of this code in a work root), one each: wall {cold[True][0]:.2f} s "
          f"vs {cold[False][0]:.2f} s ({_pct(cold[True][0], cold[False][0])}); CPU "
          f"{cold[True][1]:.2f} s vs {cold[False][1]:.2f} s ({_pct(cold[True][1], cold[False][1])})")
    for trace in (True, False):
        print(f"  {'on ' if trace else 'off'} wall: " + " ".join(f"{w:.2f}" for w, _ in times[trace])
              + "  CPU: " + " ".join(f"{c:.2f}" for _, c in times[trace]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
