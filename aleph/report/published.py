"""The published E1 figures, as reference rows (read from `published_e1.json`, with its source).

Only capability is published per run (and the per-task row for a1-s1); R@1, cos->target
and erank are published as ranges over all runs, so reference rows carry those ranges
as text and never pretend to a per-run value.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from aleph.errors import DataError

DATA = Path(__file__).with_name("published_e1.json")


@lru_cache(maxsize=1)
def load_published(path: Path = DATA) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot read the published E1 figures ({e})") from e
    for i, row in enumerate(data.get("runs", [])):
        for key in ("run", "arm", "seed", "capability"):
            if key not in row:
                raise DataError(f"{path}: runs[{i}] lacks field {key!r}")
    return data


def reference_rows() -> list[dict]:
    """One table row per published run, labelled as a reference (`kind: published`)."""
    data = load_published()
    ranges = data["ranges_all_runs"]
    return [
        {
            "run": f"E1 published {r['run']}", "kind": "published", "arm": r["arm"], "seed": r["seed"],
            "capability": r["capability"], "capability_dispatch_off": None, "toggle": None,
            "r_at_1": None, "r_at_1_text": ranges["r_at_1"], "r_at_1_batch_size": None,
            "cos_target": None, "cos_target_text": ranges["cos_target"],
            "erank": None, "erank_text": ranges["erank"], "dim": 768,
            "tasks": dict(r.get("tasks", {})),
        }
        for r in data["runs"]
    ]


def source() -> str:
    return load_published()["source"]
