import json

import numpy as np
import pytest
import torch

from aleph.data import build_token_store, load_captions, open_token_store
from aleph.errors import DataError, StoreError


@pytest.fixture(scope="module")
def captions(smoke):
    return load_captions(smoke.captions)[:500] + ["", "word " * 100]  # empty and over-long


def test_rows_match_direct_tokenisation(tmp_path, captions, smoke_tokenizer):
    store = build_token_store(captions, smoke_tokenizer, tmp_path / "s", max_len=24, batch=64)
    assert (store.rows, store.max_len, store.pad_id) == (len(captions), 24, 0)
    idx = [0, 499, 500, 501, 7]
    ids, mask = store.gather(torch.tensor(idx))
    assert ids.dtype == torch.long and mask.dtype == torch.bool
    assert ids.shape == mask.shape == (5, 24)  # row 501 is truncated to max_len
    for row, i in enumerate(idx):
        want = smoke_tokenizer(captions[i], truncation=True, max_length=24)["input_ids"]
        assert ids[row, :len(want)].tolist() == want
        assert mask[row].sum() == len(want)
        assert (ids[row, len(want):] == 0).all()
    assert ids[3, -1] == smoke_tokenizer.sep_token_id  # truncation keeps [SEP]
    assert store.gather([500])[0].tolist() == [[2, 3]]  # trimmed to the batch's longest row


def test_batching_does_not_change_the_bytes(tmp_path, captions, smoke_tokenizer):
    a = build_token_store(captions, smoke_tokenizer, tmp_path / "a", max_len=24, batch=7)
    b = build_token_store(captions, smoke_tokenizer, tmp_path / "b", max_len=24, batch=4096)
    assert a.manifest["files"] == b.manifest["files"]


def test_reuse_and_mismatch(tmp_path, captions, smoke_tokenizer):
    build_token_store(captions, smoke_tokenizer, tmp_path / "s", max_len=24)
    again = build_token_store(captions, smoke_tokenizer, tmp_path / "s", max_len=24)
    assert again.rows == len(captions)
    with pytest.raises(StoreError, match="max_len"):
        build_token_store(captions, smoke_tokenizer, tmp_path / "s", max_len=16)
    with pytest.raises(StoreError, match="captions_sha256"):
        build_token_store(captions[:-1], smoke_tokenizer, tmp_path / "s", max_len=24)
    with pytest.raises(DataError, match="no captions"):
        build_token_store([], smoke_tokenizer, tmp_path / "empty")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no tmp left


def test_open_verifies_the_manifest(tmp_path, captions, smoke_tokenizer):
    build_token_store(captions, smoke_tokenizer, tmp_path / "s", max_len=24)
    man_path = tmp_path / "s" / "manifest.json"
    man = json.loads(man_path.read_text())
    man_path.write_text(json.dumps({**man, "rows": man["rows"] + 1}))
    with pytest.raises(StoreError, match=r"ids\.npy.*manifest expects int32 \(503, 24\)"):
        open_token_store(tmp_path / "s")
    man_path.write_text(json.dumps(man))
    ids = np.load(tmp_path / "s" / "ids.npy", mmap_mode="r+")
    ids[0, 0] = 99  # same shape, other bytes: only the hash check sees it
    ids.flush()
    del ids
    open_token_store(tmp_path / "s")
    with pytest.raises(StoreError, match="sha256"):
        open_token_store(tmp_path / "s", verify_hashes=True)
    man_path.unlink()
    with pytest.raises(StoreError, match="no manifest"):
        open_token_store(tmp_path / "s")


def test_gather_rejects_out_of_range(tmp_path, captions, smoke_tokenizer):
    store = build_token_store(captions, smoke_tokenizer, tmp_path / "s", max_len=24)
    with pytest.raises(IndexError):
        store.gather([len(captions)])


def test_concurrent_builders_end_with_one_store(tmp_path, captions, smoke_tokenizer):
    from concurrent.futures import ThreadPoolExecutor

    def build(_):
        return build_token_store(captions, smoke_tokenizer, tmp_path / "s", max_len=24,
                                 batch=32).manifest

    with ThreadPoolExecutor(3) as pool:
        manifests = list(pool.map(build, range(3)))
    assert manifests[0] == manifests[1] == manifests[2]
    assert [p.name for p in tmp_path.iterdir()] == ["s"]


@pytest.mark.parametrize("max_len", [0, 1, -3])
def test_max_len_too_small_is_a_data_error(tmp_path, captions, smoke_tokenizer, max_len):
    with pytest.raises(DataError, match="max_len"):
        build_token_store(captions[:3], smoke_tokenizer, tmp_path / "s", max_len=max_len)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("edit", [{"rows": None}, {"max_len": "24"}, {"files": None}, {"pad_id": True}])
def test_manifest_missing_or_mistyped_field_is_a_store_error(tmp_path, captions, smoke_tokenizer, edit):
    build_token_store(captions[:5], smoke_tokenizer, tmp_path / "s", max_len=24)
    man_path = tmp_path / "s" / "manifest.json"
    man = {**json.loads(man_path.read_text()), **edit}
    man = {k: v for k, v in man.items() if v is not None}  # None: the field is removed
    man_path.write_text(json.dumps(man))
    with pytest.raises(StoreError, match="field '(rows|max_len|files|pad_id)'"):
        open_token_store(tmp_path / "s")


def test_a_hostile_manifest_is_one_line(tmp_path):
    """A store's manifest nested 100k deep or a JSON list: one line, no traceback (issue 32)."""
    from aleph.errors import StoreError

    (tmp_path / "s").mkdir()
    man = tmp_path / "s" / "manifest.json"
    man.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StoreError, match=r"manifest.json: invalid JSON \(JSON nested too deeply"):
        open_token_store(tmp_path / "s")
    man.write_text("[]")
    with pytest.raises(StoreError, match=r"manifest.json: a JSON list, expected an object"):
        open_token_store(tmp_path / "s")


@pytest.mark.parametrize("name", ["ids.npy", "lengths.npy"])
@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_reused_store_whose_array_is_a_fifo_or_link_is_one_line(tmp_path, captions,
                                                                 smoke_tokenizer, name, kind):
    """`data tokens --out DIR` reopens an existing store: a FIFO there blocked it forever."""
    import contextlib
    import os
    import threading

    build_token_store(captions[:5], smoke_tokenizer, tmp_path / "s", max_len=24)
    arr = tmp_path / "s" / name
    os.replace(arr, tmp_path / "elsewhere.npy")
    os.mkfifo(arr) if kind == "fifo" else arr.symlink_to(tmp_path / "elsewhere.npy")
    done = threading.Event()

    def unblock():  # the bug: open() waits for a writer; this one makes the test fail, not hang
        if not done.wait(10):
            with contextlib.suppress(OSError):
                os.close(os.open(arr, os.O_WRONLY | os.O_NONBLOCK))

    threading.Thread(target=unblock, daemon=True).start()
    what = "a FIFO" if kind == "fifo" else "a symbolic link"
    try:
        with pytest.raises(StoreError, match=rf"{name}: missing or not a \.npy array \(not a "
                                             rf"regular file \({what}\)"):
            build_token_store(captions[:5], smoke_tokenizer, tmp_path / "s", max_len=24)
    finally:
        done.set()
