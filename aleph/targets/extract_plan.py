"""The extraction's plan (`OUT/extract-plan.json`): written once, shared by every shard.

The plan pins what makes a chunk's bytes: the captions and their row count, the options
that change a row (column, max_length, chunk_rows, precision) and each teacher (a hub
commit or the sha256 of a local directory's files). It holds no shard count: chunk c is
the same bytes whichever process makes it, so any `--shard I/N` split gives the chunks of
one unsharded run.

Every shard computes the plan from its own arguments and publishes it with an exclusive
hard link (`atomic_write_bytes(replace=False)`): the first one writes it, every other one
(and every resume) must match it field for field, else it is refused in one line with
nothing touched. So a Slurm array starts its shards at once, with no separate plan step.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from aleph._io import atomic_write_bytes, read_json_record
from aleph.errors import StoreError
from aleph.targets.teachers import TeacherSpec

PLAN_FILE = "extract-plan.json"
RESULT_FILE = "extract.json"
_PLAN_MAX = 64 << 20


def chunk_path(out: Path, slug: str, c: int) -> Path:
    return out / slug / f"chunk_{c:05d}.npy"


def n_chunks(plan: dict) -> int:
    return math.ceil(plan["rows"] / plan["chunk_rows"])


def read_plan(path: Path) -> dict:
    """The plan object at `path` (no link followed, bounded); StoreError in one line else."""
    try:
        return read_json_record(path, _PLAN_MAX)
    except ValueError as e:
        raise StoreError(f"{path}: {e}; use a new --out") from None


def publish_plan(out: Path, plan: dict) -> bool:
    """Write the plan into OUT unless a shard already did (True when this call wrote it);
    an existing plan must equal `plan`. Refuses an OUT that holds anything else."""
    path = out / PLAN_FILE
    if out.exists() and not out.is_dir():
        raise StoreError(f"{out}: exists and is not a directory; choose a new --out")
    if not os.path.lexists(path):
        # another shard's plan on its way in (atomic_write_bytes' temporary name) is no stray
        stray = sorted(n for n in os.listdir(out) if not (
            n.startswith(f".{PLAN_FILE}.") and n.endswith(".tmp"))) if out.exists() else []
        if stray and not os.path.lexists(path):  # re-read: a shard may have just published it
            raise StoreError(f"{out}: not empty ({stray[0]}) and holds no {PLAN_FILE}; choose "
                             "a new --out")
        out.mkdir(parents=True, exist_ok=True)
        text = json.dumps(plan, indent=2, sort_keys=True) + "\n"
        try:
            atomic_write_bytes(path, text.encode(), replace=False)
            return True
        except FileExistsError:  # another shard published it first: check it below
            pass
    old = read_plan(path)
    if old != plan:
        diff = sorted(k for k in set(plan) | set(old) if old.get(k) != plan.get(k))
        raise StoreError(f"{path}: the run in {out} used other inputs or options "
                         f"({', '.join(diff)} differ); use a new --out or the same ones")
    return False


def missing_chunks(out: Path, plan: dict, slug: str, chunks=None) -> list[Path]:
    """The chunk files of teacher `slug` not (yet) in place, of `chunks` (default: all)."""
    wanted = range(n_chunks(plan)) if chunks is None else chunks
    return [p for c in wanted if not (p := chunk_path(out, slug, c)).is_file()]


def require_extracted(teacher_dirs: list[str]) -> None:
    """Before a consensus: every teacher directory that an extraction plan names (the plan
    in its parent directory) holds every chunk of that plan; StoreError naming the first
    missing chunk otherwise. Directories without a plan beside them are not checked here."""
    for d in teacher_dirs:
        parent, slug = os.path.split(os.path.abspath(d).rstrip(os.sep))
        path = Path(parent) / PLAN_FILE
        if not os.path.lexists(path):
            continue
        plan = read_plan(path)
        try:
            slugs = [TeacherSpec(t["name"], None, bool(t.get("local"))).slug
                     for t in plan["teachers"]]
            total = n_chunks(plan)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            raise StoreError(f"{path}: not an extraction plan (rows, chunk_rows, teachers "
                             "expected); use a new --out") from None
        if slug not in slugs:
            continue
        if missing := missing_chunks(Path(parent), plan, slug):
            raise StoreError(
                f"{d}: chunk {missing[0].name} of teacher {slug} is missing ({len(missing)} of "
                f"{total} missing): the extraction is not finished; run every `aleph targets "
                f"extract ... --shard I/N` to the end (chunk c is shard c mod N's), then the "
                "consensus (nothing was written)")
