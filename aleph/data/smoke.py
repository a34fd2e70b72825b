"""The embedded smoke data set: captions, targets and a tokenizer, generated offline.

`ensure_smoke_data(root)` writes, deterministically (same bytes for the same arguments):
  captions.txt            one caption per line, UTF-8
  targets/chunk-NNN.pt    fp16 (N_i, 768) unit rows, plain tensors (torch.load(weights_only=True))
  tokenizer/              a WordPiece tokenizer loadable with transformers' AutoTokenizer
  smoke.json              manifest, written last: arguments, rows, chunk rows, file sha256s
A later call reuses a set whose manifest and file hashes (checked every call) are intact.
"""

from __future__ import annotations

import fcntl
import io
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from aleph._io import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    fsync_dir,
    open_write_nofollow,
    read_json,
    sha256_file,
    work_root,
)
from aleph.data.grammar import SLOTS, Meaning, render, sample_meaning
from aleph.data.smoke_teacher import Teacher, overlap_cosine
from aleph.data.tokenizer import train_wordpiece
from aleph.errors import DataError

FORMAT = "aleph-smoke-data"
VERSION = 1
CHUNK_ROWS = 1024  # several chunks, like the real extraction's 66 CC12M chunk files
P_PARAPHRASE = 0.5  # share of rows that restate an earlier row's meaning in other words


@dataclass(frozen=True)
class SmokeData:
    captions: Path
    target_chunks: list[Path]
    tokenizer_dir: Path
    rows: int


def generate(rows: int, seed: int) -> tuple[list[str], np.ndarray]:
    """Captions and their fp16 unit targets (rows, 768); pure function of (rows, seed)."""
    rng, teacher = random.Random(seed), Teacher()
    meanings: list[Meaning] = []
    captions, targets = [], np.empty((rows, teacher.dim), dtype=np.float16)
    for i in range(rows):
        if meanings and rng.random() < P_PARAPHRASE:
            meaning = meanings[rng.randrange(len(meanings))]
        else:
            meaning = sample_meaning(rng)
            meanings.append(meaning)
        caption, template = render(meaning, rng)
        captions.append(caption)
        targets[i] = teacher.target(meaning, template)  # (768,) rounded to fp16
    return captions, targets


def _manifest_ok(root: Path, rows: int, seed: int) -> bool:
    try:
        man = read_json(root / "smoke.json") if (root / "smoke.json").is_file() else None
    except ValueError:
        return False
    want = {"format": FORMAT, "version": VERSION, "rows": rows, "seed": seed}
    if not isinstance(man, dict) or any(man.get(k) != v for k, v in want.items()) or not (
            isinstance(man.get("files"), dict) and isinstance(man.get("chunk_rows"), list)):
        return False
    files = man["files"]
    return bool(files) and all(
        isinstance(rel, str) and (root / rel).is_file() and sha256_file(root / rel) == digest
        for rel, digest in files.items())


def _smoke_data(root: Path, rows: int) -> SmokeData:
    chunks = len(read_json(root / "smoke.json")["chunk_rows"])
    return SmokeData(root / "captions.txt", [root / f"targets/chunk-{i:03d}.pt" for i in
                                             range(chunks)], root / "tokenizer", rows)


def default_root(rows: int = 4096, seed: int = 0) -> Path:
    """<work>/data/smoke-<rows> (seed 0) or smoke-<rows>-s<seed>: one directory per set, so
    sets of other sizes or seeds do not rebuild each other's (the trainer and `aleph data
    smoke` share them)."""
    name = f"smoke-{rows}" if seed == 0 else f"smoke-{rows}-s{seed}"
    return work_root() / "data" / name


def ensure_smoke_data(root: str | Path, rows: int = 4096, seed: int = 0) -> SmokeData:
    """Write the smoke data set into `root` unless an intact copy for (rows, seed) is there.
    Concurrent callers serialise on a lock file beside `root`; the set is staged in a
    temporary sibling and swapped in, so `root` is never half written."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 2:
        raise DataError(f"smoke rows: expected an integer >= 2, got {rows!r}")
    root = Path(root).absolute()
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        lock = os.fdopen(open_write_nofollow(root.parent / f".{root.name}.lock", append=True), "a")
    except OSError as e:
        if _manifest_ok(root, rows, seed):  # an intact set on a read-only volume: use it
            return _smoke_data(root, rows)
        raise DataError(f"smoke data root {root}: cannot create it or its lock file beside it "
                        f"({e.strerror}); expected a writable directory") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not _manifest_ok(root, rows, seed):
            _check_replaceable(root)
            stage = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
            try:
                _write(stage, rows, seed)
                _swap_in(stage, root)
            finally:
                shutil.rmtree(stage, ignore_errors=True)
        return _smoke_data(root, rows)


def _check_replaceable(root: Path) -> None:
    """Refuse to replace (and so delete) anything but a smoke set or an empty directory."""
    if not root.exists():
        return
    if not root.is_dir():
        raise DataError(f"smoke data root {root}: exists and is not a directory; "
                        "expected a smoke data directory or a path that does not exist")
    if not any(root.iterdir()):
        return
    try:
        fmt = read_json(root / "smoke.json").get("format")
    except (OSError, ValueError, AttributeError):
        fmt = None
    if fmt != FORMAT:
        raise DataError(f"smoke data root {root}: a non-empty directory without a smoke data "
                        "manifest (smoke.json); refusing to replace it. Expected a smoke data "
                        "directory, an empty directory, or a path that does not exist")


def _swap_in(stage: Path, root: Path) -> None:
    """Replace `root` by `stage` (a rename cannot replace a non-empty directory: two steps)."""
    if root.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{root.name}.old.", dir=root.parent))
        os.replace(root, old / "set")
        shutil.rmtree(old)
    os.replace(stage, root)
    fsync_dir(root.parent)


def _write(root: Path, rows: int, seed: int) -> None:
    captions, targets = generate(rows, seed)
    atomic_write_text(root / "captions.txt", "\n".join(captions) + "\n")
    chunk_rows = []
    for i, start in enumerate(range(0, rows, CHUNK_ROWS)):
        block = torch.from_numpy(targets[start:start + CHUNK_ROWS].copy())  # (N_i, 768) fp16
        buf = io.BytesIO()
        torch.save(block, buf)
        atomic_write_bytes(root / f"targets/chunk-{i:03d}.pt", buf.getvalue())
        chunk_rows.append(int(block.shape[0]))
    train_wordpiece(captions, root / "tokenizer")
    rels = ["captions.txt"] + [f"targets/chunk-{i:03d}.pt" for i in range(len(chunk_rows))]
    rels += sorted(f"tokenizer/{p.name}" for p in (root / "tokenizer").iterdir())
    atomic_write_json(root / "smoke.json", {
        "format": FORMAT, "version": VERSION, "rows": rows, "seed": seed, "dim": targets.shape[1],
        "dtype": "float16", "chunk_rows": chunk_rows,
        "files": {rel: sha256_file(root / rel) for rel in rels}})


def sts_pairs(n: int, seed: int) -> list[tuple[str, str, float]]:
    """n STS-style (text_a, text_b, gold 0-5) pairs from the smoke grammar: b restates a
    with 0-4 slots changed, gold = 5 * `overlap_cosine(a, b)` rounded to 3 decimals."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise DataError(f"sts pairs n {n!r}: expected a positive integer")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a = sample_meaning(rng)
        parts = a.concepts()
        for slot in rng.sample(sorted(SLOTS), rng.randint(0, len(SLOTS))):
            parts[slot] = rng.choice(sorted(set(SLOTS[slot]) - {parts[slot]}))
        if parts.get("companion") == parts["object"]:  # keep companions distinct from subjects
            parts.pop("companion")
        b = Meaning(**parts)
        gold = round(5.0 * overlap_cosine(a, b), 3)
        out.append((render(a, rng)[0], render(b, rng)[0], gold))
    return out
