"""Reading: gather, scan, open-time checks, and verify (quick and full)."""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import pytest
import torch

from aleph.errors import StoreError
from aleph.targets import build_store, open_store, verify_store
from aleph.targets import store as store_mod
from aleph.targets.store import TargetStore, load_manifest


@pytest.fixture
def built(make_chunks, tmp_path):
    paths, ref = make_chunks(rows=(50, 30, 20))
    build_store(paths, tmp_path / "s")
    return tmp_path / "s", ref


@pytest.mark.parametrize("impl", ["streaming", "in_ram"])
def test_gather_any_order_numpy_or_torch(built, impl):
    d, ref = built
    store = open_store(d, impl)
    idx = np.array([99, 0, 42, 42, 7])
    assert torch.equal(store.gather(idx), ref[idx])
    assert torch.equal(store.gather(torch.tensor([3, 98])), ref[[3, 98]])
    out = store.gather(idx, pin=True)  # no CUDA here: pin is ignored without error
    assert torch.equal(out, ref[idx]) and out.dtype == torch.float16 and out.shape == (5, 8)
    assert store.gather(np.array([], dtype=np.int64)).shape == (0, 8)
    with pytest.raises(IndexError, match=r"out of range \[0, 100\)"):
        store.gather([100])
    with pytest.raises(IndexError, match="1-D integer"):
        store.gather(np.array([0.5]))


@pytest.mark.parametrize("impl", ["streaming", "in_ram"])
def test_scan_covers_every_row_in_order(built, impl):
    d, ref = built
    batches = list(open_store(d, impl).scan(batch_rows=32))
    assert [r0 for r0, _ in batches] == [0, 32, 64, 96]
    assert torch.equal(torch.cat([b for _, b in batches]), ref)


def test_open_rejects_size_dtype_and_missing_manifest(built):
    d, _ = built
    manifest = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps({**manifest, "dtype": "float32"}))
    with pytest.raises(StoreError, match=r"byte_length 1,600 does not equal rows 100 x dim 8 x 4 B"):
        open_store(d)
    fixed = {**manifest, "dtype": "float32", "byte_length": 3200}
    (d / "manifest.json").write_text(json.dumps(fixed))
    with pytest.raises(StoreError, match=r"targets\.bin: size 1,600 B does not match .* 3,200 B"):
        open_store(d)
    (d / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(StoreError, match="v99"):
        open_store(d)
    (d / "manifest.json").unlink()
    with pytest.raises(StoreError, match="no manifest: not a complete target store"):
        open_store(d)


def test_truncated_store_file_is_refused(built):
    d, _ = built
    with open(d / "targets.bin", "r+b") as f:
        f.truncate(1598)
    with pytest.raises(StoreError, match="size 1,598 B"):
        verify_store(d)


def test_verify_full_detects_an_edited_byte(built):
    d, _ = built
    assert verify_store(d, full=True)["ok"]
    with open(d / "targets.bin", "r+b") as f:
        f.seek(60 * 16 + 3)  # row 60: inside chunk 1 (rows 50..80)
        byte = f.read(1)
        f.seek(60 * 16 + 3)
        f.write(bytes([byte[0] ^ 1]))
    assert verify_store(d)["ok"]  # quick: size and manifest still agree
    with pytest.raises(StoreError, match=r"(?s)1 chunk range\(s\) differ.*chunk 1 \(store rows 50..80"):
        verify_store(d, full=True)


@pytest.mark.gpu
def test_gather_pins_when_cuda_is_available(built):
    d, ref = built
    for impl in ("streaming", "in_ram"):
        out = open_store(d, impl).gather([5, 1], pin=True)
        assert out.is_pinned() and torch.equal(out, ref[[5, 1]])
        assert not open_store(d, impl).gather([5, 1]).is_pinned()


def _mapping_kb(addr: int) -> dict[str, int]:
    """Size and Rss (KiB) of this process's mapping that starts at `addr`, from smaps."""
    found, fields = False, {}
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                if found:
                    break
                found = int(head.split("-")[0], 16) == addr
            elif found and head in ("Size:", "Rss:"):
                fields[head[:-1]] = int(line.split()[1])
    assert found, f"no mapping at {addr:#x}"
    return fields


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
@pytest.mark.parametrize("populate", [True, False], ids=["populate_read", "touch_fallback"])
def test_prefault_maps_every_page_and_gathers_the_same_rows(make_chunks, tmp_path, monkeypatch,
                                                            populate):
    paths, ref = make_chunks(rows=(600, 424), dim=256)  # 1024 rows x 512 B: 128 pages
    build_store(paths, tmp_path / "s")
    if not populate:  # an advice the kernel refuses (EINVAL): the strided touch must do it
        monkeypatch.setattr(store_mod, "MADV_POPULATE_READ", -1)
    fresh = open_store(tmp_path / "s")
    assert fresh.prefaulted is None
    assert _mapping_kb(fresh._mm.ctypes.data)["Rss"] == 0  # nothing mapped until touched
    warm = open_store(tmp_path / "s", prefault=True)
    assert warm.prefaulted == ("populate_read" if populate else "touch")
    kb = _mapping_kb(warm._mm.ctypes.data)
    assert kb["Size"] >= 512 and kb["Rss"] == kb["Size"]  # every page mapped at open
    idx = np.random.default_rng(0).permutation(1024)[:700]
    got = warm.gather(idx)
    assert torch.equal(got, ref[idx]) and torch.equal(got, fresh.gather(idx))
    assert torch.equal(warm.gather(torch.from_numpy(idx)), ref[idx])


def test_in_ram_gather_of_a_strided_tensor(built):
    d, ref = built
    strided = ref.t().contiguous().t()  # same rows, column-major storage
    assert not strided.is_contiguous()
    store = TargetStore(d, load_manifest(d), "in_ram", strided)
    idx = np.array([99, 0, 42, 42, 7])
    assert torch.equal(store.gather(idx), ref[idx])


def test_manifest_fields_that_would_crash_or_escape_are_refused(built):
    d, _ = built
    manifest = json.loads((d / "manifest.json").read_text())
    chunks = [{k: v for k, v in c.items() if k != "sha256"} for c in manifest["chunks"]]
    (d / "manifest.json").write_text(json.dumps({**manifest, "chunks": chunks}))
    with pytest.raises(StoreError, match=r"chunks\[0\] field 'sha256' missing"):
        open_store(d)  # was a KeyError from content_sha256
    (d / "manifest.json").write_text(json.dumps({**manifest, "data_file": "../../x.bin"}))
    with pytest.raises(StoreError, match="field 'data_file'"):
        open_store(d)


def test_a_file_where_the_store_should_be_is_a_store_error(tmp_path, make_chunks):
    paths, _ = make_chunks(rows=(4,))
    (tmp_path / "f").write_text("keep\n")
    with pytest.raises(StoreError, match="not a directory"):
        open_store(tmp_path / "f")
    with pytest.raises(StoreError, match="not a directory"):
        verify_store(tmp_path / "f")
    with pytest.raises(StoreError, match="cannot create the store directory"):
        build_store(paths, tmp_path / "f")
    with pytest.raises(StoreError, match="cannot create the store directory"):
        build_store(paths, tmp_path / "f" / "sub")
    assert (tmp_path / "f").read_text() == "keep\n"


def test_unreadable_data_file_is_a_store_error(built, monkeypatch):
    d, _ = built
    real_open = os.open

    def deny(path, *a, **kw):
        if str(path).endswith("targets.bin"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(os, "open", deny)  # tests may run as root, where chmod denies nothing
    with pytest.raises(StoreError, match="cannot open the data file"):
        verify_store(d, full=True)
    monkeypatch.undo()
    monkeypatch.setattr(np, "memmap", lambda *a, **k: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied")))
    with pytest.raises(StoreError, match="cannot map the data file"):
        open_store(d)


def _unblock_later(fifo, done, after=10.0):
    """Opens `fifo` for writing after `after` s unless `done` is set: a reader that blocked
    on it (the bug) then reads EOF and the test fails instead of hanging."""
    import threading

    def run():
        if not done.wait(after):
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    threading.Thread(target=run, daemon=True).start()


@pytest.mark.parametrize("kind", ["fifo", "link", "deep"])
def test_a_hostile_manifest_is_one_line_never_a_hang(built, tmp_path, kind):
    import threading

    d, _ = built
    man = d / "manifest.json"
    (tmp_path / "elsewhere.json").write_bytes(man.read_bytes())
    man.unlink()
    if kind == "fifo":
        os.mkfifo(man)
    elif kind == "link":
        man.symlink_to(tmp_path / "elsewhere.json")
    else:
        man.write_bytes(b"[" * 200_000 + b"]" * 200_000)
    want = {"fifo": r"cannot read the manifest \(not a regular file \(a FIFO\)",
            "link": r"cannot read the manifest \(not a regular file \(a symbolic link\)",
            "deep": r"not valid JSON \(JSON nested too deeply"}[kind]
    for reader in (open_store, verify_store):
        done = threading.Event()
        if kind == "fifo":
            _unblock_later(man, done)
        try:
            with pytest.raises(StoreError, match=rf"manifest\.json: {want}"):
                reader(d)
        finally:
            done.set()
