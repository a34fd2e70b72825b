"""The in-RAM build, as the a1 arm's revision did it: load every chunk, torch.cat, hold.

Peak memory is the parts plus the concatenated result (2x the store) at the moment
of the cat: that is what crossed the 103.38 GiB quota at 49 GB of targets and why
`plan` refuses this implementation there. Kept as an explicit implementation so the
claim that both hold the same rows stays testable. It writes the same store file
(through the same writer) so its output is cached and verifiable like a streaming
build; a killed in-RAM build restarts from scratch (it has nothing to resume).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from aleph._faults import fault_point
from aleph.targets.finalize import finalize, layout, make_manifest
from aleph.targets.format import PARTIAL_FILE, PROGRESS_FILE, raw_view, tensor_view
from aleph.targets.sources import ChunkInfo, open_chunk
from aleph.targets.writer import preallocate, report_nonfinite, write_chunk


def _load(info: ChunkInfo) -> torch.Tensor:
    """The whole chunk as an in-memory tensor (rows_k, D), like torch.load without mmap."""
    with open_chunk(info) as raw:
        return tensor_view(np.array(raw), info.dtype)  # (rows_k, D) in anonymous memory


def build_in_ram(store_dir: Path, infos: list[ChunkInfo], fingerprint: str,
                 nonfinite: str, flush_bytes: int) -> tuple[dict, torch.Tensor]:
    """Build the store in memory, write it, and return (manifest, the (N, D) tensor)."""
    parts = [_load(info) for info in infos]
    full = torch.cat(parts)  # (N, D); parts and result are both alive here: the peak
    del parts
    fault_point("concatenated")
    dtype, itemsize = infos[0].dtype, full.element_size()
    raw = raw_view(full)  # (N, D) same memory
    (store_dir / PROGRESS_FILE).unlink(missing_ok=True)  # a streaming build's leftovers
    fd = preallocate(str(store_dir / PARTIAL_FILE), full.numel() * itemsize)
    hashes, nf_all, row_bytes = [], [], full.shape[1] * itemsize
    try:
        for info, c in zip(infos, layout(infos), strict=True):
            res = write_chunk(fd, str(store_dir / PARTIAL_FILE), c["row_start"] * row_bytes,
                              raw[c["row_start"]:c["row_stop"]], dtype, flush_bytes)
            hashes.append(res.sha256)
            nf = report_nonfinite(info.path, c["row_start"], res, nonfinite)
            if nf:
                nf_all.append(nf)
    except BaseException:
        os.close(fd)
        raise
    manifest = make_manifest(infos, fingerprint, hashes, nf_all, "in_ram")
    finalize(store_dir, fd, manifest)
    return manifest, full
