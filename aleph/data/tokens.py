"""The token store: captions tokenised once into a flat int32 memmap, verified on open.

Layout of a store directory (written into a temporary sibling and renamed, so a store
directory is complete or absent):
  ids.npy        int32 (rows, max_len), right-padded with pad_id (.npy: the header
                 records dtype and shape, checked on open)
  lengths.npy    int32 (rows,), real tokens per row ([CLS] ... [SEP] included)
  manifest.json  format, version, rows, max_len, pad_id, tokenizer fingerprint,
                 captions sha256, sha256 of both arrays
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from aleph._io import atomic_write_json, fsync_dir, read_json, sha256_file, sha256_json, work_root
from aleph.data.tokenizer import tokenizer_fingerprint
from aleph.errors import DataError, StoreError

FORMAT = "aleph-token-store"
VERSION = 1
BATCH = 8192  # captions tokenised per call; the only encodings held in memory at once


def token_store_dir(captions_sha: str, tok_fp: str, max_len: int, root: Path | None = None) -> Path:
    """The cache directory of a token store: <work root>/cache/tokens/<16 hex of the key>."""
    key = sha256_json({"captions": captions_sha, "tokenizer": tok_fp, "max_len": int(max_len)})
    return (root if root is not None else work_root()) / "cache" / "tokens" / key[:16]


def captions_sha256(captions: Sequence[str]) -> str:
    """sha256 of the captions as UTF-8 lines (each followed by \\n), in row order."""
    h = hashlib.sha256()
    for c in captions:
        h.update(c.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


class TokenStore:
    """Read-only view of a token store. Use `open_token_store`."""

    def __init__(self, path: Path, manifest: dict, ids: np.ndarray, lengths: np.ndarray) -> None:
        self.path, self.manifest = path, manifest
        self._ids, self._lengths = ids, lengths  # (N, L) int32 memmap, (N,) int32
        self.rows, self.max_len = int(manifest["rows"]), int(manifest["max_len"])
        self.pad_id = int(manifest["pad_id"])

    def __len__(self) -> int:
        return self.rows

    def gather(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows `indices` as (input_ids (B, L') long, attention_mask (B, L') bool).

        L' is the longest row of this batch, so short captions do not pay for max_len.
        """
        idx = np.asarray(indices.cpu() if torch.is_tensor(indices) else indices, dtype=np.int64)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= self.rows)):
            raise IndexError(f"token store {self.path}: indices must be 1-d in [0, {self.rows})")
        lengths = self._lengths[idx]  # (B,)
        width = int(lengths.max()) if idx.size else 0
        ids = torch.from_numpy(self._ids[idx, :width].astype(np.int64))  # (B, L')
        mask = torch.arange(width) < torch.from_numpy(lengths.astype(np.int64))[:, None]  # (B, L')
        return ids, mask


def build_token_store(captions: Sequence[str], tokenizer, out_dir: str | Path,
                      max_len: int = 128, batch: int = BATCH) -> TokenStore:
    """Tokenise `captions` (truncated to max_len) into a store at `out_dir`, or reuse it.

    An existing store built from the same captions, tokenizer and max_len is reused;
    one built from anything else is a StoreError (pick another directory or remove it).
    """
    out_dir = Path(out_dir)
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
        raise DataError(f"max_len {max_len!r}: expected an integer >= 2 (room for [CLS] and [SEP])")
    if tokenizer.pad_token_id is None:
        raise DataError("tokenizer has no [PAD] token; the token store pads with it")
    if len(captions) == 0:
        raise DataError("no captions to tokenise")
    want = {"captions_sha256": captions_sha256(captions),
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer), "max_len": int(max_len)}
    if not out_dir.exists():
        _build(out_dir, captions, tokenizer, want, batch)
    store = open_token_store(out_dir)
    diff = sorted(k for k, v in want.items() if store.manifest.get(k) != v)
    if diff:
        raise StoreError(f"token store {out_dir} was built from different {diff}; "
                         "remove it or choose another directory")
    return store


def _build(out_dir: Path, captions: Sequence[str], tokenizer, want: dict, batch: int) -> None:
    """Write the store in a temporary sibling, then rename it to `out_dir`.

    Two builders of the same store (runs launched together) both write; the second
    rename fails because `out_dir` exists, and that builder uses the winner's store.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        _write_arrays(tmp, captions, tokenizer, want["max_len"], batch)
        atomic_write_json(tmp / "manifest.json", {
            "format": FORMAT, "version": VERSION, "rows": len(captions),
            "pad_id": int(tokenizer.pad_token_id), **want,
            "files": {n: sha256_file(tmp / n) for n in ("ids.npy", "lengths.npy")}})
        try:
            os.rename(tmp, out_dir)  # fails if out_dir appeared meanwhile (another builder)
        except OSError:
            if not (out_dir / "manifest.json").is_file():
                raise
        else:
            fsync_dir(out_dir.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_arrays(tmp: Path, captions: Sequence[str], tokenizer, max_len: int, batch: int) -> None:
    rows = len(captions)
    ids = np.lib.format.open_memmap(tmp / "ids.npy", mode="w+", dtype=np.int32,
                                    shape=(rows, max_len))
    lengths = np.lib.format.open_memmap(tmp / "lengths.npy", mode="w+", dtype=np.int32,
                                        shape=(rows,))
    for start in range(0, rows, batch):
        enc = tokenizer(list(captions[start:start + batch]), truncation=True, max_length=max_len,
                        padding="max_length", return_tensors="np",
                        return_token_type_ids=False, return_attention_mask=True)
        stop = start + enc["input_ids"].shape[0]
        ids[start:stop] = enc["input_ids"]  # (b, max_len) right-padded with pad_id
        lengths[start:stop] = enc["attention_mask"].sum(axis=1)  # (b,)
    for arr in (ids, lengths):
        arr.flush()
    for name in ("ids.npy", "lengths.npy"):
        with open(tmp / name, "rb") as f:
            os.fsync(f.fileno())


def open_token_store(path: str | Path, verify_hashes: bool = False) -> TokenStore:
    """Open a store read-only, checking its manifest against the arrays' headers and lengths.

    `verify_hashes` also re-hashes both arrays (reads every byte: slow for the real corpus).
    """
    path = Path(path)
    man_path = path / "manifest.json"
    if not man_path.is_file():
        raise StoreError(f"token store {path}: no manifest.json (not a store, or incomplete)")
    try:
        man = read_json(man_path)
    except ValueError as e:
        raise StoreError(f"{man_path}: invalid JSON ({e})") from e
    if (man.get("format"), man.get("version")) != (FORMAT, VERSION):
        raise StoreError(f"{man_path}: format {man.get('format')!r} v{man.get('version')!r}, "
                         f"expected {FORMAT!r} v{VERSION}")
    for key in ("rows", "max_len", "pad_id"):
        value = man.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise StoreError(f"{man_path}: field {key!r} is {value!r}, expected an integer >= 0")
    files = man.get("files")
    if not isinstance(files, dict) or set(files) != {"ids.npy", "lengths.npy"}:
        raise StoreError(f"{man_path}: field 'files' is {files!r}, expected the sha256 of "
                         "ids.npy and lengths.npy")
    rows, max_len = man["rows"], man["max_len"]
    ids = _open_array(path / "ids.npy", (rows, max_len))
    lengths = _open_array(path / "lengths.npy", (rows,))
    if rows and (lengths.min() < 1 or lengths.max() > max_len):
        raise StoreError(f"{path / 'lengths.npy'}: lengths outside [1, {max_len}]")
    if verify_hashes:
        for name, digest in man["files"].items():
            if sha256_file(path / name) != digest:
                raise StoreError(f"{path / name}: sha256 differs from {man_path}")
    return TokenStore(path, man, ids, lengths)


def _open_array(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    try:
        arr = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise StoreError(f"{path}: missing or not a .npy array ({e})") from e
    if arr.dtype != np.int32 or arr.shape != tuple(shape):
        raise StoreError(f"{path}: {arr.dtype} {arr.shape}, manifest expects int32 {tuple(shape)}")
    return arr
