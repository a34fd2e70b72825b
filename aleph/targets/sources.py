"""Chunk files: header inspection, stat-only fingerprints, and zero-copy chunk readers.

A source is an ordered list of chunk files, each one 2-D tensor of N_i x D in float16,
bfloat16 or float32, stored as `.pt` (torch.save), `.npy` or `.safetensors`.

- `inspect_chunk` reads only headers (a .pt is loaded with `mmap=True`: mapped, not read).
- `.pt` files are only ever loaded with `torch.load(weights_only=True)`: a file holding
  anything but tensors and plain containers is rejected without being unpickled.
- `source_stats` / `source_fingerprint` use `os.stat` only (path, size, mtime_ns), so a
  cache hit opens no chunk file. Deliberate trade-off: a rewrite that keeps size and
  mtime_ns is not noticed (`aleph targets verify --sources` catches it).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import stat
import struct
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from aleph._io import file_kind, number_order_clash, parse_json_bytes, sha256_json, short_repr
from aleph.errors import StoreError
from aleph.targets.format import DTYPES, raw_view, torch_dtype_name

SUFFIXES = (".pt", ".npy", ".safetensors")
_NPY_DTYPES = {"<f2": "float16", "<f4": "float32"}
_ST_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
MAX_SAFETENSORS_HEADER = 1 << 20  # bytes of a chunk's JSON header (parsed: ~30x in memory)


@dataclass(frozen=True)
class ChunkInfo:
    """What the header of one chunk file says. Tests may fabricate these for `plan`."""

    path: str
    rows: int
    dim: int
    dtype: str  # a key of format.DTYPES
    file_size: int = 0
    mtime_ns: int = 0
    data_offset: int | None = None  # byte offset of the rows (.npy/.safetensors)
    key: str | None = None  # dict key (.pt) or tensor name (.safetensors)

    @property
    def nbytes(self) -> int:
        return self.rows * self.dim * DTYPES[self.dtype][1]


def _stat(path: str) -> os.stat_result:
    """stat of a chunk file, refusing what is not a regular file (a FIFO would block the
    build's first read forever, a device would be read without end) and a symbolic link."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise StoreError(f"{path}: chunk file not found") from None
    except OSError as e:
        raise StoreError(f"{path}: cannot stat chunk file ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{path}: chunk file is {file_kind(st.st_mode)}; expected a regular file")
    if os.path.islink(path):  # docs/trust.md: links are never followed
        raise StoreError(f"{path}: a symbolic link; links are not followed: copy the file or "
                         "name its target")
    return st


def chunk_files_in(directory: str | os.PathLike) -> list[str]:
    """The chunk files of a directory, in name order (the trainer's order: row order);
    names whose order by name and by number differ are refused, not guessed at."""
    directory = os.fspath(directory)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(SUFFIXES))
    except OSError as e:
        raise StoreError(f"{directory}: cannot list the chunk directory ({e.strerror})") from None
    if not names:
        raise StoreError(f"{directory}: directory holds no chunk files ({', '.join(SUFFIXES)})")
    if clash := number_order_clash(names):
        raise StoreError(
            f"{directory}: chunk file names sort differently by name ({clash[0]} first) and by "
            f"number ({clash[1]} first), so their row order is ambiguous; zero-pad the "
            "numbers (chunk_002, not chunk_2: name order is row order, as the trainer reads "
            "them) or pass the files one by one in row order")
    return [os.path.join(directory, n) for n in names]


def source_stats(paths: Sequence[str | os.PathLike]) -> list[dict]:
    """[{path, size, mtime_ns}] for each chunk, from os.stat only (no file is opened)."""
    if not paths:
        raise StoreError("no chunk files given (empty source list)")
    out = []
    for p in map(os.fspath, paths):
        _stat(p)  # as given: a refusal names the file the user passed, not its target
        st = _stat(path := os.path.realpath(p))
        out.append({"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return out


def source_fingerprint(stats: list[dict]) -> str:
    """Hash of the ordered (path, size, mtime_ns) list: the cache key of a store."""
    return sha256_json({"kind": "targets-sources-v1", "sources": stats})


def _truncated(path: str, what: str, need: int, have: int) -> StoreError:
    return StoreError(f"{path}: truncated or padded {what}: expected {need:,} bytes, file has {have:,}")


def _inspect_npy(path: str, size: int) -> tuple[int, int, str, int, None]:
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                    else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read(f)
        except (ValueError, OSError, SyntaxError) as e:
            why = str(e) if len(str(e)) <= 200 else f"{str(e)[:160]}... ({len(str(e)):,} characters)"
            raise StoreError(f"{path}: not a readable .npy file ({why})") from None
        offset = f.tell()
    name = _NPY_DTYPES.get(dtype.str)
    if name is None or fortran or len(shape) != 2:
        raise StoreError(f"{path}: expected a 2-D C-order float16/float32 array, found shape "
                         f"{short_repr(shape)} dtype {dtype.str} fortran_order={fortran}")
    need = offset + shape[0] * shape[1] * dtype.itemsize
    if size != need:
        raise _truncated(path, ".npy", need, size)
    return shape[0], shape[1], name, offset, None


def _inspect_safetensors(path: str, size: int) -> tuple[int, int, str, int, str]:
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if n <= 0 or 8 + n > size:
            raise StoreError(f"{path}: not a safetensors file (bad header length {n})")
        if n > MAX_SAFETENSORS_HEADER:  # one tensor's header is under 1 KiB
            raise StoreError(f"{path}: not a safetensors file (header of {n:,} bytes; expected "
                             f"at most {MAX_SAFETENSORS_HEADER:,})")
        try:
            header = parse_json_bytes(f.read(n))  # depth-safe
        except ValueError as e:  # not UTF-8, not JSON, too deep, an int past Python's digit limit
            raise StoreError(f"{path}: safetensors header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise StoreError(f"{path}: safetensors header is {type(header).__name__}, expected a JSON object")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    if len(tensors) != 1:
        raise StoreError(f"{path}: expected exactly one tensor, found {sorted(tensors)}")
    (key, meta), = tensors.items()
    if not isinstance(meta, dict):
        raise StoreError(f"{path}: tensor {key!r}: header entry is {short_repr(meta)}, expected an object")
    shape, name = meta.get("shape"), _ST_DTYPES.get(meta.get("dtype"))
    if (name is None or not isinstance(shape, list) or len(shape) != 2
            or not all(type(n) is int and n >= 0 for n in shape)):
        raise StoreError(f"{path}: tensor {key!r} must be 2-D F16/BF16/F32, found {meta}")
    offsets = meta.get("data_offsets")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(type(n) is int and n >= 0 for n in offsets)):
        raise StoreError(f"{path}: tensor {key!r}: data_offsets {offsets!r}, expected [begin, end] byte offsets")
    begin, end = offsets
    nbytes = shape[0] * shape[1] * DTYPES[name][1]
    if end - begin != nbytes:
        raise StoreError(f"{path}: tensor {key!r} spans {end - begin:,} bytes, its shape needs {nbytes:,}")
    if 8 + n + end != size:
        raise _truncated(path, ".safetensors", 8 + n + end, size)
    return shape[0], shape[1], name, 8 + n + begin, key


def _unpickler_reason(e: Exception) -> str:
    """The one sentence of torch's multi-line weights_only refusal that names the object."""
    text = str(e)
    marker = "WeightsUnpickler error:"
    if marker in text:
        reason = text.split(marker, 1)[1].strip().splitlines()[0]
        return reason.split(". ", 1)[0].rstrip(".")
    return " ".join(text.split())[:200] or type(e).__name__


def _load_pt(path: str) -> tuple[torch.Tensor, str | None]:
    """Load a .pt with weights_only=True (mapped when possible) and pick its one tensor. A zip
    entry that is compressed is refused first: torch.save stores them, and a deflated 2.6 MB
    file inflates to gigabytes when read."""
    with contextlib.suppress(zipfile.BadZipFile, OSError), zipfile.ZipFile(path) as z:
        if packed := [i.filename for i in z.infolist() if i.compress_type != zipfile.ZIP_STORED]:
            raise StoreError(f"{path}: zip entry {packed[0]!r} is compressed; torch.save stores "
                             "its entries, and a compressed one may inflate without bound: save "
                             "the tensor again with torch.save")
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols of refused files
            warnings.simplefilter("ignore")
            try:
                obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):  # legacy (non-zip) format cannot be mapped
                    raise
                obj = torch.load(path, map_location="cpu", weights_only=True)
    except PermissionError:
        raise StoreError(f"{path}: chunk file is not readable (permission denied)") from None
    except pickle.UnpicklingError as e:
        raise StoreError(
            f"{path}: refused: the .pt holds objects other than tensors ({_unpickler_reason(e)}); "
            ".pt chunks are only loaded with weights_only=True, so nothing was unpickled: save "
            "the tensor alone (torch.save(tensor, path)) or as .npy/.safetensors"
        ) from None
    except Exception as e:  # zip/pickle corruption surfaces as many types
        first = str(e).splitlines()[0] if str(e) else ""
        raise StoreError(f"{path}: unreadable .pt (truncated or not a torch.save file): "
                         f"{type(e).__name__}: {first}") from None
    if isinstance(obj, torch.Tensor):
        return obj, None
    if isinstance(obj, dict) and len(obj) == 1:
        (key, value), = obj.items()
        if isinstance(value, torch.Tensor):
            return value, str(key)
    desc = f"dict with keys {sorted(map(str, obj))}" if isinstance(obj, dict) else type(obj).__name__
    raise StoreError(f"{path}: expected a tensor or a dict holding one tensor, found {desc}")


def _inspect_pt(path: str, size: int) -> tuple[int, int, str, None, str | None]:
    t, key = _load_pt(path)
    name = torch_dtype_name(t.dtype)
    if t.layout != torch.strided:
        raise StoreError(f"{path}: expected a dense tensor, found layout {t.layout} "
                         "(convert with .to_dense() before saving)")
    if name is None or t.dim() != 2:
        raise StoreError(f"{path}: expected a 2-D float16/bfloat16/float32 tensor, found {tuple(t.shape)} {t.dtype}")
    need, have = t.numel() * t.element_size(), t.untyped_storage().nbytes()
    if not need <= have <= size:  # zero strides (.expand) claim rows no byte holds: reading allocates them
        raise StoreError(f"{path}: the tensor's {t.shape[0]} x {t.shape[1]} {name} elements need {need:,} "
                         f"bytes, its storage holds {have:,} (the file has {size:,}); save a "
                         "contiguous tensor (.contiguous(), not an .expand() view)")
    return t.shape[0], t.shape[1], name, None, key


def inspect_chunk(path: str | os.PathLike) -> ChunkInfo:
    """Read one chunk's header (never its rows) and check it is well formed."""
    _stat(os.fspath(path))  # as given: a link is refused, not resolved
    path = os.path.realpath(os.fspath(path))
    st = _stat(path)
    suffix = os.path.splitext(path)[1]
    readers = {".npy": _inspect_npy, ".safetensors": _inspect_safetensors, ".pt": _inspect_pt}
    if suffix not in readers:
        raise StoreError(f"{path}: unknown chunk type {suffix!r} (expected one of {SUFFIXES})")
    try:
        rows, dim, dtype, offset, key = readers[suffix](path, st.st_size)
    except PermissionError:
        raise StoreError(f"{path}: chunk file is not readable (permission denied)") from None
    if rows <= 0 or dim <= 0:
        raise StoreError(f"{path}: chunk has no rows or no columns (shape {rows} x {dim})")
    return ChunkInfo(path, rows, dim, dtype, st.st_size, st.st_mtime_ns, offset, key)


def check_layout(infos: Sequence[ChunkInfo]) -> None:
    """All chunks must share one width and one dtype (mixed dtypes are an error, not a
    silent conversion: the seed's targets are one fp16 tensor cut into chunks)."""
    if not infos:
        raise StoreError("no chunk files given (empty source list)")
    first = infos[0]
    for info in infos[1:]:
        if info.dim != first.dim:
            raise StoreError(f"{info.path}: wrong width {info.dim}, expected {first.dim} (the "
                             f"width of {first.path})")
        if info.dtype != first.dtype:
            raise StoreError(f"{info.path}: dtype {info.dtype} differs from {first.dtype} of "
                             f"{first.path}; mixed dtypes are refused (convert the chunks to one "
                             "dtype first)")


def describe_sources(paths: Sequence[str | os.PathLike]) -> list[ChunkInfo]:
    """Inspect every chunk's header and check that they form one table."""
    infos = [inspect_chunk(p) for p in paths]
    check_layout(infos)
    return infos


@contextlib.contextmanager
def open_chunk(info: ChunkInfo) -> Iterator[np.ndarray]:
    """Yield the chunk's rows as a raw unsigned array (rows, dim), mapped: pages are read
    when touched. The file must still match its header (size/shape/dtype), else StoreError."""
    st = _stat(info.path)
    if (st.st_size, st.st_mtime_ns) != (info.file_size, info.mtime_ns):
        raise StoreError(f"{info.path}: chunk changed while the store was being built")
    if info.data_offset is not None:
        try:
            arr = np.memmap(info.path, dtype=DTYPES[info.dtype][2], mode="r", offset=info.data_offset,
                            shape=(info.rows, info.dim))
        except PermissionError:
            raise StoreError(f"{info.path}: chunk file is not readable (permission denied)") from None
        yield arr  # unmapped when the last reference goes, i.e. when the caller is done
        return
    t, _ = _load_pt(info.path)
    if (t.shape[0], t.shape[1], torch_dtype_name(t.dtype)) != (info.rows, info.dim, info.dtype):
        raise StoreError(f"{info.path}: tensor changed since its header was read")
    yield raw_view(t.contiguous())  # (rows, dim) same bits; a copy only if not contiguous
