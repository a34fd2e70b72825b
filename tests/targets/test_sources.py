"""Chunk inspection and the bad-input cases: each a StoreError naming file and fault."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from targets_helpers import save_chunk

from aleph.errors import StoreError
from aleph.targets import build_store, describe_sources, inspect_chunk


@pytest.mark.parametrize("suffix", [".pt", ".npy", ".safetensors"])
def test_inspect_reads_shape_and_dtype(tmp_path, suffix):
    path = save_chunk(torch.zeros(7, 5, dtype=torch.float32), tmp_path / f"c{suffix}")
    info = inspect_chunk(path)
    assert (info.rows, info.dim, info.dtype) == (7, 5, "float32")
    assert info.nbytes == 7 * 5 * 4 and info.file_size == path.stat().st_size


def test_bfloat16_pt_and_safetensors(tmp_path):
    for suffix in (".pt", ".safetensors"):
        info = inspect_chunk(save_chunk(torch.ones(3, 4, dtype=torch.bfloat16), tmp_path / f"b{suffix}"))
        assert info.dtype == "bfloat16"


def test_pt_dict_with_one_tensor_is_accepted(tmp_path):
    torch.save({"targets": torch.zeros(3, 4, dtype=torch.float16)}, tmp_path / "d.pt")
    assert inspect_chunk(tmp_path / "d.pt").key == "targets"


def test_wrong_width_names_the_file(make_chunks, tmp_path):
    paths, _ = make_chunks(rows=(4, 4))
    odd = save_chunk(torch.zeros(4, 9, dtype=torch.float16), tmp_path / "odd.npy")
    with pytest.raises(StoreError, match=r"odd\.npy: wrong width 9, expected 8"):
        describe_sources([*paths, odd])


def test_mixed_dtypes_are_refused(make_chunks, tmp_path):
    paths, _ = make_chunks(rows=(4,))
    other = save_chunk(torch.zeros(4, 8, dtype=torch.float32), tmp_path / "f32.npy")
    with pytest.raises(StoreError, match=r"f32\.npy: dtype float32 differs from float16.*mixed"):
        describe_sources([*paths, other])


def test_empty_list_and_missing_file(tmp_path):
    with pytest.raises(StoreError, match="empty source list"):
        build_store([], tmp_path / "s")
    with pytest.raises(StoreError, match=r"nope\.pt: chunk file not found"):
        build_store([tmp_path / "nope.pt"], tmp_path / "s")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("suffix", [".pt", ".npy", ".safetensors"])
def test_truncated_file(tmp_path, suffix):
    path = save_chunk(torch.ones(64, 8, dtype=torch.float16), tmp_path / f"t{suffix}")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(StoreError, match=rf"t\{suffix}: (truncated|unreadable)"):
        inspect_chunk(path)


def test_garbage_pt_is_unreadable(tmp_path):
    (tmp_path / "g.pt").write_bytes(b"this is not a torch file" * 10)
    with pytest.raises(StoreError, match=r"g\.pt: unreadable \.pt"):
        inspect_chunk(tmp_path / "g.pt")


class _Payload:
    """Unpickling this would create the marker file: proof that nothing was unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("legacy", [False, True])
def test_pt_with_code_object_is_refused_without_unpickling(tmp_path, legacy):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"x": torch.zeros(2, 2), "y": _Payload(str(marker))}, path,
               _use_new_zipfile_serialization=not legacy)
    with pytest.raises(StoreError, match=r"evil\.pt: refused: .*weights_only") as e:
        inspect_chunk(path)
    assert not marker.exists()
    # one complete line naming the refused object, not torch's message cut mid-sentence
    msg = str(e.value)
    assert "\n" not in msg and "two options" not in msg
    assert "GLOBAL io.open was not an allowed global" in msg
    assert msg.endswith("save the tensor alone (torch.save(tensor, path)) or as .npy/.safetensors")
    # the same payload, loaded by plain pickle, does run: the test would notice
    pickle.loads(pickle.dumps(_Payload(str(marker)))).close()
    assert marker.exists()


def test_pt_holding_non_tensor_data_is_refused(tmp_path):
    torch.save({"a": torch.zeros(2, 2), "b": torch.zeros(2, 2)}, tmp_path / "two.pt")
    with pytest.raises(StoreError, match=r"two\.pt: expected a tensor or a dict holding one tensor"):
        inspect_chunk(tmp_path / "two.pt")
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(StoreError, match=r"list\.pt: .*found list"):
        inspect_chunk(tmp_path / "list.pt")


def test_wrong_rank_dtype_and_suffix(tmp_path):
    np.save(tmp_path / "v.npy", np.zeros(5, dtype=np.float16))
    with pytest.raises(StoreError, match=r"v\.npy: expected a 2-D"):
        inspect_chunk(tmp_path / "v.npy")
    np.save(tmp_path / "i.npy", np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(StoreError, match=r"i\.npy: .*dtype <i4"):
        inspect_chunk(tmp_path / "i.npy")
    (tmp_path / "c.csv").write_text("1,2\n")
    with pytest.raises(StoreError, match=r"c\.csv: unknown chunk type"):
        inspect_chunk(tmp_path / "c.csv")
    torch.save(torch.zeros(0, 8, dtype=torch.float16), tmp_path / "e.pt")
    with pytest.raises(StoreError, match=r"e\.pt: chunk has no rows"):
        inspect_chunk(tmp_path / "e.pt")
    torch.save(torch.ones(3, 8, dtype=torch.float16).to_sparse(), tmp_path / "sp.pt")
    with pytest.raises(StoreError, match=r"sp\.pt: expected a dense tensor"):
        inspect_chunk(tmp_path / "sp.pt")  # was a RuntimeError from .contiguous() mid-build


@pytest.mark.parametrize("header,data,what", [
    ([1, 2], 16, "header is list"),
    ({"t": 5}, 16, "entry is 5"),
    ({"t": {"dtype": "F16", "shape": [2, 4]}}, 16, "data_offsets None"),
    ({"t": {"dtype": "F16", "shape": ["2", 4], "data_offsets": [0, 16]}}, 16, "must be 2-D"),
    ({"t": {"dtype": "F16", "shape": [2, 4], "data_offsets": "x"}}, 16, "data_offsets 'x'"),
    ({"t": {"dtype": "F16", "shape": [2, 0], "data_offsets": [0, 0]}}, 0, "no columns"),
])
def test_malformed_safetensors_header_is_a_store_error(tmp_path, header, data, what):
    import json
    import struct

    h = json.dumps(header).encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * data)
    with pytest.raises(StoreError, match=rf"m\.safetensors: .*{what}"):
        inspect_chunk(path)


def test_chunk_names_whose_number_order_differs_are_refused(tmp_path):
    from aleph.targets.sources import chunk_files_in

    for n in ("chunk_2.npy", "chunk_10.npy"):
        (tmp_path / n).write_bytes(b"")
    with pytest.raises(StoreError, match=r"sort differently by name \(chunk_10\.npy first\) "
                                         r"and by number \(chunk_2\.npy first\)"):
        chunk_files_in(tmp_path)


def test_pt_whose_elements_exceed_its_storage_is_refused(tmp_path):
    # zero strides: a 2-byte storage claims 1000 x 1000 rows (reading it would allocate them all)
    torch.save(torch.zeros(1, 1, dtype=torch.float16).expand(1000, 1000), tmp_path / "z.pt")
    with pytest.raises(StoreError, match=r"z\.pt: the tensor's 1000 x 1000 float16 elements need "
                                         r"2,000,000 bytes, its storage holds 2"):
        inspect_chunk(tmp_path / "z.pt")
    # a non-contiguous but honest tensor (a transpose) stays accepted
    torch.save(torch.randn(6, 4).to(torch.float16).t(), tmp_path / "t.pt")
    assert (inspect_chunk(tmp_path / "t.pt").rows, inspect_chunk(tmp_path / "t.pt").dim) == (4, 6)


@pytest.mark.parametrize("header", [b"[" * 200_000 + b"]" * 200_000,
                                    b'{"t": {"dtype": "F16", "shape": [1, ' + b"9" * 5000 + b"]}}"])
def test_a_hostile_safetensors_header_is_one_line(tmp_path, header):
    import struct

    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(StoreError, match=r"h\.safetensors: safetensors header is not JSON \("):
        inspect_chunk(path)  # was a RecursionError / an int-digits ValueError, with a traceback


def test_a_chunk_that_is_a_symbolic_link_is_refused(tmp_path):
    """docs/trust.md: links are never followed; its target is neither read nor recorded."""
    from aleph.targets.sources import source_stats

    real = save_chunk(torch.zeros(3, 4, dtype=torch.float16), tmp_path / "elsewhere.npy")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "chunk_0.npy").symlink_to(real)
    for read in (inspect_chunk, lambda p: source_stats([p])):
        with pytest.raises(StoreError, match=r"d/chunk_0\.npy: a symbolic link; links are not "
                                             r"followed: copy the file or name its target"):
            read(tmp_path / "d" / "chunk_0.npy")


def test_a_pt_chunk_whose_zip_entries_are_compressed_is_refused_before_it_inflates(tmp_path):
    """torch.save stores its zip entries; one deflated by hand (a 2.6 MB file that inflated to
    4 GB when read) is refused from the zip directory alone."""
    import zipfile

    import torch

    from aleph.errors import StoreError
    from aleph.targets.sources import inspect_chunk

    plain = tmp_path / "plain.pt"
    torch.save(torch.zeros(64, 8, dtype=torch.float16), plain)
    packed = tmp_path / "chunk_00000.pt"
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            out.writestr(info.filename, src.read(info))
    assert inspect_chunk(plain).rows == 64
    with pytest.raises(StoreError, match=r"chunk_00000\.pt: zip entry '.*' is compressed; "
                                         r"torch\.save stores its entries"):
        inspect_chunk(packed)


@pytest.mark.parametrize("shape", ["(1, " + "9" * 5000 + ")", "(" * 3000 + ")" * 3000,
                                   "(" + "1, " * 3000 + ")"])
def test_a_hostile_npy_header_is_not_echoed_whole(tmp_path, shape):
    """A 5,000-digit shape, 3,000 nested parentheses or 3,000 dimensions: one line naming the
    file, with the header's echo capped (it was up to numpy's 10,000 header bytes)."""
    import struct

    head = ("{'descr': '<f2', 'fortran_order': False, 'shape': " + shape + ", }").encode()
    head += b" " * (-(10 + len(head) + 1) % 64) + b"\n"
    path = tmp_path / "h.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head)
    with pytest.raises(StoreError, match=r"h\.npy: ") as e:
        inspect_chunk(path)
    assert len(str(e.value)) < len(str(path)) + 400 and "\n" not in str(e.value), len(str(e.value))


def test_a_safetensors_header_over_1_mib_is_refused_before_parsing(tmp_path):
    """A one-tensor header is under 1 KiB; up to 100 MiB was read and parsed (~30x in memory)."""
    import json
    import struct

    pad = "x" * (1 << 20)
    h = json.dumps({"__metadata__": {"pad": pad},
                    "t": {"dtype": "F16", "shape": [2, 4], "data_offsets": [0, 16]}}).encode()
    path = tmp_path / "big.safetensors"
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * 16)
    with pytest.raises(StoreError, match=rf"big\.safetensors: not a safetensors file \(header of "
                                         rf"{len(h):,} bytes; expected at most 1,048,576\)"):
        inspect_chunk(path)
