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

import io
import itertools
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from aleph._io import (
    DurableWriter,
    atomic_write_json,
    check_free_space,
    check_record,
    fsync_dir,
    open_regular,
    read_json_record,
    sha256_file,
    sha256_json,
    work_root,
)
from aleph.data.captions import CaptionsHasher, CaptionSource
from aleph.data.tokenizer import configure_threads, tokenizer_fingerprint
from aleph.errors import DataError, StoreError

STORE_MANIFEST = "manifest.json"  # written last: a store counts once it exists
MANIFEST_MAX_BYTES = 16 << 20  # a token store manifest is a few hundred bytes
FORMAT = "aleph-token-store"
VERSION = 1  # unchanged by streaming builds: same layout, same bytes, same captions digest
BATCH = 8192  # captions per encode call; two batches of encodings are in memory at once
FLUSH_BYTES = 64 << 20  # written bytes between fdatasync + drop of a file's pages


def token_store_dir(captions_sha: str, tok_fp: str, max_len: int, root: Path | None = None) -> Path:
    """The cache directory of a token store: <work root>/cache/tokens/<16 hex of the key>."""
    key = sha256_json({"captions": captions_sha, "tokenizer": tok_fp, "max_len": int(max_len)})
    return (root if root is not None else work_root()) / "cache" / "tokens" / key[:16]


def captions_sha256(captions: Sequence[str] | CaptionSource) -> str:
    """sha256 of the captions as UTF-8 lines (each followed by \\n), in row order; a
    `CaptionSource` is hashed while streaming (its own `sha256`)."""
    if isinstance(captions, CaptionSource):
        return captions.sha256()
    h = CaptionsHasher()
    for i in range(0, len(captions), BATCH):
        h.update(captions[i:i + BATCH])
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

    @property
    def content_sha256(self) -> str:
        """Path-independent hash of the store: both arrays' sha256 (from the manifest) with
        rows, max_len and pad_id."""
        m = self.manifest
        return sha256_json({"files": m["files"], "rows": m["rows"], "max_len": m["max_len"],
                            "pad_id": m["pad_id"]})

    def require(self, want: dict) -> TokenStore:
        """This store, when its manifest records each field of `want` (captions_sha256,
        tokenizer_fingerprint, max_len); otherwise a StoreError naming the fields that differ."""
        diff = sorted(k for k, v in want.items() if self.manifest.get(k) != v)
        if diff:
            raise StoreError(f"token store {self.path} was built from different {diff}; remove it "
                             "(a cache directory is rebuilt) or choose another directory")
        return self

    def gather(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows `indices` as (input_ids (B, L') long, attention_mask (B, L') bool); L' is the
        longest row of this batch, so short captions do not pay for max_len."""
        idx = np.asarray(indices.cpu() if torch.is_tensor(indices) else indices, dtype=np.int64)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= self.rows)):
            raise IndexError(f"token store {self.path}: indices must be 1-d in [0, {self.rows})")
        lengths = self._lengths[idx]  # (B,)
        width = int(lengths.max()) if idx.size else 0
        ids = torch.from_numpy(self._ids[idx, :width].astype(np.int64))  # (B, L')
        mask = torch.arange(width) < torch.from_numpy(lengths.astype(np.int64))[:, None]  # (B, L')
        return ids, mask


class _ListSource:
    """A caption list seen through the `CaptionSource` interface the builder reads."""

    def __init__(self, captions: Sequence[str]) -> None:
        self._captions, self.name = captions, "the captions given"

    def count_rows(self) -> int:
        return len(self._captions)

    def batches(self, rows: int):
        for i in range(0, len(self._captions), rows):
            yield list(self._captions[i:i + rows])

    def sha256(self) -> str:
        return captions_sha256(self._captions)


def build_token_store(captions: Sequence[str] | CaptionSource, tokenizer, out_dir: str | Path,
                      max_len: int = 128, batch: int = BATCH, *, expect_sha256: str | None = None,
                      flush_bytes: int = FLUSH_BYTES) -> TokenStore:
    """Tokenise `captions` (a list or a `CaptionSource`, read batch by batch; truncated to
    max_len) into a store at `out_dir`, hashing them on the way: `expect_sha256` (computed
    earlier, e.g. to find the cache directory) must match, or nothing is kept. A store of
    the same captions, tokenizer and max_len is reused; of anything else, a StoreError."""
    out_dir = Path(out_dir)
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
        raise DataError(f"max_len {max_len!r}: expected an integer >= 2 (room for [CLS] and [SEP])")
    if tokenizer.pad_token_id is None:
        raise DataError("tokenizer has no [PAD] token; the token store pads with it")
    src = captions if isinstance(captions, CaptionSource) else _ListSource(captions)
    rows = src.count_rows()
    if rows == 0:
        raise DataError(f"no captions to tokenise in {src.name}")
    want = {"tokenizer_fingerprint": tokenizer_fingerprint(tokenizer), "max_len": int(max_len)}
    digest = expect_sha256
    if not out_dir.exists():
        digest = _build(out_dir, src, rows, tokenizer, want, batch, expect_sha256, flush_bytes)
    store = open_token_store(out_dir)
    if store.rows != rows:
        raise StoreError(f"token store {out_dir} was built from different ['captions_sha256'] "
                         f"({store.rows} rows; {src.name} has {rows}); remove it or choose "
                         "another directory")
    want["captions_sha256"] = digest if digest is not None else src.sha256()
    return store.require(want)


def _build(out_dir: Path, src, rows: int, tokenizer, want: dict, batch: int,
           expect_sha256: str | None, flush_bytes: int) -> str:
    """Write the store in a temporary sibling and rename it to `out_dir`; the captions'
    sha256. Of two builders of one store, the second rename fails and it uses the winner's."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    max_len = want["max_len"]
    check_free_space(out_dir.parent, rows * (max_len + 1) * 4 + 4096,
                     f"token store {out_dir.name} ({rows:,} rows x {max_len} int32 tokens)")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        digest, files = _write_arrays(tmp, src, rows, tokenizer, want["max_len"], batch,
                                      flush_bytes)
        if expect_sha256 is not None and digest != expect_sha256:
            raise DataError(f"captions {src.name}: sha256 {digest} while tokenising, but "
                            f"{expect_sha256} was expected (hashed earlier, or memoised in "
                            "<work>/cache/captions-sha256/): the captions changed in between; "
                            "remove the stale memo and rerun")
        atomic_write_json(tmp / STORE_MANIFEST, {
            "format": FORMAT, "version": VERSION, "rows": rows,
            "pad_id": int(tokenizer.pad_token_id), "captions_sha256": digest, **want,
            "files": files})
        try:
            os.rename(tmp, out_dir)  # fails if out_dir appeared meanwhile (another builder)
        except OSError:
            if not (out_dir / STORE_MANIFEST).is_file():
                raise
        else:
            fsync_dir(out_dir.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return digest


def _encoder(tokenizer, max_len: int):
    """The batch encode function of a private copy of the tokenizer's backend, truncating
    as transformers' `truncation=True` does: what transformers would call, minus its
    per-call Python work and shared truncation state. `encode_batch_fast` skips the
    character offsets the store does not keep; the ids are the same."""
    from tokenizers import Tokenizer

    enc = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    enc.no_padding()
    enc.enable_truncation(max_len, stride=0, strategy="longest_first",
                          direction=getattr(tokenizer, "truncation_side", "right"))
    return getattr(enc, "encode_batch_fast", enc.encode_batch)


def _write_arrays(tmp: Path, src, rows: int, tokenizer, max_len: int, batch: int,
                  flush_bytes: int) -> tuple[str, dict[str, str]]:
    """Stream `src` into ids.npy and lengths.npy; (captions sha256, file sha256s). Batch
    k+1 is encoded (GIL released) while batch k is written, hiding the Python side."""
    from concurrent.futures import ThreadPoolExecutor

    configure_threads()
    encode = _encoder(tokenizer, max_len)
    pad = int(tokenizer.pad_token_id)
    hasher = CaptionsHasher()
    ids_w = _npy_writer(tmp / "ids.npy", (rows, max_len), flush_bytes)
    len_w = _npy_writer(tmp / "lengths.npy", (rows,), flush_bytes)

    def emit(encodings) -> None:
        seqs = [e.ids for e in encodings]
        lengths = np.fromiter(map(len, seqs), dtype=np.int32, count=len(seqs))  # (b,)
        flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32,
                           count=int(lengths.sum()))
        ids = np.full((len(seqs), max_len), pad, dtype=np.int32)  # (b, max_len)
        ids[np.arange(max_len) < lengths[:, None]] = flat  # right-padded with pad_id
        ids_w.write(ids)
        len_w.write(lengths)

    try:
        with ThreadPoolExecutor(1, thread_name_prefix="aleph-tokenise") as pool:
            pending = None
            for texts in src.batches(batch):
                if hasher.rows + len(texts) > rows:
                    raise DataError(f"captions {src.name}: more rows than the {rows} counted "
                                    "before reading (changed while being read?)")
                hasher.update(texts)
                pending, done = pool.submit(encode, texts), pending
                if done is not None:
                    emit(done.result())
            if pending is not None:
                emit(pending.result())
        if hasher.rows != rows:
            raise DataError(f"captions {src.name}: {hasher.rows} rows read but {rows} counted "
                            "before reading (changed while being read?)")
        files = {"ids.npy": ids_w.finish()["sha256"], "lengths.npy": len_w.finish()["sha256"]}
    finally:
        ids_w.close()
        len_w.close()
    return hasher.hexdigest(), files


def _npy_writer(path: Path, shape: tuple[int, ...], flush_bytes: int) -> DurableWriter:
    """A new int32 .npy file of `shape` (a `DurableWriter`, reserved at its full size), its
    header (np.save's) written; its rows follow with `.write`."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {
        "descr": np.lib.format.dtype_to_descr(np.dtype(np.int32)),
        "fortran_order": False, "shape": tuple(shape)})
    head = header.getvalue()
    size = len(head) + int(np.prod(shape, dtype=np.int64)) * 4
    w = DurableWriter.create(path, size, flush_bytes=flush_bytes, error=StoreError)
    w.write(head)
    return w


def open_token_store(path: str | Path, verify_hashes: bool = False) -> TokenStore:
    """Open a store read-only, its manifest checked against the arrays' headers and lengths
    (`verify_hashes`: and their sha256, reading every byte)."""
    path = Path(path)
    man_path = path / STORE_MANIFEST
    if not man_path.is_file():
        raise StoreError(f"token store {path}: no manifest.json (not a store, or incomplete)")
    try:  # a regular file of bounded size and depth, no link followed
        man = read_json_record(man_path, MANIFEST_MAX_BYTES)
        if (man.get("format"), man.get("version")) != (FORMAT, VERSION):
            raise ValueError(f"format {man.get('format')!r} v{man.get('version')!r}, expected "
                             f"{FORMAT!r} v{VERSION}")
        check_record(man, {"rows": int, "max_len": int, "pad_id": int})
    except ValueError as e:
        raise StoreError(f"{man_path}: {e}") from None
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
    """The .npy at `path` mapped read-only from one fd: a regular file, no link followed (a
    FIFO never blocks), its header's int32 C-order `shape` checked before it is mapped."""
    fmt = np.lib.format
    try:
        with os.fdopen(open_regular(path, follow=False), "rb") as f:
            read = fmt.read_array_header_1_0 if fmt.read_magic(f) == (1, 0) else fmt.read_array_header_2_0
            got, fortran, dtype = read(f)
            if dtype != np.int32 or fortran or got != tuple(shape):
                raise StoreError(f"{path}: {dtype} {got}, manifest expects int32 {tuple(shape)}")
            return np.memmap(f, dtype=np.int32, mode="r", offset=f.tell(), shape=got)
    except OSError as e:
        raise StoreError(f"{path}: missing or not a .npy array ({e.strerror or e})") from None
    except (ValueError, SyntaxError) as e:
        raise StoreError(f"{path}: missing or not a .npy array ({e})") from None
