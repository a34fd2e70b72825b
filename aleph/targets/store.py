"""Reading a target store: `open_store` and `TargetStore` (gather and scan).

"streaming" maps the data file read-only (memory is page cache the kernel can drop);
"in_ram" holds all rows in one tensor, as the a1 arm's build did (the torch.cat of
the chunks). Both return the same rows; `gather` is what the trainer calls per batch.

Gather speed (bench/bench_store.py): in the steady state a random row gather is bound
by random access to RAM, not by copying or faults (an in-RAM array gathers at about the
same rate). A freshly opened mapping also pays one minor page fault per page-cache
folio it first touches, which measured ~1.5x slower for the first pass; `prefault=True`
maps the whole file at open (MADV_POPULATE_READ, which reads in what is not cached) so
the first epoch runs at the steady-state rate. It is opt-in: on a store larger than
the free page cache it would read in what the kernel then drops again.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from aleph._io import read_json_bounded, sha256_json
from aleph.errors import StoreError
from aleph.targets.format import DTYPES, MANIFEST_FILE, check_manifest, raw_view, tensor_view

IMPLEMENTATIONS = ("streaming", "in_ram")
MANIFEST_MAX_BYTES = 64 << 20  # the manifest lists the chunks: a few MB for E1's
MADV_POPULATE_READ = 22  # Linux >= 5.14; Python 3.11's mmap module has no constant for it


def prefault_mapping(mm: np.memmap) -> str:
    """Map every page of a read-only memmap now; returns how: "populate_read" (one
    MADV_POPULATE_READ call, reading in what is not cached) or "touch" (where the kernel
    lacks it: one byte read per page)."""
    raw = getattr(mm, "_mmap", None)
    if raw is not None and hasattr(raw, "madvise"):
        try:
            raw.madvise(MADV_POPULATE_READ)
            return "populate_read"
        except (OSError, ValueError):
            pass
    flat = mm.reshape(-1).view(np.uint8)  # (byte_length,)
    if flat.size:
        int(flat[::mmap.PAGESIZE].max())  # one read per page faults each in
    return "touch"


def load_manifest(store_dir: str | os.PathLike) -> dict:
    """Read and check `manifest.json` and the data file's size against it (quick verify)."""
    store_dir = Path(store_dir)
    path = store_dir / MANIFEST_FILE
    if store_dir.exists() and not store_dir.is_dir():
        raise StoreError(f"{store_dir}: not a directory; expected a target store directory")
    try:
        obj = read_json_bounded(path, MANIFEST_MAX_BYTES)  # regular, no link, bounded, depth-safe
    except FileNotFoundError:
        raise StoreError(f"{path}: no manifest: not a complete target store (a build that did "
                         "not finish leaves none; run the build again to resume it)") from None
    except OSError as e:
        raise StoreError(f"{path}: cannot read the manifest ({e.strerror})") from None
    except ValueError as e:  # not UTF-8, not JSON, or nested too deeply
        raise StoreError(f"{path}: not valid JSON ({e})") from None
    manifest = check_manifest(obj, str(path))
    data = store_dir / manifest["data_file"]
    try:
        size = data.stat().st_size
    except FileNotFoundError:
        raise StoreError(f"{data}: data file missing (manifest names it)") from None
    except OSError as e:
        raise StoreError(f"{data}: cannot stat the data file ({e.strerror})") from None
    if size != manifest["byte_length"]:
        raise StoreError(f"{data}: size {size:,} B does not match the manifest's byte_length "
                         f"{manifest['byte_length']:,} B ({manifest['rows']:,} x "
                         f"{manifest['dim']} {manifest['dtype']})")
    return manifest


def _as_indices(indices, rows: int) -> np.ndarray:
    """Row indices as a 1-D int64 numpy array, bounds-checked."""
    if isinstance(indices, torch.Tensor):
        indices = indices.detach().cpu().numpy()
    idx = np.asarray(indices)
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise IndexError(f"gather expects a 1-D integer index array, got {idx.dtype} shape {idx.shape}")
    idx = idx.astype(np.int64, copy=False)
    if idx.size and (idx.min() < 0 or idx.max() >= rows):
        raise IndexError(f"gather index out of range [0, {rows}): min {idx.min()}, max {idx.max()}")
    return idx


def content_sha256(manifest: dict) -> str:
    """Path-independent hash of a store's bytes: dtype, dim and each chunk's rows and sha256.

    Each chunk's sha256 is of exactly the bytes written for its row range, so two stores
    with equal content hashes hold equal bytes wherever their sources lived and whichever
    implementation built or holds them (`manifest_sha256` also covers paths and mtimes).
    """
    return sha256_json({"dtype": manifest["dtype"], "dim": manifest["dim"],
                        "chunks": [[c["sha256"], c["rows"]] for c in manifest["chunks"]]})


class TargetStore:
    """A complete, verified target store (rows x dim of one dtype)."""

    def __init__(self, store_dir: Path, manifest: dict, implementation: str,
                 tensor: torch.Tensor | None = None, *, prefault: bool = False):
        if implementation not in IMPLEMENTATIONS:
            raise StoreError(f"implementation {implementation!r}: expected one of {IMPLEMENTATIONS}")
        self.store_dir = Path(store_dir)
        self.manifest = manifest
        self.manifest_sha256 = sha256_json(manifest)
        self.content_sha256 = content_sha256(manifest)
        self.implementation = implementation
        self.rows, self.dim = manifest["rows"], manifest["dim"]
        self.dtype, _, self._raw, _ = DTYPES[manifest["dtype"]]
        self.byte_length = manifest["byte_length"]
        self.path = self.store_dir / manifest["data_file"]
        self.prefaulted: str | None = None  # how the mapping was prefaulted, if it was
        self._tensor = self._mm = None
        if implementation == "in_ram":
            self._tensor = tensor if tensor is not None else self._read_all()
            # a numpy view of the rows for np.take (never a copy: a strided tensor keeps
            # torch.index_select)
            self._rows_raw = raw_view(self._tensor) if self._tensor.is_contiguous() else None
        else:
            try:
                self._mm = np.memmap(self.path, dtype=self._raw, mode="r",
                                     shape=(self.rows, self.dim))  # (N, D)
            except OSError as e:
                raise StoreError(f"{self.path}: cannot map the data file ({e.strerror})") from None
            self._rows_raw = self._mm
            if prefault:
                self.prefaulted = prefault_mapping(self._mm)

    def _read_all(self) -> torch.Tensor:
        out = torch.empty((self.rows, self.dim), dtype=self.dtype)  # (N, D)
        buf = memoryview(raw_view(out)).cast("B")
        try:
            with open(self.path, "rb") as f:
                if f.readinto(buf) != self.byte_length:
                    raise StoreError(f"{self.path}: shorter than {self.byte_length:,} bytes")
        except OSError as e:
            raise StoreError(f"{self.path}: cannot read the data file ({e.strerror})") from None
        return out

    def __len__(self) -> int:
        return self.rows

    def gather(self, indices, pin: bool = False) -> torch.Tensor:
        """Rows `indices` (numpy int array or LongTensor, any order) -> (B, D) tensor, in
        page-locked memory for pin=True when CUDA is available."""
        idx = _as_indices(indices, self.rows)  # (B,)
        pin = pin and torch.cuda.is_available()
        out = torch.empty((idx.size, self.dim), dtype=self.dtype, pin_memory=pin)  # (B, D)
        dst = raw_view(out)  # (B, D), shares out's memory
        # numpy gathers straight from the mapping (or the in-RAM rows) into `out`: one
        # copy per row. mode="clip" skips numpy's per-index check (bounds were checked
        # above), which measured 1.5x faster than the default mode="raise"; for in_ram
        # it measured 2-5x faster than torch.index_select on fp16 rows.
        if self._rows_raw is None:
            torch.index_select(self._tensor, 0, torch.from_numpy(idx), out=out)
        else:
            np.take(self._rows_raw, idx, axis=0, mode="clip", out=dst)
        return out

    def scan(self, batch_rows: int = 65536) -> Iterator[tuple[int, torch.Tensor]]:
        """Sequential pass: yields (first_row, rows (b, D)) copies in order."""
        for r0 in range(0, self.rows, batch_rows):
            r1 = min(r0 + batch_rows, self.rows)
            if self._tensor is not None:
                yield r0, self._tensor[r0:r1].clone()
            else:
                yield r0, tensor_view(np.array(self._mm[r0:r1]), self.manifest["dtype"])  # copy

    def close(self) -> None:
        self._mm = self._rows_raw = self._tensor = None

    def __repr__(self) -> str:
        return (f"TargetStore({self.store_dir}, {self.rows:,} x {self.dim} {self.manifest['dtype']}, "
                f"{self.implementation})")


def open_store(store_dir: str | os.PathLike, implementation: str = "streaming", *,
               prefault: bool = False) -> TargetStore:
    """Open a complete store; StoreError when manifest, size or dtype do not match.
    prefault (streaming only): map every page now (module docstring); `store.prefaulted`
    then says how ("populate_read" or "touch")."""
    return TargetStore(Path(store_dir), load_manifest(store_dir), implementation,
                       prefault=prefault)
