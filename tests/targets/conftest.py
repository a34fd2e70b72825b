"""Fixtures for the target store tests: small chunk files in every supported format."""

from __future__ import annotations

import pytest
import torch
from targets_helpers import save_chunk


@pytest.fixture
def make_chunks(tmp_path):
    """make_chunks(rows=[..], dim=8, dtype=fp16, suffixes=(...)) -> (paths, torch.cat of rows).

    Values are seeded normals; suffixes cycle over the chunks.
    """

    def make(rows=(40, 25, 33), dim=8, dtype=torch.float16,
             suffixes=(".pt", ".npy", ".safetensors"), seed=0, subdir="chunks"):
        g = torch.Generator().manual_seed(seed)
        d = tmp_path / subdir
        d.mkdir(exist_ok=True)
        parts, paths = [], []
        for i, n in enumerate(rows):
            t = torch.randn(n, dim, generator=g).to(dtype)
            parts.append(t)
            paths.append(save_chunk(t, d / f"chunk_{i}{suffixes[i % len(suffixes)]}"))
        return paths, torch.cat(parts)

    return make
