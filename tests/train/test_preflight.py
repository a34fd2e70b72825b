"""Preflight pieces that run without a GPU: target expansion, VRAM estimate, CPU paths."""

from __future__ import annotations

import pytest
import torch

from aleph.errors import ConfigError
from aleph.train.config import resolve
from aleph.train.distributed import World, check_divisible
from aleph.train.preflight import (
    apply_allocator_cap,
    captions_identity,
    estimate_vram_bytes,
    expand_targets,
    vram_probe,
)


def test_target_directory_expands_in_name_order(tmp_path):
    for name in ("chunk-010.pt", "chunk-002.pt", "notes.txt", "chunk-001.npy"):
        (tmp_path / name).write_bytes(b"x")
    assert [p.rsplit("/", 1)[1] for p in expand_targets((str(tmp_path),))] == [
        "chunk-001.npy", "chunk-002.pt", "chunk-010.pt"]
    with pytest.raises(ConfigError, match="'targets': .*missing.pt does not exist"):
        expand_targets((str(tmp_path / "missing.pt"),))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="holds no"):
        expand_targets((str(empty),))


def test_vram_estimate_scales_with_batch_split_and_checkpointing():
    e1 = resolve("e1", overrides=["captions=x", "targets=y"], arm="a2_dense")
    one, two = estimate_vram_bytes(e1, 54_000_000, 1), estimate_vram_bytes(e1, 54_000_000, 2)
    assert 8 << 30 < one < 12 << 30  # ~9.6 GiB for the E1 shape at batch 256
    assert two < one
    ck = resolve("e1", overrides=["captions=x", "targets=y", "checkpointing=true"], arm="a2_dense")
    assert estimate_vram_bytes(ck, 54_000_000, 1) < one / 3


def test_cpu_paths_say_what_was_not_done():
    cfg = resolve("smoke", overrides=["alloc_cap_fraction=0.5"], arm="a2_dense")
    assert apply_allocator_cap(cfg, torch.device("cpu")) == \
        "allocator cap: 0.5 requested, not applied (no CUDA)"
    assert vram_probe(cfg, torch.device("cpu"), 1 << 40) == "VRAM probe: skipped: no CUDA"


def test_global_batch_must_split_over_ranks():
    assert check_divisible(64, World(rank=1, size=4)) == 16
    with pytest.raises(ConfigError, match="'batch_size': 64 is the GLOBAL batch.*world size 3"):
        check_divisible(64, World(rank=0, size=3))


def test_captions_identity_changes_with_the_file(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("a\n")
    first = captions_identity(str(f))
    f.write_text("a\nb\n")
    assert captions_identity(str(f)) != first
    assert captions_identity("org/dataset") == {"dataset": "org/dataset"}
