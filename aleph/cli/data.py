"""`aleph data smoke|tokens|sts`: the smoke data set, token stores and STS pairs from the shell."""

from __future__ import annotations

import json
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
    from aleph.data import build_token_store, load_captions, load_tokenizer, tokenizer_fingerprint
    from aleph.data.tokens import captions_sha256, token_store_dir

    tokenizer = load_tokenizer(args.tokenizer)
    captions = load_captions(args.captions, column=args.column, split=args.split)
    out = Path(args.out) if args.out else token_store_dir(
        captions_sha256(captions), tokenizer_fingerprint(tokenizer), args.max_len)
    reused = out.exists()
    store = build_token_store(captions, tokenizer, out, max_len=args.max_len)
    print(f"{store.path}: {'reused' if reused else 'built'}, {store.rows:,} rows x "
          f"{store.max_len} tokens, pad id {store.pad_id}")
    return 0


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
    p = subparsers.add_parser("data", help="smoke data set, token stores, smoke STS pairs")
    sub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    s = sub.add_parser("smoke", help="write (or reuse) the deterministic offline smoke data set")
    s.add_argument("--root", help="directory (default: <work>/data/smoke-<rows>[-s<seed>], where training looks)")
    s.add_argument("--rows", type=int, default=4096)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=_smoke)
    t = sub.add_parser("tokens", help="tokenise captions once into a token store (or reuse it)")
    t.add_argument("--captions", required=True,
                   help=".txt/.jsonl/.json/.parquet file or a Hugging Face dataset id")
    t.add_argument("--column", default="caption", help="caption field/column (default caption)")
    t.add_argument("--split", default="train", help="dataset split for a hub id")
    t.add_argument("--tokenizer", default="bert-base-uncased", help="hub name or directory")
    t.add_argument("--max-len", type=int, default=128)
    t.add_argument("--out", help="store directory (default: <work>/cache/tokens/<key>)")
    t.set_defaults(func=_tokens)
    q = sub.add_parser("sts", help="STS-style pairs from the smoke grammar, as JSON lines")
    q.add_argument("--n", type=int, default=1000)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--out", help="file to write (default: stdout)")
    q.set_defaults(func=_sts)
