"""Row blocks in and out of chunk files, for the passes that make targets (extract, consensus).

- `regular_chunks(directory)`: the chunk files of a directory in row order, each checked
  with os.stat to be a regular file before anything opens it (a FIFO is never opened).
- `float_blocks` / `take_rows`: a chunk's rows as float32 torch blocks, read through the
  zero-copy mapping of `sources.open_chunk` (.pt only with weights_only=True).
- `ChunkWriter`: one fp16 output chunk (.npy, .safetensors or .pt by its suffix), filled
  block by block into a mapped `.NAME.partial` file, fsynced and renamed into place on
  `commit()`: a reader sees no chunk or a complete one.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import struct
from collections.abc import Iterator

import numpy as np
import torch

from aleph._io import fsync_dir, open_write_nofollow
from aleph.errors import StoreError
from aleph.targets.format import tensor_view
from aleph.targets.sources import SUFFIXES, ChunkInfo, chunk_files_in, open_chunk

BLOCK_ROWS = 16384  # rows per block: 16384 x 768 x 4 B = 48 MiB of float32 per teacher
_ST_KEY = "targets"  # the tensor name of a .safetensors output chunk


def require_regular(path: str) -> None:
    """StoreError unless `path` is a regular file (checked with stat, nothing opened)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise StoreError(f"{path}: cannot stat chunk file ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{path}: not a regular file (a FIFO, device or directory); "
                         "chunk files must be regular files")


def regular_chunks(directory: str | os.PathLike) -> list[str]:
    """`chunk_files_in(directory)` with every entry checked to be a regular file."""
    paths = chunk_files_in(directory)
    for p in paths:
        require_regular(p)
    return paths


def _as_float32(raw: np.ndarray, dtype: str) -> torch.Tensor:
    """Raw unsigned rows (n, dim) of `dtype` -> float32 tensor (n, dim), a copy."""
    # np.array: a writable contiguous copy out of the (read-only) mapping
    return tensor_view(np.array(raw), dtype).float()


def float_blocks(info: ChunkInfo, rows: int = BLOCK_ROWS) -> Iterator[tuple[int, torch.Tensor]]:
    """(row offset, float32 block (n, dim)) over the chunk's rows, in order."""
    with open_chunk(info) as raw:
        for start in range(0, info.rows, rows):
            yield start, _as_float32(raw[start:start + rows], info.dtype)


def take_rows(info: ChunkInfo, index: np.ndarray) -> torch.Tensor:
    """float32 (len(index), dim): the chunk's rows at the sorted positions `index`."""
    with open_chunk(info) as raw:
        return _as_float32(raw[index], info.dtype)


def _safetensors_header(rows: int, dim: int) -> bytes:
    meta = {_ST_KEY: {"dtype": "F16", "shape": [rows, dim], "data_offsets": [0, rows * dim * 2]}}
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads its header to 8 bytes
    return struct.pack("<Q", len(text)) + text


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode)


class ChunkWriter:
    """One fp16 output chunk of rows x dim, written block by block, published atomically."""

    def __init__(self, path: str, rows: int, dim: int) -> None:
        self.path, self.rows, self.dim = path, rows, dim
        self.suffix = os.path.splitext(path)[1]
        if self.suffix not in SUFFIXES:
            raise StoreError(f"{path}: unknown chunk type {self.suffix!r} (expected one of {SUFFIXES})")
        head, name = os.path.split(path)
        self.partial = os.path.join(head, f".{name}.partial")
        # Opened once, never through a link, and mapped from that descriptor (numpy's own
        # open_memmap would open the path again, following a link planted there).
        # .pt: the rows go to this raw file first, then torch.save streams them out of it
        self._file = f = os.fdopen(open_write_nofollow(self.partial, truncate=True), "w+b")
        if self.suffix == ".npy":
            np.lib.format.write_array_header_1_0(
                f, {"descr": "<f2", "fortran_order": False, "shape": (rows, dim)})
        elif self.suffix == ".safetensors":
            f.write(_safetensors_header(rows, dim))
        head = f.tell()
        f.truncate(head + rows * dim * 2)
        self._ours = _identity(os.fstat(f.fileno()))
        # nofollow-ok: maps the open descriptor f (checked above), not a path
        self._mm = np.memmap(f, dtype="<f2", mode="r+", offset=head, shape=(rows, dim))

    def write(self, rows, block: torch.Tensor) -> None:
        """Rows `rows` (a slice, list or array of n positions) from a (n, dim) tensor, as fp16."""
        self._mm[rows] = block.to(torch.float16).cpu().numpy()

    def discard(self) -> None:
        """Drop the unfinished chunk: its partial file (this writer's own) is removed; a
        chunk `commit` already renamed into place stays (it is complete)."""
        self.__dict__.pop("_mm", None)  # commit may have unmapped it already
        self._file.close()
        with contextlib.suppress(FileNotFoundError):  # ours only, not a file put in its place
            if _identity(os.lstat(self.partial)) == self._ours:
                os.unlink(self.partial)

    def commit(self) -> None:
        """fsync the rows and rename the chunk into place (then fsync the directory)."""
        self._mm.flush()
        os.fsync(self._file.fileno())
        src, ours = self.partial, self._ours
        if self.suffix == ".pt":
            src = self.partial + ".save"  # no chunk suffix: never listed as a chunk
            with os.fdopen(open_write_nofollow(src, truncate=True), "wb") as f:
                torch.save(torch.from_numpy(self._mm), f)  # reads the mapped pages, no copy
                f.flush()
                os.fsync(f.fileno())
                ours = _identity(os.fstat(f.fileno()))
        del self._mm
        self._file.close()
        if _identity(os.lstat(src)) != ours:  # swapped for another file or a link
            raise StoreError(f"{src}: replaced by something else while this command wrote it; "
                             f"not published as {self.path}")
        os.replace(src, self.path)
        if src != self.partial:
            self.discard()
        fsync_dir(os.path.dirname(self.path) or ".")
