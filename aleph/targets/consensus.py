"""`aleph targets consensus`: one target per row from k teachers' chunk directories.

Each teacher directory holds chunk files with the same names and row counts (`check_inputs`
refuses anything else in one line, before anything is written; a directory of an extraction
must hold every chunk of its plan: `extract_plan.require_extracted`). The pass:

1. hashes every input file (sha256, recorded in consensus.json);
2. streams up to `fit_rows` evenly spaced rows into `procrustes.GramAccumulator` (memory:
   k^2 dim^2 x 8 B, whatever the row count), refused first when `procrustes.fit_memory`
   exceeds `budget.memory_budget`;
3. fits the generalized Procrustes rotations (`procrustes.fit_gpa`, optional ZCA
   whitening) into `consensus-rotations.st` (safetensors);
4. applies them chunk by chunk: row = L2-normalise(sum_i (x_i - mean_i) @ W_i R_i) in
   float32, cast to fp16, into an output chunk of the same name and format, so OUT is a
   target directory `aleph targets build` and `targets=` read as is;
5. writes `consensus.json` last: OUT is complete exactly when it exists.

A stopped pass resumes: `.consensus-state.json` records the fit (keyed on the inputs' path,
size and mtime and the options) and each finished chunk, never redone. A NaN or Inf teacher
row is refused naming teacher, chunk and row (in the fit sample before the fit, elsewhere
before its consensus chunk is published); so is a state or result file that is not a JSON
object of the expected fields.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from aleph._faults import fault_point
from aleph._io import (
    atomic_write_bytes,
    atomic_write_json,
    read_json_record,
    sha256_bytes,
    sha256_file,
    sha256_json,
)
from aleph._signals import StopRequested
from aleph.errors import StoreError
from aleph.targets.budget import require_memory
from aleph.targets.chunkio import BLOCK_ROWS, ChunkWriter, float_blocks, regular_chunks, take_rows
from aleph.targets.extract_plan import require_extracted
from aleph.targets.procrustes import GpaFit, GramAccumulator, fit_gpa, fit_memory
from aleph.targets.sources import ChunkInfo, describe_sources

DEFAULT_FIT_ROWS = 500_000  # the lineage's n_samples / training_samples
RESULT_FILE = "consensus.json"
STATE_FILE = ".consensus-state.json"
# safetensors inside, but not named .safetensors: OUT must list only the target chunks
ROTATIONS_FILE = "consensus-rotations.st"


@dataclass
class Inputs:
    """The teachers' chunks, checked to form one table: chunks[t][c] is teacher t, chunk c."""

    dirs: list[str]
    names: list[str]
    chunks: list[list[ChunkInfo]]
    rows: list[int]  # per chunk
    dim: int

    @property
    def total(self) -> int:
        return sum(self.rows)


def check_inputs(teacher_dirs: list[str]) -> Inputs:
    """Every teacher directory: regular chunk files, the same names and row counts, one width."""
    if len(teacher_dirs) < 2:
        raise StoreError(f"consensus needs at least 2 teacher directories, got {len(teacher_dirs)}")
    dirs = [os.path.realpath(d) for d in teacher_dirs]
    if len(set(dirs)) != len(dirs):
        raise StoreError(f"a teacher directory is given twice: {teacher_dirs}")
    require_extracted(teacher_dirs)  # every shard of their extraction finished
    chunks, names = [], None
    for d in dirs:
        if not os.path.isdir(d):
            raise StoreError(f"{d}: not a directory (expected a teacher's chunk directory)")
        infos = describe_sources(regular_chunks(d))
        these = [os.path.basename(i.path) for i in infos]
        if names is None:
            names = these
        elif these != names:
            diff = sorted(set(these) ^ set(names)) or [f"order {these} vs {names}"]
            raise StoreError(f"{d}: chunk names differ from {dirs[0]}: {', '.join(diff[:5])}")
        chunks.append(infos)
    first = chunks[0]
    for infos in chunks[1:]:
        for a, b in zip(first, infos, strict=True):
            if b.rows != a.rows:
                raise StoreError(f"{b.path}: {b.rows:,} rows, expected {a.rows:,} (as {a.path})")
            if b.dim != a.dim:
                raise StoreError(f"{b.path}: width {b.dim}, expected {a.dim} (as {a.path}); "
                                 "rotations need teachers of one width")
    return Inputs(dirs, names, chunks, [i.rows for i in first], first[0].dim)


def fit_index(rows: list[int], fit_rows: int) -> list[np.ndarray]:
    """Per chunk, the sorted local rows of an evenly spaced sample of min(fit_rows, total)."""
    total = sum(rows)
    n = min(fit_rows, total)
    picks = np.arange(n, dtype=np.int64) * total // n  # distinct, sorted, spread over all rows
    out, start = [], 0
    for r in rows:
        lo, hi = np.searchsorted(picks, [start, start + r])
        out.append(picks[lo:hi] - start)
        start += r
    return out


def _say(msg: str) -> None:
    print(f"consensus: {msg}", file=sys.stderr, flush=True)


def _eta(done: int, total: int, t0: float) -> str:
    rate = done / max(time.monotonic() - t0, 1e-9)
    left = (total - done) / rate if rate > 0 else float("inf")
    return f"{done:,}/{total:,} rows, {rate:,.0f} rows/s, ETA {left:,.0f} s"


def require_finite(info: ChunkInfo, block: torch.Tensor, rows) -> None:
    """StoreError naming teacher, chunk and row when a row of `block` (chunk `info`'s rows
    `rows`, a sequence of local row numbers) holds a NaN or Inf."""
    bad = (~torch.isfinite(block)).any(1).nonzero()
    if bad.numel():
        row = int(rows[int(bad[0])])
        raise StoreError(f"teacher {os.path.dirname(info.path)}: chunk "
                         f"{os.path.basename(info.path)}: row {row:,} holds NaN or Inf values; "
                         "expected finite teacher vectors (extract that chunk again)")


def accumulate(inp: Inputs, fit_rows: int, device: str) -> GramAccumulator:
    acc = GramAccumulator(len(inp.chunks), inp.dim, device)
    t0 = time.monotonic()
    for c, index in enumerate(fit_index(inp.rows, fit_rows)):
        for s in range(0, len(index), BLOCK_ROWS):
            rows = index[s:s + BLOCK_ROWS]
            blocks = [take_rows(t[c], rows) for t in inp.chunks]
            for t, b in zip(inp.chunks, blocks, strict=True):
                require_finite(t[c], b, rows)  # one NaN would make every sum NaN
            acc.add(blocks)
        _say(f"fit sample {_eta(acc.rows, min(fit_rows, inp.total), t0)}")
    return acc


def save_rotations(path: Path, fit: GpaFit) -> str:
    """The rotations file (safetensors, float64: rotation_i, mean_i, whitener_i); returns its sha256."""
    from safetensors.torch import save

    parts = {"rotation": fit.rotations, "mean": fit.means, "whitener": fit.whiteners}
    data = save({f"{name}_{i}": t.cpu().clone()  # clone: no shared storage
                 for name, ts in parts.items() for i, t in enumerate(ts)})
    atomic_write_bytes(path, data)
    return sha256_bytes(data)


def apply_chunk(inp: Inputs, c: int, maps: torch.Tensor, bias: torch.Tensor, out: Path) -> str:
    """Write consensus chunk c; maps (kD, D) float32, bias (D,) float32. Returns its sha256."""
    path = str(out / inp.names[c])
    writer = ChunkWriter(path, inp.rows[c], inp.dim)
    streams = [float_blocks(t[c]) for t in inp.chunks]
    try:
        for parts in zip(*streams, strict=True):
            start = parts[0][0]
            for t, (_, b) in zip(inp.chunks, parts, strict=True):
                require_finite(t[c], b, range(start, start + b.shape[0]))
            x = torch.cat([b for _, b in parts], dim=1).to(maps.device)  # (n, kD)
            y = torch.nn.functional.normalize(x @ maps + bias, dim=1)  # (n, D), fp32 then fp16
            writer.write(slice(start, start + y.shape[0]), y)
            fault_point("consensus-block", c)
    except (StoreError, StopRequested):
        writer.discard()  # no chunk with a NaN row is ever published, nor a stopped one
        raise
    writer.commit()
    return sha256_file(path)


_STATE_FIELDS = {"key": str, "hashes": list, "fit_rows_used": int, "done": dict,
                 "rotations_sha256": str, "fit": dict}
_RESULT_FIELDS = {"key": str}
_FIT_FIELDS = ("iterations", "converged", "objective", "objective_trace", "residuals",
               "relative_residuals")
_RECORD_MAX = 64 << 20  # a record of a million chunks is ~100 MiB less than this allows


def read_record(path: Path, fields: dict[str, type]) -> dict:
    """A JSON object file of OUT (the state or the result) holding `fields` of their types;
    StoreError (one line) for anything else: a list, a link, 100k-deep nesting, a FIFO."""
    try:
        return read_json_record(path, _RECORD_MAX, fields)
    except ValueError as e:
        raise StoreError(f"{path}: {e}; choose a new --out (nothing was changed)") from None


def _open_out(out: Path, key: str) -> dict | None:
    """The resumable state in OUT, None for a fresh OUT; refuses a foreign or other run's OUT."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise StoreError(f"{out}: exists and is not a directory")
    state_path = out / STATE_FILE
    if state_path.is_file():
        state = read_record(state_path, _STATE_FIELDS)
        if state.get("key") != key:
            raise StoreError(f"{out}: holds a consensus of other inputs or options; "
                             "choose a new --out (nothing was changed)")
        return state
    if any(out.iterdir()):
        raise StoreError(f"{out}: not empty and not a consensus output; choose a new --out")
    return None


def run_consensus(teacher_dirs: list[str], out: str | os.PathLike,
                  fit_rows: int = DEFAULT_FIT_ROWS, whiten: str = "none", tol: float = 1e-10,
                  max_iter: int = 500, device: str | None = None) -> dict:
    """The whole pass (module docstring); returns what consensus.json holds."""
    if fit_rows < 2:
        raise StoreError(f"--fit-rows {fit_rows}: expected at least 2")
    inp = check_inputs(teacher_dirs)
    out = Path(out).absolute()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    stats = [[(i.path, i.file_size, i.mtime_ns) for i in t] for t in inp.chunks]
    key = sha256_json({"kind": "consensus-v1", "inputs": stats, "fit_rows": fit_rows,
                       "whiten": whiten, "tol": tol, "max_iter": max_iter})
    result_path = out / RESULT_FILE
    if result_path.is_file() and (done := read_record(result_path, _RESULT_FIELDS))["key"] == key:
        _say(f"{out}: already complete")
        return done
    state = _open_out(out, key)
    if state is None:  # the fit's peak memory, refused before OUT is made or anything held
        require_memory(fit_memory(len(inp.dirs), inp.dim, whiten, BLOCK_ROWS),
                       f"the consensus fit of {len(inp.dirs)} teachers of width {inp.dim:,}",
                       device)
    out.mkdir(parents=True, exist_ok=True)
    if state is None:
        _say(f"hashing {len(inp.dirs) * len(inp.names)} input chunks")
        hashes = [[sha256_file(i.path) for i in t] for t in inp.chunks]
        acc = accumulate(inp, fit_rows, device)
        fit = fit_gpa(acc, whiten, tol, max_iter)
        _say(f"fit: {fit.iterations} sweeps, converged {fit.converged}, residuals "
             + " ".join(f"{r:.4f}" for r in fit.relative_residuals))
        state = {"key": key, "hashes": hashes, "fit_rows_used": acc.rows, "done": {},
                 "rotations_sha256": save_rotations(out / ROTATIONS_FILE, fit),
                 "fit": {k: getattr(fit, k) for k in _FIT_FIELDS}}
        atomic_write_json(out / STATE_FILE, state)
    maps, bias = load_maps(out / ROTATIONS_FILE, len(inp.dirs), device)
    t0, done_rows = time.monotonic(), 0
    for c, name in enumerate(inp.names):
        if name not in state["done"]:  # a finished chunk is never redone
            state["done"][name] = apply_chunk(inp, c, maps, bias, out)
            atomic_write_json(out / STATE_FILE, state)
        done_rows += inp.rows[c]
        _say(f"apply {_eta(done_rows, inp.total, t0)}")
    result = _result(inp, state, fit_rows, whiten, tol, max_iter)
    atomic_write_json(result_path, result)
    return result


def load_maps(path: Path, k: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(kD, D) stacked W_i R_i and the (D,) bias -sum_i mean_i W_i R_i, float32."""
    from safetensors.torch import load_file

    t = load_file(str(path))
    maps = [t[f"whitener_{i}"] @ t[f"rotation_{i}"] for i in range(k)]
    bias = -sum(t[f"mean_{i}"] @ m for i, m in enumerate(maps))
    return torch.cat(maps, 0).float().to(device), bias.float().to(device)


def _result(inp: Inputs, state: dict, fit_rows: int, whiten: str, tol: float,
            max_iter: int) -> dict:
    teachers = [{"dir": d, "chunks": [{"name": n, "rows": i.rows, "bytes": i.file_size,
                                       "sha256": h} for n, i, h in zip(inp.names, t, hs, strict=True)]}
                for d, t, hs in zip(inp.dirs, inp.chunks, state["hashes"], strict=True)]
    return {"format": "aleph-consensus", "format_version": 1, "key": state["key"],
            "rows": inp.total, "dim": inp.dim, "dtype": "float16", "teachers": teachers,
            "fit": {"method": "generalized Procrustes (orthogonal), leave-one-out sweeps",
                    "rows_requested": fit_rows, "rows_used": state["fit_rows_used"],
                    "sample": "evenly spaced over all rows", "whiten": whiten, "tol": tol,
                    "max_iter": max_iter, "gauge": "consensus aligned with teacher 0",
                    **state["fit"]},
            "rotations": {"file": ROTATIONS_FILE, "sha256": state["rotations_sha256"]},
            "output": {"rule": "L2-normalise(sum_i (x_i - mean_i) @ W_i R_i) in float32, "
                       "then cast to float16",
                       "chunks": [{"name": n, "rows": r, "sha256": state["done"][n]}
                                  for n, r in zip(inp.names, inp.rows, strict=True)]}}


def stop_summary(signame: str, out: Path) -> str:
    """What a stopped consensus kept in OUT (read from its state file), for the stop line."""
    state = out / STATE_FILE
    if (out / RESULT_FILE).is_file():
        return f"stopped by {signame} after it completed: {out} is complete"
    if not state.is_file():
        return (f"stopped by {signame} before its fit was saved: nothing in {out} is kept "
                "(the fit starts again)")
    try:
        done = read_record(state, _STATE_FIELDS)["done"]
    except StoreError:
        return f"stopped by {signame}: {state} unreadable"
    return (f"stopped by {signame}: the fit and {len(done)} finished chunk(s) in {out} kept "
            "(a chunk being written is discarded, never counted)")
