"""`aleph eval`: score one run's final weights and record the results in the run.

Writes `eval.json` (atomic) and the same figures as TensorBoard scalars under `eval/`
in the run's `tb/`. eval.json records the sha256 of the weights file evaluated and a
fingerprint of all evaluation data (every task's pairs and the probe rows/targets), so
two eval.json files are comparable exactly when their fingerprints agree.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path

import torch

from aleph._io import atomic_write_json, sha256_bytes, sha256_file, sha256_json
from aleph.eval import rundir
from aleph.eval.capability import capability_with_toggle
from aleph.eval.encode import DEFAULT_BATCH, encode
from aleph.eval.probes import probe_all
from aleph.eval.tasks import STSTask

SCHEMA = 1
DEFAULT_PROBE_BATCH = 256  # R@1 candidates per batch; stated next to the figure


@dataclass(frozen=True)
class ProbeData:
    """Held-out caption rows and their targets, for R@1, cos->target and erank."""

    texts: tuple[str, ...]
    targets: torch.Tensor  # (N, D) the teacher targets of `texts`, row for row
    source: str

    @property
    def fingerprint(self) -> str:
        t = self.targets.detach().to(torch.float16).contiguous().cpu()
        return sha256_json({"texts": list(self.texts), "targets": sha256_bytes(t.numpy().tobytes())})


def evaluate_model(model, tokenizer, max_len: int, tasks: list[STSTask], probe: ProbeData | None,
                   batch_size: int = DEFAULT_BATCH, probe_batch: int = DEFAULT_PROBE_BATCH,
                   device="cpu") -> dict:
    """All figures for one model: capability (with toggle for bank arms) and probes."""
    cfg = model.config
    cap = capability_with_toggle(model, tokenizer, tasks, max_len, cfg.is_bank, batch_size, device)
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
            }
            for t in tasks
        },
        "probes": None,
        "max_len": max_len,
    }
    if probe is not None:
        model.set_dispatch(True)
        student = encode(model, tokenizer, list(probe.texts), max_len, batch_size, device)  # (N, D)
        result["probes"] = {**probe_all(student, probe.targets.float(), probe_batch),
                            "source": probe.source, "fingerprint": probe.fingerprint}
    fps = {t.name: t.fingerprint for t in tasks}
    fps["probe"] = probe.fingerprint if probe is not None else None
    result["eval_data_fingerprint"] = sha256_json(fps)
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
    for name, t in result["tasks"].items():
        out[f"eval/sts/{name}"] = t["spearman"]
    probes = result.get("probes")
    if probes:
        out[f"eval/r_at_1_b{probes['r_at_1_batch_size']}"] = probes["r_at_1"]
        out["eval/cos_target"] = probes["cos_target"]
        out["eval/erank"] = probes["erank"]
    return out


def write_scalars(tb_dir: Path, result: dict, step: int) -> None:
    # Deferred import: torch.utils.tensorboard pulls in tensorboard, only needed here.
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tb_dir))
    try:
        for tag, value in scalars(result).items():
            writer.add_scalar(tag, float(value), global_step=step)
    finally:
        writer.close()
