"""`aleph targets build|verify|plan|info|extract|consensus`: target stores and the targets' making."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from aleph._io import work_root
from aleph._signals import run_until_stop
from aleph.env.cgroup import format_bytes
from aleph.errors import StoreError
from aleph.targets import build_store, open_store, plan, store_dir_for, verify_store
from aleph.targets.format import MANIFEST_FILE
from aleph.targets.lock import DEFAULT_LOCK_TIMEOUT_S
from aleph.targets.plan import DEFAULT_HEADROOM_BYTES
from aleph.targets.sources import chunk_files_in


def expand_sources(items: list[str]) -> list[str]:
    """Files as given; a directory contributes its chunk files in name order (see
    `chunk_files_in`: the order the trainer reads a `targets=` directory in)."""
    out = [f for item in items
           for f in (chunk_files_in(item) if os.path.isdir(item) else [item])]
    if not out:
        raise StoreError("no chunk files given (empty source list)")
    return out


def _build(args) -> int:
    """Build or reuse the store; exit 76 (errors.EXIT_STOPPED) after any number of
    SIGTERM/SIGINT, with one line: a streaming build resumes after its recorded chunks."""
    sources = expand_sources(args.sources)
    out = Path(args.out) if args.out else store_dir_for(sources, work_root())

    def body() -> str:
        if args.implementation == "in_ram" and not args.no_plan:
            plan(sources, args.quota, args.headroom).require("in_ram")
        store = build_store(sources, out, args.implementation,
                            nonfinite="fail" if args.fail_on_nonfinite else "warn",
                            lock_timeout_s=args.lock_timeout)
        return (f"{store.store_dir}: {store.rows:,} x {store.dim} {store.manifest['dtype']}, "
                f"{format_bytes(store.byte_length)}, built by {store.manifest['built_by']}, "
                f"manifest sha256 {store.manifest_sha256}")

    def kept(signame: str) -> str:
        if (out / MANIFEST_FILE).is_file():
            return f"stopped by {signame}: the store {out} is complete"
        return (f"stopped by {signame} before the store was complete: {out} holds the unfinished "
                "build (streaming resumes after the chunks it recorded; in_ram starts again)")

    opts = [("--quota", args.quota), ("--headroom", args.headroom)]
    return run_until_stop("targets build", body, kept, lambda: [
        "targets", "build", *args.sources, "--out", str(out), "--implementation",
        args.implementation, "--lock-timeout", repr(args.lock_timeout),
        *[w for k, v in opts if v is not None for w in (k, str(v))],
        *(["--fail-on-nonfinite"] if args.fail_on_nonfinite else []),
        *(["--no-plan"] if args.no_plan else [])])


def _store_arg(given: str) -> tuple[Path, str]:
    """The store a `store` argument names (a store, or a chunk directory resolved to its
    built store) and how to print it."""
    from aleph.targets.locate import resolve_store

    store = resolve_store(given)
    shown = str(store) if Path(given) == store else f"{store} (the store of chunk directory {given})"
    return store, shown


def _verify(args) -> int:
    store, shown = _store_arg(args.store)
    report = verify_store(store, full=args.full, sources=args.sources)
    kind = {"quick": "quick (manifest and size)",
            "full": "full (re-hashed every chunk range)",
            "sources": "sources (every chunk range re-hashed and equal to its source chunk)",
            }[report["level"]]
    print(f"{shown}: OK, {kind}: {report['rows']:,} x {report['dim']} {report['dtype']}, "
          f"{report['chunks']} chunks, {report['byte_length']:,} B")
    return 0


def _plan(args) -> int:
    p = plan(expand_sources(args.sources), args.quota, args.headroom,
             cgroup_root=args.cgroup_root)
    print(p.describe())
    return 0 if p.choice else 1


def _info(args) -> int:
    store = open_store(_store_arg(args.store)[0])
    m = dict(store.manifest)
    m["chunks"] = f"{len(m['chunks'])} chunks (see manifest.json)"
    print(json.dumps({**m, "manifest_sha256": store.manifest_sha256}, indent=2, sort_keys=True))
    return 0


def _consensus(args) -> int:
    """The consensus; exit 76 (errors.EXIT_STOPPED) after any number of SIGTERM/SIGINT, with
    one line saying what was kept and the command that resumes."""
    from aleph.targets.consensus import run_consensus, stop_summary

    def body() -> str:  # partial chunks never count; the summary prints once it is done
        r = run_consensus(args.teachers, args.out, fit_rows=args.fit_rows, whiten=args.whiten,
                          tol=args.tol, max_iter=args.max_iter)
        fit = r["fit"]
        return (f"{args.out}: {r['rows']:,} x {r['dim']} float16 consensus of "
                f"{len(r['teachers'])} teachers, fit on {fit['rows_used']:,} rows, "
                f"{fit['iterations']} sweeps (converged {fit['converged']}), relative residual "
                "per teacher " + " ".join(f"{x:.4f}" for x in fit["relative_residuals"]))

    return run_until_stop(
        "targets consensus", body, lambda signame: stop_summary(signame, Path(args.out).absolute()),
        lambda: ["targets", "consensus", "--teachers", *args.teachers, "--out", args.out,
                 "--fit-rows", str(args.fit_rows), "--whiten", args.whiten, "--tol",
                 repr(args.tol), "--max-iter", str(args.max_iter)])


def _extract(args) -> int:
    from dataclasses import fields

    from aleph.data.captions import open_captions
    from aleph.targets.extract import run_extract
    from aleph.targets.teachers import ExtractOptions

    # every ExtractOptions field is an option of `targets extract` under the same name
    opts = ExtractOptions(**{f.name: getattr(args, f.name) for f in fields(ExtractOptions)})
    return run_extract(args.captions, args.out, args.teachers, opts, open_captions)


VERIFY_LEVELS = """\
levels (exit 0: OK; exit 2: one line naming every bad chunk range and why):
  quick      the manifest's schema and arithmetic (rows x dim x itemsize = byte_length,
             chunk row ranges contiguous and covering every row) and the data file's exact
             size. Catches: missing, truncated or padded targets.bin; a damaged or edited
             manifest; an unfinished build. Misses: any changed byte inside the file.
  --full     quick + re-hash each chunk's row range of targets.bin and compare with the
             sha256 recorded at build. Catches: any byte of the store changed after the
             build. Misses: a source chunk changed after the build (the store is stale but
             consistent with itself).
  --sources  --full + re-read each source chunk at the path in the manifest, hash its rows
             and compare with the store's range. Catches: a source edited after the build,
             even with size and mtime kept (the cache, keyed on path, size and mtime, would
             reuse the stale store); a missing, unreadable or reshaped source. Reads the
             store and every source once.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("targets", help="build, verify, plan or describe a target store")
    sub = p.add_subparsers(dest="targets_command", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="build (or reuse) the store of an ordered list of chunks")
    b.add_argument("sources", nargs="+", help="chunk files (.pt/.npy/.safetensors) or directories")
    b.add_argument("--out", help="store directory (default: <work>/cache/targets/<fingerprint>)")
    b.add_argument("--implementation", choices=("streaming", "in_ram"), default="streaming",
                   help="streaming (memmap, default) or in_ram")
    b.add_argument("--fail-on-nonfinite", action="store_true", help="refuse NaN/Inf rows")
    b.add_argument("--lock-timeout", type=float, default=DEFAULT_LOCK_TIMEOUT_S,
                   help="seconds to wait for another builder of the same store")
    b.add_argument("--quota", type=int, help="memory quota in bytes for the in_ram check")
    b.add_argument("--headroom", type=int, default=DEFAULT_HEADROOM_BYTES,
                   help="bytes kept free beside the store in the quota check")
    b.add_argument("--no-plan", action="store_true", help="skip the quota check for in_ram")
    b.set_defaults(func=_build)
    v = sub.add_parser(
        "verify", help="check a store: quick (manifest, size), --full (re-hash) or --sources",
        description="Check a target store. Each level catches what the one before cannot.",
        epilog=VERIFY_LEVELS, formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("store", help="target store directory, or the chunk directory it was built "
                   "from (resolved to <work>/cache/targets/<key>)")
    level = v.add_mutually_exclusive_group()
    level.add_argument("--full", action="store_true",
                       help="also re-hash every chunk range of the store against the manifest")
    level.add_argument("--sources", action="store_true",
                       help="--full, and re-read every source chunk and compare its rows with "
                       "the store's bytes, range by range")
    v.set_defaults(func=_verify)
    pl = sub.add_parser("plan", help="predicted peak memory of each implementation vs the quota")
    pl.add_argument("sources", nargs="+", help="chunk files or directories")
    pl.add_argument("--quota", type=int, help="bytes (default: the cgroup memory limit)")
    pl.add_argument("--headroom", type=int, default=DEFAULT_HEADROOM_BYTES,
                    help="bytes kept free beside the store")
    pl.add_argument("--cgroup-root", default="/sys/fs/cgroup", help=argparse.SUPPRESS)  # tests
    pl.set_defaults(func=_plan)
    _register_making(sub)
    i = sub.add_parser("info", help="print a store's manifest summary")
    i.add_argument("store", help="target store directory, or the chunk directory it was built "
                   "from (resolved to <work>/cache/targets/<key>)")
    i.set_defaults(func=_info)


def _register_making(sub) -> None:
    from aleph.targets.consensus import DEFAULT_FIT_ROWS
    from aleph.targets.procrustes import WHITEN_MODES
    from aleph.targets.teachers import (
        A40_BF16_TFLOPS,
        ASSUMED_MFU,
        DEFAULT_TEACHERS,
        ExtractOptions,
    )

    e = sub.add_parser(
        "extract", help="encode captions with the teacher models into per-teacher fp16 chunks",
        description="Runs in the teacher environment (./aleph-dev extract, or the "
        "extract-targets compose service): transformers 4.x, which the E1 image lacks.")
    e.add_argument("--captions", required=True, help="captions file (.txt/.jsonl/.json/.parquet) "
                   "or hub dataset id; row i becomes target row i")
    e.add_argument("--out", required=True, help="output directory: one chunk directory per teacher")
    e.add_argument("--teachers", default=",".join(DEFAULT_TEACHERS),
                   help="comma-separated hub names (NAME@REVISION pins one) or local model "
                   "directories (default: the five of E1: %(default)s)")
    e.add_argument("--column", default="caption",
                   help="caption field of .jsonl/.json/.parquet (default: %(default)s)")
    e.add_argument("--max-length", type=int, default=ExtractOptions.max_length,
                   help="tokens per caption (truncated; batches padded to their longest; "
                   "default: %(default)s)")
    e.add_argument("--batch-size", type=int, default=ExtractOptions.batch_size,
                   help="captions per forward pass (default: %(default)s)")
    e.add_argument("--chunk-rows", type=int, default=ExtractOptions.chunk_rows,
                   help="rows per output chunk file, the resume unit (default: %(default)s)")
    e.add_argument("--assume-tflops", type=float, default=ExtractOptions.assume_tflops,
                   help="sustained TFLOP/s per GPU for the GPU-hours estimate (default: "
                   f"%(default)s = {ASSUMED_MFU * 100:.0f}%% of an A40's {A40_BF16_TFLOPS} dense bf16)")
    e.add_argument("--shard", default=None, metavar="I/N",
                   help="encode only chunks c with c %% N == I (one process per GPU or array "
                   "element; any N gives the chunks of one run); the consensus is run after "
                   "every shard finished (default: every chunk)")
    e.add_argument("--consensus-out", metavar="DIR",
                   help="then run `aleph targets consensus` of the teachers into DIR "
                   "(default fit): captions to a trainable target directory in one command")
    e.add_argument("--estimate-only", action="store_true",
                   help="print the FLOPs and GPU-hours estimate and stop")
    e.set_defaults(func=_extract)
    c = sub.add_parser(
        "consensus", help="generalized-Procrustes consensus of teacher chunk directories",
        description="Fits orthogonal rotations of the teachers on up to --fit-rows rows, "
        "applies them chunk by chunk and writes the L2-normalised mean as fp16 chunks "
        "with the same names, plus consensus.json.")
    c.add_argument("--teachers", nargs="+", required=True, metavar="DIR",
                   help="teacher chunk directories (same chunk names and row counts)")
    c.add_argument("--out", required=True, help="output target directory")
    c.add_argument("--fit-rows", type=int, default=DEFAULT_FIT_ROWS,
                   help="rows the rotations are fitted on, evenly spaced (default %(default)s)")
    c.add_argument("--whiten", choices=WHITEN_MODES, default="none",
                   help="none: rotations only; zca: centre and whiten each teacher first")
    c.add_argument("--tol", type=float, default=1e-10,
                   help="stop when a sweep lowers the objective by less than this fraction")
    c.add_argument("--max-iter", type=int, default=500, help="most sweeps")
    c.set_defaults(func=_consensus)
