"""Caption flatten benchmark: `aleph data captions` peak RSS and throughput at two sizes.

For each size, on a generated CC12M-llavanext-shaped `train.jsonl.gz` (records with `key`,
`url`, `status`, `caption_llava` of ~580 characters, `caption_llava_short` of ~110, one
long caption in 13 missing, one short caption in 9 under 50 characters; gzip level 6):
  1. `python -m aleph data captions SRC --fields caption_llava,caption_llava_short
     --min-chars 50 --out OUT.parquet`: its own time (the seconds it prints, without the
     interpreter's start and imports), records/s and peak RSS (ru_maxrss of that process
     alone, through bench/peak.py's launcher; ~0.4 GB of it is the import of torch, which
     `aleph.data` pulls in);
  2. the caption source's row count and content hash over one field
     (`open_captions(SRC, column="caption_llava_short")`: count_rows + sha256), the path
     the trainer takes on a .jsonl.gz: wall and peak RSS;
  3. the limit, in the same run: a plain `gzip` line read of the same file in its own
     process (`for line in gzip.open(SRC)`), records/s; the ratio is (1)'s records/s over it.
Printed per size: rows written, wall, records/s, ratio to gzip, peak RSS of (1) and (2);
then the goal: peak RSS of (1) and (2) flat (1M within 10% of 100k, plus 16 MB).

Run from the repository root with the venv of `./aleph-dev setup`:
    .venv/bin/python bench/bench_captions.py                       # 100k and 1M records
    .venv/bin/python bench/bench_captions.py --records 100000,1000000 --dir /tmp/capbench
Disk: ~0.3 KB of .jsonl.gz and ~0.4 KB of parquet per record (1M: ~0.7 GB), under --dir
(default /tmp/aleph-bench-captions; removed afterwards unless --keep). Never in the repo.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from peak import run_peak  # noqa: E402  (bench/ on the path first)
from synth import captions, lexicon  # noqa: E402

MB = 1e6
FIELDS = "caption_llava,caption_llava_short"
BLOCK = 20_000  # records generated per block


def write_source(path: Path, records: int) -> None:
    words = lexicon(0)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) as f:
        for start in range(0, records, BLOCK):
            n = min(BLOCK, records - start)
            long = captions(n, start, 0, words)
            short = captions(n, start + 10**9, 0, words)
            for j in range(n):
                i = start + j
                rec = {"key": f"{i:09d}", "url": f"https://example.org/img/{i}.jpg",
                       "status": "success", "caption_llava": long[j],
                       "caption_llava_short": short[j][: 30 if i % 9 == 0 else 110]}
                if i % 13 == 5:
                    del rec["caption_llava"]
                f.write(json.dumps(rec) + "\n")
    os.replace(tmp, path)


GZIP_READ = ("import gzip, sys, time\nt0 = time.perf_counter()\nn = 0\n"
             "with gzip.open(sys.argv[1], 'rb') as f:\n    for _ in f:\n        n += 1\n"
             "print('GZIP', n, time.perf_counter() - t0)")
HASH = ("import sys, time\nfrom aleph.data import open_captions\nt0 = time.perf_counter()\n"
        "s = open_captions(sys.argv[1], column='caption_llava_short')\n"
        "print('HASH', s.count_rows(), s.sha256(), time.perf_counter() - t0)")


def measure(d: Path, records: int, env: dict) -> dict:
    src = d / "train.jsonl.gz"
    write_source(src, records)
    out = d / "flat.parquet"
    flat = run_peak([sys.executable, "-m", "aleph", "data", "captions", str(src), "--fields",
                     FIELDS, "--min-chars", "50", "--out", str(out)], env, cwd=REPO)
    rows = int(flat["out"].strip().splitlines()[-1])
    flat_s = float(flat["out"].split(" records (order ")[1].split(") in ")[1].split(" s;")[0])
    hashed = run_peak([sys.executable, "-c", HASH, str(src)], env, cwd=REPO)
    count, _, hash_s = hashed["out"].split("HASH ")[1].split()[:3]
    count = int(count)
    base = run_peak([sys.executable, "-c", GZIP_READ, str(src)], env, cwd=REPO)
    n, gz_s = base["out"].split("GZIP ")[1].split()[:2]
    if int(n) != records or count != records:
        raise SystemExit(f"record counts differ: gzip {n}, count_rows {count}, wrote {records}")
    out_mb = out.stat().st_size / MB
    src_mb = src.stat().st_size / MB
    out.unlink()
    return {"records": records, "rows": rows, "wall": flat["wall"], "rss": flat["rss"],
            "flat_s": flat_s, "hash_s": float(hash_s), "hash_rss": hashed["rss"],
            "gzip_rate": records / float(gz_s), "rate": records / flat_s,
            "src_mb": src_mb, "out_mb": out_mb}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", default="100000,1000000", help="comma list of two sizes")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new one under "
                                                "/tmp/aleph-bench-captions)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    args = ap.parse_args()
    sizes = [int(s) for s in args.records.split(",")]
    base = Path(args.dir) if args.dir else Path("/tmp/aleph-bench-captions")
    base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="run-", dir=base))
    env = dict(os.environ, PYTHONPATH=str(REPO), ALEPH_WORK=str(root / "work"))
    results = []
    try:
        for n in sizes:
            d = root / str(n)
            d.mkdir()
            r = measure(d, n, env)
            results.append(r)
            print(f"{n:>9,} records ({r['src_mb']:.0f} MB gz): {r['rows']:,} rows "
                  f"({r['out_mb']:.0f} MB parquet) in {r['flat_s']:.1f} s = {r['rate']:,.0f} "
                  f"records/s = {r['rate'] / r['gzip_rate']:.2f}x a plain gzip read "
                  f"({r['gzip_rate']:,.0f}/s); peak RSS {r['rss'] / MB:.0f} MB; count+sha256 "
                  f"{r['hash_s']:.1f} s, peak RSS {r['hash_rss'] / MB:.0f} MB", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    lo, hi = results[0], results[-1]
    ok = True
    for key, what in (("rss", "flatten"), ("hash_rss", "count+sha256")):
        flat = hi[key] <= 1.10 * lo[key] + 16 * MB
        ok &= flat
        print(f"goal: {what} peak RSS flat from {lo['records']:,} to {hi['records']:,} records: "
              f"{lo[key] / MB:.0f} -> {hi[key] / MB:.0f} MB (x{hi[key] / lo[key]:.2f}): "
              f"{'PASS' if flat else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
