"""Building: exact bytes, manifest, both implementations identical, cache hits, NaN/Inf."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
import torch
from targets_helpers import save_chunk, scramble_keep_stat, store_bytes

from aleph.errors import ConfigError, StoreError
from aleph.targets import build_store, ensure_store, open_store, store_dir_for


def test_exact_size_rows_and_manifest(make_chunks, tmp_path):
    paths, ref = make_chunks(rows=(40, 25, 33))
    store = build_store(paths, tmp_path / "s")
    assert (store.rows, store.dim, store.dtype) == (98, 8, torch.float16)
    assert store.byte_length == 98 * 8 * 2 == (tmp_path / "s" / "targets.bin").stat().st_size
    assert store_bytes(tmp_path / "s") == ref.numpy().tobytes()  # zero slack, row-major
    m = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert [(c["row_start"], c["row_stop"]) for c in m["chunks"]] == [(0, 40), (40, 65), (65, 98)]
    assert m["chunks"][1]["sha256"] == hashlib.sha256(ref[40:65].numpy().tobytes()).hexdigest()
    assert m["format_version"] == 1 and m["built_by"] == "streaming"
    assert not (tmp_path / "s" / "targets.bin.partial").exists()
    assert not (tmp_path / "s" / "build.json").exists()


@pytest.mark.parametrize("dtype,suffixes", [(torch.float16, (".pt", ".npy", ".safetensors")),
                                            (torch.bfloat16, (".pt", ".safetensors")),
                                            (torch.float32, (".npy", ".pt"))])
def test_streaming_and_in_ram_hold_identical_rows(make_chunks, tmp_path, dtype, suffixes):
    """The seed's claim: the store change alters how targets are held, not what they contain."""
    paths, ref = make_chunks(rows=(17, 30, 5, 22), dtype=dtype, suffixes=suffixes)
    s = build_store(paths, tmp_path / "stream", "streaming", flush_bytes=100)  # many slices
    r = build_store(paths, tmp_path / "ram", "in_ram")
    assert (s.implementation, r.implementation) == ("streaming", "in_ram")
    assert store_bytes(tmp_path / "stream") == store_bytes(tmp_path / "ram")
    idx = np.random.default_rng(0).permutation(ref.shape[0])
    assert torch.equal(s.gather(idx), r.gather(idx))
    assert torch.equal(s.gather(idx), ref[idx])
    assert [c["sha256"] for c in s.manifest["chunks"]] == [c["sha256"] for c in r.manifest["chunks"]]


def test_cache_hit_reads_no_chunk_and_writes_nothing(make_chunks, tmp_path):
    paths, ref = make_chunks()
    build_store(paths, tmp_path / "s")
    files = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (tmp_path / "s").iterdir()}
    for p in paths:  # unreadable garbage with the same size and mtime
        scramble_keep_stat(p)
        os.chmod(p, 0)
    again = build_store(paths, tmp_path / "s")
    assert torch.equal(again.gather(np.arange(ref.shape[0])), ref)
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (tmp_path / "s").iterdir()} == files


def test_changed_source_rebuilds(make_chunks, tmp_path):
    paths, ref = make_chunks(rows=(10, 10))
    first = store_dir_for(paths, tmp_path)
    old_fp = build_store(paths, first).manifest["source_fingerprint"]
    new = torch.full((10, 8), 3.0, dtype=torch.float16)
    save_chunk(new, paths[1])
    os.utime(paths[1], ns=(1, 2_000_000_000))  # mtime certainly differs from the build's
    second = store_dir_for(paths, tmp_path)
    assert second != first
    assert torch.equal(build_store(paths, second).gather([15]), new[5:6])
    rebuilt_in_place = build_store(paths, first)  # same dir, other sources: rebuilt
    assert torch.equal(rebuilt_in_place.gather([15]), new[5:6])
    assert rebuilt_in_place.manifest["source_fingerprint"] != old_fp
    assert ref.shape == (20, 8)


def test_nonfinite_rows_reported_or_refused(tmp_path, capsys):
    t = torch.zeros(20, 4, dtype=torch.float16)
    t[3, 1], t[17, 0] = float("nan"), float("inf")
    good = save_chunk(torch.ones(5, 4, dtype=torch.float16), tmp_path / "a.npy")
    bad = save_chunk(t, tmp_path / "b.pt")
    store = build_store([good, bad], tmp_path / "warn")
    assert store.manifest["nonfinite"]["rows"] == 2
    assert store.manifest["nonfinite"]["chunks"][0]["first_rows"] == [8, 22]
    assert "b.pt: 2 row(s) contain NaN/Inf; first chunk rows [3, 17]" in capsys.readouterr().err
    for impl in ("streaming", "in_ram"):
        with pytest.raises(StoreError, match=r"b\.pt: 2 row\(s\) contain NaN/Inf.*refused"):
            build_store([good, bad], tmp_path / f"fail-{impl}", impl, nonfinite="fail")
        with pytest.raises(StoreError, match="no manifest"):
            open_store(tmp_path / f"fail-{impl}")


def test_failed_build_keeps_the_previous_store(make_chunks, tmp_path):
    paths, ref = make_chunks(rows=(6, 6))
    build_store(paths, tmp_path / "s")
    nan = torch.full((6, 8), float("nan"), dtype=torch.float16)
    other = save_chunk(nan, tmp_path / "nan.npy")
    with pytest.raises(StoreError, match="NaN"):
        build_store([paths[0], other], tmp_path / "s", nonfinite="fail")
    kept = open_store(tmp_path / "s")
    assert torch.equal(kept.gather(np.arange(12)), ref)


def test_bad_options(make_chunks, tmp_path):
    paths, _ = make_chunks(rows=(3,))
    with pytest.raises(ConfigError, match="implementation 'mmap'"):
        build_store(paths, tmp_path / "s", "mmap")
    with pytest.raises(ConfigError, match="nonfinite 'ignore'"):
        build_store(paths, tmp_path / "s", nonfinite="ignore")


def test_ensure_store_uses_work_root_cache(make_chunks, work):
    paths, ref = make_chunks(rows=(9, 4))
    store = ensure_store(paths, quota_bytes=10 << 30, headroom_bytes=0)
    assert store.store_dir.parent == work / "cache" / "targets"
    assert store.implementation == "streaming"
    assert torch.equal(ensure_store(paths).gather([12]), ref[12:13])


def test_nonfinite_found_across_scan_blocks():
    from aleph.targets.writer import _nonfinite_rows

    raw = np.zeros((1000, 6), dtype="<u2")
    raw[[0, 499, 999], [5, 0, 3]] = [0x7C00, 0xFE00, 0xFC00]  # +Inf, NaN, -Inf in fp16
    raw[10, 1] = 0x7BFF  # the largest finite fp16: not reported
    assert _nonfinite_rows(raw, 0x7C00, block_bytes=120).tolist() == [0, 499, 999]


def test_content_hash_names_the_bytes_not_the_paths_or_holding(make_chunks, tmp_path):
    """Equal rows from other files, formats and holdings share content_sha256; manifests differ."""
    a_paths, ref = make_chunks(rows=(20, 12), suffixes=(".pt",), subdir="a")
    b_paths, _ = make_chunks(rows=(20, 12), suffixes=(".npy",), subdir="b")  # same seed, same rows
    a = build_store(a_paths, tmp_path / "sa", "streaming")
    b = build_store(b_paths, tmp_path / "sb", "in_ram")
    assert a.manifest_sha256 != b.manifest_sha256  # paths, sizes, builder differ
    assert a.content_sha256 == b.content_sha256
    changed = ref[20:].clone()
    changed[3, 0] += 1
    save_chunk(changed, b_paths[1])
    c = build_store(b_paths, tmp_path / "sc", "streaming")
    assert c.content_sha256 != a.content_sha256


def test_resume_under_fail_refuses_nonfinite_rows_recorded_by_a_warn_build(tmp_path, monkeypatch):
    from aleph.targets import build_streaming as bs

    t = torch.zeros(6, 4, dtype=torch.float16)
    t[2, 1] = float("nan")
    paths = [save_chunk(t, tmp_path / "a.npy"),
             save_chunk(torch.ones(6, 4, dtype=torch.float16), tmp_path / "b.npy")]

    class Killed(BaseException):
        pass

    def die(name, index=0):  # stands in for a kill -9 after chunk 0 is recorded
        if (name, index) == ("recorded", 0):
            raise Killed

    monkeypatch.setattr(bs, "fault_point", die)
    with pytest.raises(Killed):
        build_store(paths, tmp_path / "s", nonfinite="warn")
    monkeypatch.undo()
    assert (tmp_path / "s" / "build.json").exists()  # a resumable interrupted build
    with pytest.raises(StoreError, match=r"a\.npy: 1 row\(s\) contain NaN/Inf.*refused"):
        build_store(paths, tmp_path / "s", nonfinite="fail")
    with pytest.raises(StoreError, match="no manifest"):
        open_store(tmp_path / "s")
    assert build_store(paths, tmp_path / "s").manifest["nonfinite"]["rows"] == 1  # warn resumes


def test_damaged_progress_record_is_redone_not_a_crash(make_chunks, tmp_path, monkeypatch):
    from aleph.targets import build_streaming as bs

    paths, ref = make_chunks(rows=(5, 6, 7))

    class Killed(BaseException):
        pass

    def die(name, index=0):
        if (name, index) == ("recorded", 1):
            raise Killed

    monkeypatch.setattr(bs, "fault_point", die)
    with pytest.raises(Killed):
        build_store(paths, tmp_path / "s")
    monkeypatch.undo()
    progress = tmp_path / "s" / "build.json"
    record = json.loads(progress.read_text())
    record["done"] = [record["done"][0], "junk", 7, 8, 9]  # longer than the chunk list, not dicts
    progress.write_text(json.dumps(record))
    build_store(paths, tmp_path / "s")
    assert store_bytes(tmp_path / "s") == ref.numpy().tobytes()
