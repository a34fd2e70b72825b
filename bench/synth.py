"""Synthetic E1-shaped inputs for the data benchmarks (not used by the package or the suite).

- captions: English-looking text of about 580 characters per row (the mean length of the
  CC12M-llavanext captions E1 trains on), words drawn Zipf-like from a fixed lexicon of
  40,000 pseudo-words, written as parquet row group by row group (bounded memory);
- a WordPiece tokenizer of bert-base-uncased's size (30,522 entries: specials, characters,
  `##` characters, then the most frequent lexicon words), saved as a transformers
  directory, so the tokenizer does BERT's work per character without the hub.

Everything is a pure function of the arguments (seeded), so two runs measure the same rows.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

LEXICON = 40_000
VOCAB = 30_522
CAPTION_CHARS = 580
ROW_GROUP = 65_536


def lexicon(seed: int = 0) -> list[str]:
    """LEXICON distinct lowercase pseudo-words of 2-8 letters, most frequent first."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    p = 1.0 / np.arange(1, 27) ** 0.9
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < LEXICON:
        n = int(rng.integers(2, 9))
        w = "".join(rng.choice(letters, n, p=p / p.sum()))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def _zipf_p(n: int) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1) ** 1.05
    return p / p.sum()


def captions(rows: int, start: int = 0, seed: int = 0, words: list[str] | None = None) -> list[str]:
    """Rows [start, start + rows) of the synthetic corpus (deterministic per row block)."""
    words = words or lexicon(seed)
    arr = np.array(words)
    p = _zipf_p(len(words))
    rng = np.random.default_rng([seed, start])
    avg = np.mean([len(w) for w in words[:2000]]) + 1  # mean length of the frequent words + space
    per_row = max(1, int(CAPTION_CHARS / avg))
    idx = rng.choice(len(words), size=(rows, per_row), p=p)  # (rows, words per row)
    toks = arr[idx]
    out = []
    for r in range(rows):
        text = " ".join(toks[r])
        out.append(text[:CAPTION_CHARS].rstrip() + ".")
    return out


def write_captions_parquet(path: Path, rows: int, seed: int = 0, column: str = "caption",
                           row_group: int = ROW_GROUP) -> Path:
    """Parquet of `rows` synthetic captions in one `column`, written row group by row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    words = lexicon(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    schema = pa.schema([(column, pa.string())])
    with pq.ParquetWriter(tmp, schema, compression="snappy") as w:
        for start in range(0, rows, row_group):
            n = min(row_group, rows - start)
            w.write_table(pa.table({column: captions(n, start, seed, words)}, schema=schema))
    os.replace(tmp, path)
    return path


def write_tokenizer(out_dir: Path, seed: int = 0) -> Path:
    """A BERT-style uncased WordPiece tokenizer with bert-base-uncased's vocabulary size."""
    from transformers import BertTokenizer

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = sorted(set("abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()-"))
    vocab = specials + chars + [f"##{c}" for c in chars]
    vocab += [w for w in lexicon(seed) if len(w) > 1][: VOCAB - len(vocab)]
    tok = BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True,
                        model_max_length=512)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return out_dir
