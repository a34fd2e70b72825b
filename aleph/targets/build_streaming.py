"""The streaming build: chunk by chunk into a preallocated file, resumable after a kill.

Peak memory is one chunk (chunks are mapped and streamed in `flush_bytes` slices),
dirty page cache is one slice. After each chunk its sha256 is recorded in
`build.json` (atomically, after the chunk's bytes are fdatasync'ed), so a killed
build resumes at the first chunk not recorded; recorded chunks are re-hashed from
the partial file before they are trusted.
"""

from __future__ import annotations

import os
from pathlib import Path

from aleph._faults import fault_point
from aleph._io import atomic_write_json, fsync_dir, open_write_nofollow, read_json
from aleph.errors import StoreError
from aleph.targets.finalize import finalize, layout, make_manifest
from aleph.targets.format import DATA_FILE, DTYPES, MANIFEST_FILE, PARTIAL_FILE, PROGRESS_FILE
from aleph.targets.sources import ChunkInfo, open_chunk
from aleph.targets.writer import hash_range, preallocate, report_nonfinite, write_chunk


def _recover_renamed(store_dir: Path) -> None:
    """A kill between rename and manifest leaves targets.bin + build.json, no partial:
    move the finished file back so the resume logic below treats it uniformly."""
    if (store_dir / PROGRESS_FILE).exists() and not (store_dir / PARTIAL_FILE).exists() \
            and not (store_dir / MANIFEST_FILE).exists() and (store_dir / DATA_FILE).exists():
        os.replace(store_dir / DATA_FILE, store_dir / PARTIAL_FILE)
        fsync_dir(store_dir)


def _resumable(store_dir: Path, header: dict) -> list[dict] | None:
    """The recorded chunks of an interrupted build of the same sources, else None."""
    try:
        progress = read_json(store_dir / PROGRESS_FILE)
        size = (store_dir / PARTIAL_FILE).stat().st_size
    except (OSError, ValueError):
        return None
    same = isinstance(progress, dict) and all(progress.get(k) == v for k, v in header.items())
    if not same or size != header["total_bytes"] or not isinstance(progress.get("done"), list):
        return None
    return progress["done"]


def _verified_prefix(fd: int, path: str, chunks: list[dict], done: list[dict],
                     row_bytes: int) -> list[dict]:
    """Keep recorded chunks while their bytes in the partial file still hash right."""
    for k, rec in enumerate(done):
        if k >= len(chunks) or not isinstance(rec, dict):  # a damaged record: redo from here
            return done[:k]
        c = chunks[k]
        if rec.get("index") != k or hash_range(fd, path, c["row_start"] * row_bytes,
                                               c["rows"] * row_bytes) != rec.get("sha256"):
            return done[:k]
    return done


def build_streaming(store_dir: Path, infos: list[ChunkInfo], fingerprint: str,
                    nonfinite: str, flush_bytes: int) -> dict:
    """Build (or resume) the store in `store_dir`; return its manifest. Caller holds the lock."""
    chunks = layout(infos)
    header = {"fingerprint": fingerprint, "layout": chunks,
              "total_bytes": sum(i.nbytes for i in infos)}
    partial, progress = store_dir / PARTIAL_FILE, store_dir / PROGRESS_FILE
    row_bytes = infos[0].dim * DTYPES[infos[0].dtype][1]
    _recover_renamed(store_dir)
    done = _resumable(store_dir, header)
    if done is None:
        progress.unlink(missing_ok=True)
        fd, done = preallocate(str(partial), header["total_bytes"]), []
    else:
        fd = open_write_nofollow(partial)  # a planted link or FIFO: refused
        done = _verified_prefix(fd, str(partial), chunks, done, row_bytes)
    try:
        # chunks recorded by an interrupted "warn" build are not re-scanned: a resume
        # under "fail" must refuse their non-finite rows from the record
        for d in done:
            if d.get("nonfinite") and nonfinite == "fail":
                nf = d["nonfinite"]
                raise StoreError(
                    f"{nf.get('path')}: {nf.get('count')} row(s) contain NaN/Inf; store rows "
                    f"{nf.get('first_rows')} (found by the interrupted build this one resumes); "
                    "refused because non-finite rows are set to fail")
        for k in range(len(done), len(infos)):
            with open_chunk(infos[k]) as raw:  # (rows_k, D) mapped
                res = write_chunk(fd, str(partial), chunks[k]["row_start"] * row_bytes, raw,
                                  infos[k].dtype, flush_bytes)
            nf = report_nonfinite(infos[k].path, chunks[k]["row_start"], res, nonfinite)
            fault_point("written", k)
            done.append({"index": k, "sha256": res.sha256, "nonfinite": nf})
            atomic_write_json(progress, {**header, "done": done})
            fault_point("recorded", k)
    except BaseException:
        os.close(fd)
        raise
    nf_all = [d["nonfinite"] for d in done if d.get("nonfinite")]
    manifest = make_manifest(infos, fingerprint, [d["sha256"] for d in done], nf_all, "streaming")
    finalize(store_dir, fd, manifest)
    return manifest
