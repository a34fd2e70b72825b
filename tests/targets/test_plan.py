"""Quota planning against the seed's figures, from headers only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aleph.errors import QuotaError
from aleph.targets import ChunkInfo, ensure_store, plan

SEED_ROWS, SEED_DIM, SEED_QUOTA, SEED_CHUNKS = 31_905_616, 768, 110_999_998_464, 66


def seed_chunk_rows() -> list[int]:
    """66 chunk sizes summing to the seed's 31,905,616 rows."""
    base = SEED_ROWS // SEED_CHUNKS
    return [base] * (SEED_CHUNKS - 1) + [SEED_ROWS - base * (SEED_CHUNKS - 1)]


def test_seed_figures_refuse_in_ram_and_accept_streaming():
    infos = [ChunkInfo(f"cc12m_{i}.pt", n, SEED_DIM, "float16") for i, n in enumerate(seed_chunk_rows())]
    p = plan(infos, quota_bytes=SEED_QUOTA)
    assert p.store_bytes == 49_007_026_176 and p.rows == SEED_ROWS and p.chunks == 66
    assert p.peaks["in_ram"] == 2 * 49_007_026_176  # parts + concatenated result
    assert p.allowed == {"streaming": True, "in_ram": False}
    assert p.choice == "streaming"
    assert "in_ram predicted peak 98,014,052,352 B" in p.reason
    assert "110,999,998,464 B (103.38 GiB)" in p.reason
    assert p.peaks["streaming"] < 1 << 30  # one ~742 MB chunk + one 64 MiB flush slice
    with pytest.raises(QuotaError, match="'in_ram' refused"):
        p.require("in_ram")
    # the refusal rests on the stated headroom: without it the concatenate would "fit"
    assert plan(infos, quota_bytes=SEED_QUOTA, headroom_bytes=0).allowed["in_ram"]


def test_headroom_is_capped_at_a_quarter_of_a_small_quota():
    # A smoke-sized store inside an 8 GiB cgroup (a CI runner): the fixed 16 GiB headroom
    # left a negative budget and refused even 3 MB; capped at quota/4 it plans streaming.
    infos = [ChunkInfo("smoke.npy", 4096, 768, "float16")]
    p = plan(infos, quota_bytes=8 << 30)
    assert p.choice == "streaming" and p.allowed == {"streaming": True, "in_ram": True}
    assert p.headroom_bytes == 2 << 30
    assert "(capped at 1/4 of the quota from 17,179,869,184 B (16.00 GiB))" in p.reason
    # At the seed's quota the cap does not bind: the stated 16 GiB stays.
    seed = [ChunkInfo(f"c{i}.pt", n, SEED_DIM, "float16") for i, n in enumerate(seed_chunk_rows())]
    assert plan(seed, quota_bytes=SEED_QUOTA).headroom_bytes == 16 << 30
    assert "capped" not in plan(seed, quota_bytes=SEED_QUOTA).reason


def test_nothing_fits_a_tiny_quota():
    infos = [ChunkInfo("a.pt", 1000, 8, "float32")]
    p = plan(infos, quota_bytes=1000, headroom_bytes=0)
    assert p.choice is None and not any(p.allowed.values())
    assert "REFUSED" in p.describe()


def _cgroup_v2(root, limit: str):
    root.mkdir()
    (root / "cgroup.controllers").write_text("memory\n")
    (root / "memory.max").write_text(limit + "\n")
    return root


def _sparse_npy(path, rows, dim):
    """An .npy whose header says rows x dim fp16 and whose data is a hole (no disk used)."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f2", "fortran_order": False, "shape": (rows, dim)})
        f.truncate(f.tell() + rows * dim * 2)
    return path


def test_seed_sized_sparse_chunks_planned_from_headers_and_cgroup(tmp_path, work):
    """66 chunk files of the seed's real size (49 GB, sparse): only headers are read."""
    chunks = tmp_path / "chunks"
    chunks.mkdir()
    paths = [_sparse_npy(chunks / f"cc12m_{i}.npy", n, SEED_DIM) for i, n in enumerate(seed_chunk_rows())]
    root = _cgroup_v2(tmp_path / "cg", str(SEED_QUOTA))
    p = plan(paths, cgroup_root=root)
    assert p.quota_bytes == SEED_QUOTA and p.store_bytes == 49_007_026_176
    assert (p.choice, p.allowed["in_ram"]) == ("streaming", False)
    unlimited = plan(paths, cgroup_root=_cgroup_v2(tmp_path / "cg-max", "max"))
    assert unlimited.quota_bytes is None and unlimited.allowed["in_ram"]
    with pytest.raises(QuotaError, match="'in_ram' refused"):
        ensure_store(paths, implementation="in_ram", quota_bytes=SEED_QUOTA)
    assert not (work / "cache").exists()  # refused before anything was built


def test_in_ram_allowed_when_it_fits(make_chunks, work):
    paths, ref = make_chunks(rows=(5, 6))
    store = ensure_store(paths, implementation="in_ram", quota_bytes=1 << 30, headroom_bytes=0)
    assert store.implementation == "in_ram" and torch.equal(store.gather([10]), ref[10:11])


def test_cgroup_v1_limit_is_read(tmp_path):
    mem = tmp_path / "cg1" / "memory"
    mem.mkdir(parents=True)
    (mem / "memory.limit_in_bytes").write_text(f"{SEED_QUOTA}\n")
    infos = [ChunkInfo(f"c{i}.pt", n, SEED_DIM, "float16") for i, n in enumerate(seed_chunk_rows())]
    p = plan(infos, cgroup_root=tmp_path / "cg1")
    assert p.quota_bytes == SEED_QUOTA and p.choice == "streaming" and not p.allowed["in_ram"]


@pytest.mark.parametrize("quota,headroom", [(0, 1 << 30), (-5, 1 << 30), (SEED_QUOTA, -1)])
def test_nonsense_quota_or_headroom_is_a_config_error(quota, headroom):
    from aleph.errors import ConfigError

    infos = [ChunkInfo("c.pt", 10, SEED_DIM, "float16")]
    with pytest.raises(ConfigError, match="quota|headroom"):
        plan(infos, quota_bytes=quota, headroom_bytes=headroom)
