"""The E1 results table for a set of runs, read only from each run's eval.json.

Every row has a basis (A, B, ...): runs share one when trained with the same config (arm
and seed aside), evaluated on the same task set and the same weights; the legend says how
each basis differs from A. Runs of one arm and basis with at least two seeds get mean and
spread rows; different bases are never averaged, and published rows (basis P) never enter
them. Each run's `vs P` cell is its judgement against E1 (`aleph.report.comparability`).
"""

from __future__ import annotations

import math
import os
import re
import shlex
import statistics
from pathlib import Path

from aleph._io import sha256_json, short_repr
from aleph.errors import DataError
from aleph.eval import rundir
from aleph.eval.tasks import DISPLAY, E1_TASKS
from aleph.report import comparability, published
from aleph.train.config import OPERATIONAL

NUMERIC = ("capability", "capability_dispatch_off", "toggle", "r_at_1", "cos_target", "erank")
PROBE_KEYS = ("r_at_1", "cos_target", "erank")
# config.json fields that do not define the basis: declared at each field (train/config.py, knob)
PUBLISHED_BASIS = "P"


def _weights(weights: dict) -> str:
    """"final" or "step N": which weights eval.json scored (an eval.json without a path: final)."""
    path = str(weights.get("path") or "weights/final/")
    if Path(path).parent.name == "final" or path.startswith("weights/final"):
        return "final"
    match = re.search(r"step-(\d+)", path)
    return f"step {int(match.group(1)) if match else short_repr(weights.get('step'), 20)}"


NONE = type(None)


def _number(data: dict, dotted: str, src: str, required: bool = False, kind=(int, float)):
    """A number of eval.json the table formats: finite, never a bool; None when absent or
    null unless `required`; else one line naming the file and field."""
    value = rundir.field(data, dotted, src, **({} if required else {"default": None}),
                         kind=kind if required else (*kind, NONE))
    if isinstance(value, bool):
        raise DataError(f"{src}: field {dotted!r} has type bool")
    if isinstance(value, float) and not math.isfinite(value):
        raise DataError(f"{src}: field {dotted!r} is {value}, expected a finite number")
    return value


def _not_evaluated(run_dir: Path) -> str:
    """Why `run_dir` has no eval.json, and the command that gives it one."""
    state, ref = rundir.run_state(run_dir), shlex.quote(str(run_dir))
    if state["status"] == "complete":
        return f"{run_dir}: trained but not evaluated (no eval.json): run `aleph eval {ref}` first"
    at = f" at step {state['step']}" if state["step"] is not None else ""
    return (f"{run_dir}: not evaluated (no eval.json) and its training is {state['status']}{at}: "
            f"finish it, or `aleph eval {ref} --weights {shlex.quote(str(rundir.RunLayout(run_dir).weights))}/step-N` "
            "for a saved step")


def row_from_eval(run_dir: Path) -> dict:
    """One table row from `run_dir/eval.json` (missing: an error saying how to make it)."""
    run_dir = Path(run_dir)
    if not (run_dir / rundir.EVAL).is_file() and (run_dir / rundir.CONFIG).is_file():
        raise DataError(_not_evaluated(run_dir))
    ev = rundir.read_run_json(run_dir, rundir.EVAL)
    src = str(run_dir / rundir.EVAL)
    probes = rundir.field(ev, "probes", src, default=None, kind=(dict, NONE)) or {}
    weights = rundir.field(ev, "weights", src, default=None, kind=(dict, NONE)) or {}
    tasks = rundir.field(ev, "tasks", src, kind=dict)
    num = {k: _number(ev, k, src) for k in ("capability_dispatch_off", "toggle")}
    num |= {k: _number(ev, f"probes.{k}", src) for k in PROBE_KEYS}
    num |= {k: _number(ev, f"probes.{k}", src, kind=(int,)) for k in ("r_at_1_batch_size", "dim")}
    raw = rundir.read_run_json(run_dir, rundir.CONFIG, required=False)
    config = None if raw is None else {k: v for k, v in raw.items() if k not in OPERATIONAL}
    vs_e1 = comparability.judge(raw, ev, rundir.read_run_json(run_dir, rundir.MANIFEST,
                                                              required=False))
    return {
        "run": rundir.field(ev, "run_id", src, kind=str), "kind": "run",
        "arm": rundir.field(ev, "arm", src, kind=str), "seed": ev.get("seed"),
        "capability": _number(ev, "capability", src, required=True), **num,
        "tasks": {name: _number(t, "spearman", f"{src} tasks.{name}", required=True)
                  for name, t in tasks.items()},
        "eval_data_fingerprint": ev.get("eval_data_fingerprint"),
        "weights_sha256": weights.get("sha256"),
        "weights": _weights(weights),
        "task_set": sorted(tasks),
        "tasks_fingerprint": sha256_json({n: (t.get("fingerprint") if isinstance(t, dict) else None)
                                          for n, t in tasks.items()}),
        "probe_fingerprint": probes.get("fingerprint"),
        "config": config,
        "config_sha256": None if config is None else sha256_json(config),
        "preset": (config or {}).get("preset"),
        "vs_e1": vs_e1, "comparable": vs_e1["comparable"],
        "not_e1_tasks": [n for n in E1_TASKS if n in tasks and comparability.task_problem(n, tasks[n])],
        "probe_set": probes.get("set"), "probe_seen": probes.get("seen_in_training"),
        "probe_source": probes.get("source"),
    }


def assign_bases(rows: list[dict]) -> list[dict]:
    """Give each run row (`rows` holds only those) its basis letter; return the legend
    entries, first seen first."""
    keys: dict[tuple, dict] = {}
    for r in rows:
        key = (r["config_sha256"], r["tasks_fingerprint"], r["weights"])
        if key not in keys:
            letter = chr(ord("A") + len(keys)) if len(keys) < 26 else f"Z{len(keys) - 25}"
            keys[key] = {"basis": letter, "config": r["config"], "config_sha256": r["config_sha256"],
                         "preset": r["preset"], "task_set": r["task_set"], "weights": r["weights"],
                         "vs_e1": [], "probes": []}
        r["basis"] = keys[key]["basis"]
        for name, value in (("vs_e1", r["vs_e1"]["text"]), ("probes", _probe_text(r))):
            if value is not None and value not in keys[key][name]:
                keys[key][name].append(value)
    return list(keys.values())


def _config_delta(cfg: dict | None, ref: dict | None) -> str:
    if cfg == ref:
        return "same config as A"
    if cfg is None or ref is None:
        return "config.json missing" if cfg is None else "config differs (A has no config.json)"
    keys = sorted(set(cfg) | set(ref))
    diff = [f"{k}={cfg.get(k)!r} (A: {ref.get(k)!r})" for k in keys if cfg.get(k) != ref.get(k)]
    return "config differs from A: " + ", ".join(diff[:6]) + (f" and {len(diff) - 6} more" if len(diff) > 6 else "")


def legend(bases: list[dict], with_published: bool) -> list[str]:
    """One line per basis: its config, task set and weights (differences named against A)."""
    lines = []
    for i, b in enumerate(bases):
        tasks = b["task_set"]
        shown = ", ".join(tasks) if len(tasks) <= 8 else ", ".join(tasks[:8]) + ", ..."
        if b["config_sha256"] is None:
            cfg = "no config.json"
        else:
            preset = f"preset {b['preset']}, " if b["preset"] else ""
            cfg = f"config {preset}sha256 {b['config_sha256'][:12]}"
            if i:
                cfg += f"; {_config_delta(b['config'], bases[0]['config'])}"
        line = f"basis {b['basis']}: {len(tasks)} task(s) ({shown}); {b['weights']} weights; {cfg}"
        line += "; vs E1: " + " | ".join(b.get("vs_e1") or ["not judged"])
        if b.get("probes"):
            line += "; probes: " + " | ".join(b["probes"])
        lines.append(line)
    if with_published:
        lines.append(f"basis {PUBLISHED_BASIS}: the published E1 runs (8 E1 STS tasks, final weights, "
                     "E1's own config and evaluation)")
    return lines


SEEN = {True: "seen in training", False: "held out", None: "not known whether trained on"}


def _probe_text(row: dict) -> str | None:
    """'<set> (seen in training)' of a probed run row, else None."""
    if row.get("r_at_1") is None:
        return None
    return f"{row.get('probe_set') or 'unrecorded set'} ({SEEN.get(row.get('probe_seen'), 'not known')})"


def arm_summaries(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """Mean and spread rows per arm and basis with >= 2 seeds (replicated runs only), and a
    note for each arm whose runs sit on more than one basis (those are not averaged)."""
    out, notes = [], []
    arms = sorted({r["arm"] for r in rows if r["kind"] == "run"})
    for arm in arms:
        runs = [r for r in rows if r["kind"] == "run" and r["arm"] == arm]
        bases = list(dict.fromkeys(r["basis"] for r in runs))
        if len(bases) > 1:
            notes.append(f"{arm}: runs on bases {', '.join(bases)} are not averaged together "
                         "(a mean row covers one basis)")
        for basis in bases:
            group = [r for r in runs if r["basis"] == basis]
            if len({r["seed"] for r in group}) >= 2:  # one seed (or replicates of it): no spread
                out += _summarise(arm, basis, group, len(bases) > 1)
    return out, notes


def _summarise(arm: str, basis: str, group: list[dict], name_basis: bool) -> list[dict]:
    seeds = ",".join(str(r["seed"]) for r in group)
    on = f"basis {basis}, " if name_basis else ""
    mean = {"run": f"{arm} mean ({on}n={len(group)}, seeds {seeds})", "kind": "mean", "arm": arm,
            "basis": basis}
    sd = {"run": f"{arm} spread ({on}sd, n={len(group)})", "kind": "spread", "arm": arm, "basis": basis}
    for key in NUMERIC:
        vals = [r[key] for r in group if r.get(key) is not None]
        mean[key] = statistics.fmean(vals) if len(vals) == len(group) else None
        sd[key] = statistics.stdev(vals) if len(vals) == len(group) else None
    probed = [r for r in group if r.get("r_at_1") is not None]
    batches = {r.get("r_at_1_batch_size") for r in probed}
    mean["r_at_1_batch_size"] = sd["r_at_1_batch_size"] = next(iter(batches)) if len(batches) == 1 else None
    why = None
    if len(probed) < len(group):
        why = f"— (not probed: {len(group) - len(probed)} of {len(group)} runs)"
    elif len(batches) > 1:
        # R@1 depends on the number of in-batch candidates: figures measured with
        # different batch sizes are not samples of one quantity, so no mean or spread.
        why = "— (R@1 batch sizes differ)"
    elif len({r.get("probe_fingerprint") for r in probed}) > 1:
        why = "— (probe sets differ)"
    if why is not None:
        for key in PROBE_KEYS:
            mean[key] = sd[key] = None
            mean[f"{key}_text"] = sd[f"{key}_text"] = why if key == "r_at_1" else MISSING_TEXT
    worst = next((r for r in group if not r["comparable"]), group[0])
    for row in (mean, sd):
        row.update(dim=group[0].get("dim"), comparable=worst["comparable"], vs_e1=worst["vs_e1"])
    names = set.intersection(*(set(r["tasks"]) for r in group))
    mean["tasks"] = {n: statistics.fmean(r["tasks"][n] for r in group) for n in names}
    sd["tasks"] = {n: statistics.stdev(r["tasks"][n] for r in group) for n in names}
    return [mean, sd]


MISSING_TEXT = "—"


def build(run_dirs: list[Path], with_published: bool = False) -> dict:
    """All rows (runs, per-arm-and-basis mean/spread, optional published references), the
    basis legend and notes."""
    rows = [row_from_eval(Path(d)) for d in run_dirs]
    _disambiguate(rows, [Path(d) for d in run_dirs])
    bases = assign_bases(rows)
    notes = []
    if len({r["probe_fingerprint"] for r in rows if r.get("r_at_1") is not None}) > 1:
        notes.append("probe rows differ between runs (probes.fingerprint): R@1, cos->target and "
                     "erank of those runs are not comparable")
    summaries, arm_notes = arm_summaries(rows)
    rows += summaries
    notes += arm_notes
    if with_published:
        rows += [{**r, "basis": PUBLISHED_BASIS} for r in published.reference_rows()]
        notes.append(f"published rows: {published.source()}")
    return {"rows": rows, "task_names": task_names(rows), "notes": notes,
            "legend": legend(bases, with_published)}


def _disambiguate(rows: list[dict], dirs: list[Path]) -> None:
    """Runs sharing a run id (one arm and seed under two work roots) get their paths as labels."""
    labels = [r["run"] for r in rows]
    for label in set(labels):
        if len(idx := [i for i, x in enumerate(labels) if x == label]) < 2:
            continue
        paths = [dirs[i].resolve() for i in idx]
        common = Path(os.path.commonpath(paths))
        for i, path in zip(idx, paths, strict=True):
            rows[i]["run"] = f"{label} ({path.relative_to(common)})"


def task_names(rows: list[dict]) -> list[str]:
    """E1 order first, then any other task (smoke, local files) in first-seen order."""
    seen = list(dict.fromkeys(n for r in rows for n in r.get("tasks", {})))
    return [n for n in E1_TASKS if n in seen] + [n for n in seen if n not in E1_TASKS]


def task_label(name: str) -> str:
    return DISPLAY.get(name, name)
