"""The E1 results table for a set of runs, read only from each run's eval.json.

Two tables: the summary (run, mean, dispatch OFF, toggle, R@1, cos->target, erank/768)
and the per-task Spearman. Runs of the same arm with at least two seeds get a mean row
and a spread row (sample standard deviation over the runs). Published reference rows,
when asked for, are appended and labelled as such; they never enter the mean/spread of
replicated runs.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from aleph.eval import rundir
from aleph.eval.tasks import DISPLAY, E1_TASKS
from aleph.report import published

NUMERIC = ("capability", "capability_dispatch_off", "toggle", "r_at_1", "cos_target", "erank")


def row_from_eval(run_dir: Path) -> dict:
    """One table row from `run_dir/eval.json` (an error names the file if it is missing)."""
    ev = rundir.read_run_json(run_dir, rundir.EVAL)
    src = str(Path(run_dir) / rundir.EVAL)
    probes = rundir.field(ev, "probes", src, default=None) or {}
    tasks = rundir.field(ev, "tasks", src, kind=dict)
    return {
        "run": rundir.field(ev, "run_id", src, kind=str), "kind": "run",
        "arm": rundir.field(ev, "arm", src, kind=str), "seed": ev.get("seed"),
        "capability": rundir.field(ev, "capability", src, kind=(int, float)),
        "capability_dispatch_off": ev.get("capability_dispatch_off"),
        "toggle": ev.get("toggle"),
        "r_at_1": probes.get("r_at_1"), "r_at_1_batch_size": probes.get("r_at_1_batch_size"),
        "cos_target": probes.get("cos_target"), "erank": probes.get("erank"),
        "dim": probes.get("dim"),
        "tasks": {name: rundir.field(t, "spearman", f"{src} tasks.{name}") for name, t in tasks.items()},
        "eval_data_fingerprint": ev.get("eval_data_fingerprint"),
        "weights_sha256": (ev.get("weights") or {}).get("sha256"),
    }


def arm_summaries(rows: list[dict]) -> list[dict]:
    """Mean and spread rows per arm with >= 2 runs (replicated runs only)."""
    out = []
    arms = sorted({r["arm"] for r in rows if r["kind"] == "run"})
    for arm in arms:
        group = [r for r in rows if r["kind"] == "run" and r["arm"] == arm]
        if len({r["seed"] for r in group}) < 2:
            continue  # one seed (or replicates of it): no spread across seeds to report
        seeds = ",".join(str(r["seed"]) for r in group)
        mean = {"run": f"{arm} mean (n={len(group)}, seeds {seeds})", "kind": "mean", "arm": arm}
        sd = {"run": f"{arm} spread (sd, n={len(group)})", "kind": "spread", "arm": arm}
        for key in NUMERIC:
            vals = [r[key] for r in group if r.get(key) is not None]
            mean[key] = statistics.fmean(vals) if len(vals) == len(group) else None
            sd[key] = statistics.stdev(vals) if len(vals) == len(group) else None
        batches = {r.get("r_at_1_batch_size") for r in group}
        mean["r_at_1_batch_size"] = sd["r_at_1_batch_size"] = next(iter(batches)) if len(batches) == 1 else None
        if len(batches) > 1:
            # R@1 depends on the number of in-batch candidates: figures measured with
            # different batch sizes are not samples of one quantity, so no mean or spread.
            mean["r_at_1"] = sd["r_at_1"] = None
            mean["r_at_1_text"] = sd["r_at_1_text"] = "— (R@1 batch sizes differ)"
        mean["dim"] = sd["dim"] = group[0].get("dim")
        names = set.intersection(*(set(r["tasks"]) for r in group))
        mean["tasks"] = {n: statistics.fmean(r["tasks"][n] for r in group) for n in names}
        sd["tasks"] = {n: statistics.stdev(r["tasks"][n] for r in group) for n in names}
        out += [mean, sd]
    return out


def build(run_dirs: list[Path], with_published: bool = False) -> dict:
    """All rows (runs, per-arm mean/spread, optional published references) and notes."""
    rows = [row_from_eval(Path(d)) for d in run_dirs]
    _disambiguate(rows, [Path(d) for d in run_dirs])
    notes = []
    fps = {r["eval_data_fingerprint"] for r in rows}
    if len(fps) > 1:
        notes.append("evaluation data differ between runs (eval_data_fingerprint): "
                     "compare figures across those runs with care")
    rows += arm_summaries(rows)
    if with_published:
        rows += published.reference_rows()
        notes.append(f"published rows: {published.source()}")
    return {"rows": rows, "task_names": task_names(rows), "notes": notes}


def _disambiguate(rows: list[dict], dirs: list[Path]) -> None:
    """Runs sharing a run id (one arm and seed under two work roots) get their paths as labels."""
    labels = [r["run"] for r in rows]
    for label in set(labels):
        idx = [i for i, x in enumerate(labels) if x == label]
        if len(idx) < 2:
            continue
        paths = [dirs[i].resolve() for i in idx]
        common = Path(os.path.commonpath(paths))
        for i, path in zip(idx, paths, strict=True):
            rows[i]["run"] = f"{label} ({path.relative_to(common)})"


def task_names(rows: list[dict]) -> list[str]:
    """E1 order first, then any other task (smoke, local files) in first-seen order."""
    seen: list[str] = []
    for r in rows:
        for n in r.get("tasks", {}):
            if n not in seen:
                seen.append(n)
    return [n for n in E1_TASKS if n in seen] + [n for n in seen if n not in E1_TASKS]


def task_label(name: str) -> str:
    return DISPLAY.get(name, name)
