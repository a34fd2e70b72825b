"""On-disk format of a target store: file names, dtypes, and the manifest schema.

A store directory holds one flat data file (`targets.bin`: rows x dim x itemsize
bytes, row-major, little-endian, no header, zero slack) and `manifest.json`, written
last: a store is complete exactly when a manifest that matches the data file exists.
While a build runs the data lives in `targets.bin.partial` with its progress in
`build.json`; neither is ever opened as a store.
"""

from __future__ import annotations

import numpy as np
import torch

from aleph.errors import StoreError

FORMAT_NAME = "aleph-target-store"
FORMAT_VERSION = 1
DATA_FILE = "targets.bin"
PARTIAL_FILE = "targets.bin.partial"
MANIFEST_FILE = "manifest.json"
PROGRESS_FILE = "build.json"
LOCK_FILE = "build.lock"

# name -> (torch dtype, itemsize, unsigned raw numpy dtype, mask of the exponent bits).
# Stores are handled as raw unsigned integers: numpy has no bfloat16, and a value is
# NaN/Inf exactly when all its exponent bits are set, which an integer mask tests at
# memory speed (torch.isfinite on CPU fp16 runs at a few MB/s).
DTYPES: dict[str, tuple[torch.dtype, int, np.dtype, int]] = {
    "float16": (torch.float16, 2, np.dtype("<u2"), 0x7C00),
    "bfloat16": (torch.bfloat16, 2, np.dtype("<u2"), 0x7F80),
    "float32": (torch.float32, 4, np.dtype("<u4"), 0x7F800000),
}
# the signed twin of each raw dtype, used to reinterpret torch tensors bit for bit
TORCH_RAW = {2: torch.int16, 4: torch.int32}


def raw_view(t: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor's bits as a raw unsigned numpy array, sharing its memory."""
    return t.view(TORCH_RAW[t.element_size()]).numpy().view(f"<u{t.element_size()}")


def tensor_view(raw: np.ndarray, dtype: str) -> torch.Tensor:
    """Raw unsigned rows (a writable array) as a torch tensor of `dtype`, sharing memory."""
    return torch.from_numpy(raw.view(f"<i{raw.itemsize}")).view(DTYPES[dtype][0])


def torch_dtype_name(dtype: torch.dtype) -> str | None:
    return next((name for name, entry in DTYPES.items() if entry[0] == dtype), None)


_REQUIRED = {"format": str, "format_version": int, "data_file": str, "rows": int, "dim": int,
             "dtype": str, "byte_length": int, "source_fingerprint": str, "chunks": list,
             "built_by": str}
_CHUNK_REQUIRED = {"index": int, "path": str, "rows": int, "row_start": int, "row_stop": int,
                   "sha256": str}


def check_manifest(m: object, where: str) -> dict:
    """The manifest `m`, its format, field types, byte_length (rows x dim x itemsize) and
    chunk row ranges (contiguous from 0, covering every row) checked; StoreError else."""
    if not isinstance(m, dict):
        raise StoreError(f"{where}: expected a JSON object, found {type(m).__name__}")
    for key, typ in _REQUIRED.items():
        if not isinstance(m.get(key), typ):
            raise StoreError(f"{where}: field {key!r} missing or not {typ.__name__}")
    if m["data_file"] != DATA_FILE:
        raise StoreError(f"{where}: field 'data_file' is {m['data_file']!r}, expected {DATA_FILE!r}")
    if m["format"] != FORMAT_NAME or m["format_version"] != FORMAT_VERSION:
        raise StoreError(f"{where}: format {m['format']!r} v{m['format_version']}, this code "
                         f"reads {FORMAT_NAME!r} v{FORMAT_VERSION}; rebuild the store")
    if m["dtype"] not in DTYPES:
        raise StoreError(f"{where} field 'dtype': dtype {m['dtype']!r} is not supported "
                         f"(expected one of {sorted(DTYPES)})")
    itemsize = DTYPES[m["dtype"]][1]
    want = m["rows"] * m["dim"] * itemsize
    if m["byte_length"] != want or m["rows"] <= 0 or m["dim"] <= 0:
        raise StoreError(f"{where}: byte_length {m['byte_length']:,} does not equal rows "
                         f"{m['rows']:,} x dim {m['dim']} x {itemsize} B ({m['dtype']}) = {want:,}")
    row = 0
    for i, c in enumerate(m["chunks"]):
        for key, typ in _CHUNK_REQUIRED.items():
            if not isinstance(c, dict) or not isinstance(c.get(key), typ):
                raise StoreError(f"{where}: chunks[{i}] field {key!r} missing or not {typ.__name__}")
        if c["row_start"] != row or c["row_stop"] - c["row_start"] != c["rows"]:
            raise StoreError(f"{where}: chunks[{i}] covers rows {c['row_start']}..{c['row_stop']} "
                             f"({c['rows']} rows), expected to start at row {row}")
        row = c["row_stop"]
    if row != m["rows"]:
        raise StoreError(f"{where}: chunks cover {row:,} rows, manifest says {m['rows']:,}")
    return m
