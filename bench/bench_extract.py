"""Extraction benchmark: `extract.encode_chunk` rows/s vs a plain transformers forward.

Runs in the teacher environment (`./aleph-dev teachers python bench/bench_extract.py`).
A random-initialised BertModel (--layers x --width, default 4 x 256; no hub) and a WordPiece
tokenizer trained on generated captions. At two sizes (--rows, default 1,024 and 4,096
captions), in the same run, with the same model and the same batches:
  - extract: `encode_chunk` (length-sorted batches, tokenise, forward, masked mean pool,
    normalise, fp16 rows into a chunk file, fsync + rename);
  - plain: the loop a user would write: tokenizer(batch, padding=True) -> model ->
    masked mean of last_hidden_state -> normalise, over the very same batches, results
    kept in memory (nothing written).
Ratio = plain seconds / extract seconds (goal >= 0.9x); each side timed twice, alternating,
the faster kept. Both on the device the extraction would pick (GPU if present, else CPU).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "targets"))

from tiny_teachers import tokenizer  # noqa: E402  (tests/targets/tiny_teachers.py)
from transformers import BertConfig, BertModel  # noqa: E402

from aleph.targets.chunkio import ChunkWriter  # noqa: E402
from aleph.targets.extract import encode_chunk  # noqa: E402
from aleph.targets.teachers import ExtractOptions  # noqa: E402

WORDS = ("a dog cat runs on the green grass near big red house with small child playing ball "
         "in park under blue sky man woman rides bike street city night light").split()


def captions(n: int, seed: int = 0) -> list[str]:
    r = random.Random(seed)
    return [" ".join(r.choice(WORDS) for _ in range(r.randint(4, 60))) for _ in range(n)]


@torch.inference_mode()
def plain(tok, model, texts: list[str], opts: ExtractOptions) -> list[torch.Tensor]:
    order = sorted(range(len(texts)), key=lambda i: (-len(texts[i]), i))
    dev, outs = next(model.parameters()).device, []
    for s in range(0, len(order), opts.batch_size):
        b = tok([texts[i] for i in sorted(order[s:s + opts.batch_size])], padding=True,
                truncation=True, max_length=opts.max_length, return_tensors="pt").to(dev)
        h = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
        m = b["attention_mask"].unsqueeze(-1).float()
        outs.append(torch.nn.functional.normalize((h.float() * m).sum(1) / m.sum(1), dim=1).cpu())
    return outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs=2, default=[1024, 4096])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=128)
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = tokenizer(captions(2000, seed=1))
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=len(tok), hidden_size=args.width,
                                 num_hidden_layers=args.layers, num_attention_heads=4,
                                 intermediate_size=4 * args.width, pad_token_id=0))
    model = model.to(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32).eval()
    opts = ExtractOptions(max_length=128, batch_size=args.batch_size)
    print(f"extract bench: BertModel {args.layers} x {args.width} on {dev}, batch "
          f"{args.batch_size}, torch threads {torch.get_num_threads()}")
    for n in args.rows:
        texts = captions(n)
        best = {"extract": float("inf"), "plain": float("inf")}
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(2):
                w = ChunkWriter(str(Path(tmp) / f"chunk_{rep}.npy"), n, args.width)
                t0 = time.perf_counter()
                encode_chunk(tok, model, texts, opts, w, rep, lambda _n: None)
                best["extract"] = min(best["extract"], time.perf_counter() - t0)
                t0 = time.perf_counter()
                plain(tok, model, texts, opts)
                best["plain"] = min(best["plain"], time.perf_counter() - t0)
        e, p = best["extract"], best["plain"]
        print(f"  {n:,} rows: extract {n / e:,.1f} rows/s, plain forward {n / p:,.1f} rows/s: "
              f"ratio {p / e:.2f}x (goal >= 0.9x)")


if __name__ == "__main__":
    main()
