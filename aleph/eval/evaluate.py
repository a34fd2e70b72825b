"""`aleph eval`: score one run's final weights and record the results in the run.

Writes `eval.json` (atomic) and the same figures as TensorBoard scalars under `eval/` in
`tb/`: one events file per evaluated step, replaced by a re-evaluation of that step.
eval.json records the weights' sha256 and a fingerprint of all evaluation data, so two
eval.json files are comparable exactly when their fingerprints agree; each task records
its pair counts, pairs sha256 and whether it is the E1 task (`not_e1_task` says why not).
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from aleph._io import atomic_write_json, sha256_bytes, sha256_file, sha256_json
from aleph.eval import rundir
from aleph.eval.capability import capability_with_toggle
from aleph.eval.encode import DEFAULT_BATCH, Progress, encode
from aleph.eval.probes import probe_all
from aleph.eval.tasks import E1_PAIRS, STSTask, e1_task_check

SCHEMA = 1
DEFAULT_PROBE_BATCH = 256  # R@1 candidates per batch; stated next to the figure


@dataclass(frozen=True)
class ProbeData:
    """Caption rows and their targets, for R@1, cos->target and erank (aleph.eval.probe_data
    says which rows each kind of run gets)."""

    texts: tuple[str, ...]
    targets: torch.Tensor  # (N, D) the teacher targets of `texts`, row for row
    source: str
    kind: str = "files"  # e1-hash-sample, smoke-held-out or files (given on the command line)
    seen_in_training: bool | None = None  # None: not known (explicit files from elsewhere)

    @property
    def fingerprint(self) -> str:
        t = self.targets.detach().to(torch.float16).contiguous().cpu()
        return sha256_json({"texts": list(self.texts), "targets": sha256_bytes(t.numpy().tobytes())})


def evaluate_model(model, tokenizer, max_len: int, tasks: list[STSTask], probe: ProbeData | None,
                   batch_size: int = DEFAULT_BATCH, probe_batch: int = DEFAULT_PROBE_BATCH,
                   device="cpu", say: Callable[[str], None] | None = None) -> dict:
    """All figures for one model: capability (with toggle for bank arms) and probes;
    `say` receives progress lines (per task, and while encoding long inputs)."""
    cfg = model.config
    cap = capability_with_toggle(model, tokenizer, tasks, max_len, cfg.is_bank, batch_size, device, say)
    result = {
        "arm": cfg.arm,
        "has_bank": cfg.is_bank,
        "capability": cap["mean"],
        "capability_dispatch_off": cap["mean_dispatch_off"],
        "toggle": cap["toggle"],
        "tasks": {
            t.name: {
                "spearman": cap["tasks"][t.name],
                "spearman_dispatch_off": (cap["tasks_dispatch_off"] or {}).get(t.name),
                "pairs": len(t.pairs), "source": t.source, "fingerprint": t.fingerprint,
                "sha256": t.sha256, "expected_pairs": E1_PAIRS.get(t.name),
                "e1_task": (why := e1_task_check(t)) is None, "not_e1_task": why,
            }
            for t in tasks
        },
        "probes": None,
        "max_len": max_len,
    }
    if probe is not None:
        model.set_dispatch(True)
        on_batch = Progress(say, "probes") if say is not None else None
        student = encode(model, tokenizer, list(probe.texts), max_len, batch_size, device, on_batch)  # (N, D)
        result["probes"] = {**probe_all(student, probe.targets.float(), probe_batch),
                            "source": probe.source, "fingerprint": probe.fingerprint,
                            "set": probe.kind, "seen_in_training": probe.seen_in_training}
        if say is not None:
            p = result["probes"]
            say(f"probes: {p['rows']:,} rows, R@1 {p['r_at_1']:.4f} (b={p['r_at_1_batch_size']}), "
                f"cos->target {p['cos_target']:.4f}, erank {p['erank']:.1f}/{p['dim']}")
    fps = {t.name: t.fingerprint for t in tasks}
    result["eval_data_fingerprint"] = sha256_json(
        {**fps, "probe": probe.fingerprint if probe is not None else None})
    return result


def record(run_dir: Path, result: dict, weights_file: Path, step: int) -> dict:
    """Add provenance, write eval.json atomically and the eval/ scalars to tb/."""
    manifest = rundir.read_run_json(run_dir, rundir.MANIFEST, required=False)
    shown = weights_file.relative_to(run_dir) if weights_file.is_relative_to(run_dir) else weights_file
    out = {
        "schema": SCHEMA,
        "run_id": rundir.run_label(run_dir, manifest),
        "seed": (manifest or {}).get("seed"),
        "weights": {"path": str(shown), "sha256": sha256_file(weights_file), "step": step},
        "evaluated_at": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **result,
    }
    atomic_write_json(run_dir / rundir.EVAL, out)
    write_scalars(run_dir / rundir.TB, out, step)
    return out


def scalars(result: dict) -> dict[str, float]:
    """The TensorBoard view of an eval result: tag -> value (None figures are left out)."""
    out = {"eval/capability": result["capability"]}
    if result.get("capability_dispatch_off") is not None:
        out["eval/capability_dispatch_off"] = result["capability_dispatch_off"]
        out["eval/toggle"] = result["toggle"]
    out.update({f"eval/sts/{name}": t["spearman"] for name, t in result["tasks"].items()})
    if probes := result.get("probes"):
        out[f"eval/r_at_1_b{probes['r_at_1_batch_size']}"] = probes["r_at_1"]
        out.update({"eval/cos_target": probes["cos_target"], "eval/erank": probes["erank"]})
    return out


EVAL_SUFFIX = ".aleph-eval-step"


def write_scalars(tb_dir: Path, result: dict, step: int) -> Path:
    """Write the eval/ scalars of `step` as one events file in `tb_dir`, replacing the
    file an earlier evaluation of the same step wrote (files of other steps are kept)."""
    # Deferred import: torch.utils.tensorboard pulls in tensorboard, only needed here.
    from torch.utils.tensorboard import SummaryWriter

    tb_dir = Path(tb_dir)
    tb_dir.mkdir(parents=True, exist_ok=True)
    suffix = f"{EVAL_SUFFIX}{step}"
    old = [p for p in tb_dir.iterdir() if p.is_file() and p.name.endswith(suffix)]
    tmp = Path(tempfile.mkdtemp(prefix=".eval-", dir=tb_dir))  # TensorBoard skips dot directories
    try:
        writer = SummaryWriter(log_dir=str(tmp), filename_suffix=suffix)
        try:
            for tag, value in scalars(result).items():
                writer.add_scalar(tag, float(value), global_step=step)
        finally:
            writer.close()
        (written,) = [p for p in tmp.iterdir() if p.name.endswith(suffix)]
        final = tb_dir / written.name
        os.replace(written, final)  # complete before it appears; then the old file goes
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for p in old:
        if p != final:
            p.unlink(missing_ok=True)
    return final
