"""`aleph data smoke|tokens|captions|check-align|fetch|sts`: the smoke data set, token
stores, flattened captions, the caption/target alignment check, the offline bundle (and
E1's captions) and STS pairs from the shell."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from aleph._io import atomic_write_text
from aleph.errors import DataError


def _smoke(args) -> int:
    from aleph.data import ensure_smoke_data
    from aleph.data.smoke import default_root

    root = Path(args.root) if args.root else default_root(args.rows, args.seed)
    data = ensure_smoke_data(root, rows=args.rows, seed=args.seed)
    print(json.dumps({"rows": data.rows, "captions": str(data.captions),
                      "target_chunks": [str(p) for p in data.target_chunks],
                      "tokenizer_dir": str(data.tokenizer_dir)}, indent=2))
    return 0


def _tokens(args) -> int:
    """Build or reuse the store; exit 76 (errors.EXIT_STOPPED) after any number of
    SIGTERM/SIGINT, with one line: a store is written whole or not at all, and its staging
    directory is removed on the way out."""
    import time

    from aleph._signals import run_until_stop
    from aleph.data import build_token_store, load_tokenizer, tokenizer_fingerprint
    from aleph.data.captions import open_captions
    from aleph.data.tokenizer import configure_threads
    from aleph.data.tokens import STORE_MANIFEST, token_store_dir

    where = [Path(args.out)] if args.out else []  # the store, once its path is known

    def body() -> str:
        tokenizer = load_tokenizer(args.tokenizer)
        captions = open_captions(args.captions, column=args.column, split=args.split)
        threads = configure_threads()
        t0, c0 = time.perf_counter(), time.process_time()
        digest = None if args.out else _captions_digest(args, captions)
        t1 = time.perf_counter()
        out = Path(args.out) if args.out else token_store_dir(
            digest, tokenizer_fingerprint(tokenizer), args.max_len)
        where[:] = [out]
        reused = out.exists()
        store = build_token_store(captions, tokenizer, out, max_len=args.max_len,
                                  expect_sha256=digest)
        t2, cpu = time.perf_counter(), time.process_time() - c0  # CPU: all threads of the process
        timing = "" if reused else (f"; {t2 - t0:.1f} s = captions sha256 {t1 - t0:.1f} s + tokenise "
                                    f"{t2 - t1:.1f} s, {store.rows / max(t2 - t0, 1e-9):,.0f} rows/s, "
                                    f"CPU {cpu:.1f} s = {cpu / max(t2 - t0, 1e-9):.2f} cores busy")
        return (f"{store.path}: {'reused' if reused else 'built'}, {store.rows:,} rows x "
                f"{store.max_len} tokens, pad id {store.pad_id} ({threads}{timing})")

    def kept(signame: str) -> str:
        if where and (where[0] / STORE_MANIFEST).is_file():
            return f"stopped by {signame}: the token store {where[0]} is complete"
        return (f"stopped by {signame} before the token store was complete: nothing was kept "
                "(a store is written whole or not at all)")

    return run_until_stop("data tokens", body, kept, lambda: [
        "data", "tokens", "--captions", args.captions, "--column", args.column, "--split",
        args.split, "--tokenizer", args.tokenizer, "--max-len", str(args.max_len),
        *(["--out", args.out] if args.out else [])])


def _captions_digest(args, captions) -> str:
    """The captions' sha256, through the memo training keeps (`aleph.train.preflight.
    captions_digest`), so a store built here is found by training without re-hashing
    31.9M captions, and vice versa. A hub split other than train is hashed afresh (the
    memo's key names the dataset, not the split)."""
    from aleph.train.preflight import captions_digest

    if captions.kind == "hub" and args.split != "train":
        return captions.sha256()
    return captions_digest(args.captions, lambda _source: captions, args.column)[0]


def _fetch(args) -> int:
    """Fill an offline bundle from the hub: the tokenizers and STS tasks a real run needs;
    with --captions, E1's caption file instead (`aleph.data.fetch`)."""
    if args.captions:
        from aleph.data.fetch import fetch_captions

        fetch_captions(args.out, revision=args.revision, say=print, expect_sha256=args.sha256)
        return 0
    from aleph.data.bundle import bundle_root
    from aleph.eval.tasks import E1_TASKS, fill_bundle, parse_task_names

    root = Path(args.out).expanduser().absolute() if args.out else bundle_root()
    names = parse_task_names(args.tasks) if args.tasks else list(E1_TASKS)
    size = fill_bundle(root, args.tokenizer or ["bert-base-uncased"], names, print)
    print(f"bundle {root}: {size:,} bytes; copy this directory to <work>/data/offline on the "
          "target machine (or point ALEPH_OFFLINE_BUNDLE at it)")
    return 0


def _captions(args) -> int:
    from aleph.data import flatten as fl
    from aleph.data.fetch import CAPTIONS_FILE, captions_dir

    if args.e1:  # the e1 preset's choice; flags given explicitly still win
        args.fields = args.fields or ",".join(fl.E1_FIELDS)
        args.order = args.order or fl.E1_ORDER
        args.min_chars = fl.E1_MIN_CHARS if args.min_chars is None else args.min_chars
        args.src = args.src or str(captions_dir() / CAPTIONS_FILE)
        args.out = args.out or str(captions_dir() / "captions.parquet")
    missing = [f"--{k.replace('_', '-')}" if k != "src" else "SRC"
               for k in ("src", "fields", "out") if not getattr(args, k)]
    if missing:
        raise DataError(f"aleph data captions: {', '.join(missing)} required (or --e1 for the "
                        "e1 preset's choice)")
    order, min_chars = args.order or "record", args.min_chars or 0
    done = fl.same_flatten(args.src, fl.parse_fields(args.fields), args.out, order, min_chars)
    if done is not None:  # a rerun: the output is this very flatten, nothing to do
        print(f"{done.out}: already holds this flatten of {args.src} ({done.rows:,} rows from "
              f"{done.records:,} records, order {order}, min {min_chars} chars; the source is "
              "unchanged since): done, nothing written", file=sys.stderr)
        print(done.rows)
        return 0
    res = fl.flatten_captions(args.src, fl.parse_fields(args.fields), args.out, order=order,
                              min_chars=min_chars, say=lambda line: print(line, file=sys.stderr))
    skipped = {f: {k: v for k, v in d.items() if v} for f, d in res.skipped.items()}
    print(f"{res.out}: {res.rows:,} rows from {res.records:,} records (order {order}, "
          f"min {min_chars} chars) in {res.seconds:.1f} s; rows per field {res.kept}; "
          f"skipped {skipped}", file=sys.stderr)
    if args.e1:
        print(f"e1 preset: {res.rows:,} rows, E1's targets have {fl.E1_TARGET_ROWS:,} "
              f"({res.rows - fl.E1_TARGET_ROWS:+,}); E1's own fields, order and filter are not "
              "public (README, 'Our choices')", file=sys.stderr)
    print(res.rows)  # stdout: the row count alone, for scripts
    return 0


def _check_align(args) -> int:
    from aleph.data import load_tokenizer, open_captions
    from aleph.data.align import check_pairing, target_files

    captions = open_captions(args.captions, column=args.column)
    targets = target_files(args.targets)
    result = check_pairing(captions, targets, load_tokenizer(args.tokenizer),
                             sample=args.sample, seed=args.seed,
                             target_desc=f"targets {args.targets} ({len(targets)} chunk file(s))")
    print(f"check-align {args.captions} vs {args.targets}: {result.line()}")
    return 0 if result.aligned else 1


def _sts(args) -> int:
    from aleph.data import sts_pairs

    lines = [json.dumps({"text_a": a, "text_b": b, "score": g}) for a, b, g in
             sts_pairs(args.n, args.seed)]
    text = "\n".join(lines) + "\n"
    if args.out:
        try:
            atomic_write_text(args.out, text)
        except OSError as e:
            raise DataError(f"--out {args.out}: cannot write ({e.strerror}); "
                            "expected a file path in a writable directory") from None
        print(f"{args.out}: {len(lines)} pairs")
    else:
        print(text, end="")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("data", help="smoke data set, token stores, offline bundle, "
                                           "smoke STS pairs")
    sub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    s = sub.add_parser("smoke", help="write (or reuse) the deterministic offline smoke data set")
    s.add_argument("--root", help="directory (default: <work>/data/smoke-<rows>[-s<seed>], where training looks)")
    s.add_argument("--rows", type=int, default=4096, help="caption rows (default 4096)")
    s.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    s.set_defaults(func=_smoke)
    t = sub.add_parser("tokens", help="tokenise captions once into a token store (or reuse it)")
    t.add_argument("--captions", required=True,
                   help=".txt/.jsonl/.json/.parquet file (.txt.gz/.jsonl.gz too), a directory of "
                        ".jsonl/.jsonl.gz/.parquet shards (name order) or a Hugging Face dataset id")
    t.add_argument("--column", default="caption", help="caption field/column (default caption)")
    t.add_argument("--split", default="train", help="dataset split for a hub id")
    t.add_argument("--tokenizer", default="bert-base-uncased", help="hub name or directory")
    t.add_argument("--max-len", type=int, default=128, help="tokens per row (default 128)")
    t.add_argument("--out", help="store directory (default: <work>/cache/tokens/<key>)")
    t.set_defaults(func=_tokens)
    c = sub.add_parser("captions", help="flatten caption records (several fields per image) "
                                        "into one caption per row, with source_row and field")
    c.add_argument("src", nargs="?", help=".jsonl/.jsonl.gz/.parquet file of records, or a "
                                          "directory of such shards (read in name order)")
    c.add_argument("--fields",
                   help="comma list of the record fields to take, e.g. caption_llava,caption_llava_short")
    c.add_argument("--order", choices=("record", "field"),
                   help="record: each record's fields in turn (default); field: every "
                        "record's first field, then every record's second, ...")
    c.add_argument("--min-chars", type=int,
                   help="keep a field only if its string has at least N characters (default 0: "
                        "any non-empty string)")
    c.add_argument("--out", help="parquet file to write (caption, source_row, field); never "
                                 "replaced if it exists")
    c.add_argument("--e1", action="store_true",
                   help="the e1 preset's choice: caption_llava,caption_llava_short, order record, "
                        "min 50 chars, from <work>/data/e1/train.jsonl.gz to "
                        "<work>/data/e1/captions.parquet (README, 'Our choices')")
    c.set_defaults(func=_captions)
    a = sub.add_parser("check-align", help="does caption row i belong with target row i? "
                                           "(exit 0 aligned, 1 misaligned, 2 bad input)")
    a.add_argument("--captions", required=True, help="caption source (file, shard directory "
                                                     "or hub id), as for tokens")
    a.add_argument("--column", default="caption", help="caption field/column (default caption)")
    a.add_argument("--targets", required=True, help="target chunk file or directory of chunks "
                                                    "(row order = name order)")
    a.add_argument("--tokenizer", default="bert-base-uncased", help="hub name or directory "
                                                                    "(the run's tokenizer)")
    a.add_argument("--sample", type=int, default=4096,
                   help="caption rows sampled, in 16 blocks spread over the rows (default 4096)")
    a.add_argument("--seed", type=int, default=0, help="seed of the shuffled control (default 0)")
    a.set_defaults(func=_check_align)
    f = sub.add_parser("fetch", help="download what a real run needs from the hub into an "
                                     "offline bundle (tokenizer, the 8 STS tasks), or with "
                                     "--captions E1's caption file")
    f.add_argument("--out", help="bundle directory (default: $ALEPH_OFFLINE_BUNDLE, else "
                                 "<work>/data/offline, where the loaders look)")
    f.add_argument("--tokenizer", action="append",
                   help="hub tokenizer name, repeatable (default: bert-base-uncased)")
    f.add_argument("--tasks", help="comma list of STS tasks (default: e1, the 8 tasks)")
    f.add_argument("--captions", action="store_true",
                   help="fetch E1's captions instead: train.jsonl.gz of CaptionEmporium/"
                        "conceptual-captions-cc12m-llavanext (CC-BY-SA-4.0), pinned, size and "
                        "sha256 checked, into --out (default <work>/data/e1)")
    f.add_argument("--revision", default="1c24bdb",
                   help="captions revision (default 1c24bdb, resolved to the full commit id and "
                        "recorded at the first download)")
    f.add_argument("--sha256", metavar="HEX",
                   help="with --captions: the sha256 the caption file must have, from a source "
                        "you trust; the file's own record cannot prove it (default: "
                        "CAPTIONS_SHA256 in aleph/data/fetch.py, when set)")
    f.set_defaults(func=_fetch)
    q = sub.add_parser("sts", help="STS-style pairs from the smoke grammar, as JSON lines")
    q.add_argument("--n", type=int, default=1000, help="pairs to write (default 1000)")
    q.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    q.add_argument("--out", help="file to write (default: stdout)")
    q.set_defaults(func=_sts)
