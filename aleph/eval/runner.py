"""Evaluate a run directory end to end: load its weights and tokenizer, score, record."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

from aleph.env.hostinfo import pick_device
from aleph.errors import DataError
from aleph.eval import rundir
from aleph.eval.evaluate import DEFAULT_PROBE_BATCH, evaluate_model, record
from aleph.eval.probe_data import DEFAULT_ROWS, probe_for_run
from aleph.eval.tasks import E1_PAIRS, e1_task_check, load_tasks, parse_task_names


def weights_step(run_dir: Path, weights_dir: Path) -> int:
    """The training step the weights belong to, for the TensorBoard x axis: from the
    directory name (weights/step-NNNNNNNN), else the run's last step (metrics.json)."""
    if match := re.fullmatch(r"step-(\d+)", weights_dir.name):
        return int(match.group(1))
    step = (rundir.read_run_json(run_dir, rundir.METRICS, required=False) or {}).get("step")
    return step if isinstance(step, int) else 0


def default_tasks(config: dict) -> list[str]:
    """Smoke runs are judged on the offline smoke task set, real runs on the 8 E1 tasks."""
    return parse_task_names("smoke" if config.get("smoke_data") else "e1")


def require_trained(run_dir: Path, config: dict) -> None:
    """Without --weights, the run must be trained to the end: an incomplete run is an error
    saying how to resume it, and which saved step `--weights` could evaluate instead."""
    state = rundir.run_state(run_dir)
    if state["status"] == "complete":
        return
    launch = state["last_launch"] or {}
    at = f" at step {state['step']}" + (f" of {state['total_steps']}" if state["total_steps"] else "") \
        if state["step"] is not None else ""
    how = (f"last launch {launch.get('launch_id')} {state['status']}{at}" if launch
           else "no launch recorded in manifest.json")
    cmd = (f"aleph train --arm {shlex.quote(str(config.get('arm', '<arm>')))} --seed "
           f"{shlex.quote(str(config.get('seed', '<seed>')))} --preset "
           f"{shlex.quote(str(config.get('preset', '<preset>')))} (with the run's other options)")
    todo = ("wait for it to finish" if state["status"] == "running"
            else f"resume it with the command that started it, e.g. `{cmd}`")
    saved = rundir.step_weights(run_dir)
    again = shlex.join(["aleph", "eval", str(run_dir), "--weights", str(saved[-1])]) if saved else ""
    alt = (f"or evaluate a saved step with `{again}`" if saved
           else "no weights/step-N is saved yet to evaluate with --weights")
    missing = "" if state["final_weights"] else f"; no {rundir.FINAL_WEIGHTS}"
    raise DataError(f"{run_dir}: training is incomplete ({how}{missing}): {todo}, {alt}")


def tokenizer_record(config: dict, tok_dir: Path, tokenizer) -> dict:
    """What eval.json says of the run's tokenizer: name, pinned commit, fingerprint, each
    file's sha256, and whether it equals the offline bundle's copy (None: no bundle copy)."""
    from aleph.data.bundle import TOKENIZER_PINS, read_manifest, tokenizer_files
    from aleph.data.tokenizer import tokenizer_fingerprint

    name = config.get("tokenizer") or ("smoke data tokenizer" if config.get("smoke_data") else "")
    fp = tokenizer_fingerprint(tokenizer)
    try:
        bundled = ((read_manifest() or {}).get("tokenizers") or {}).get(name)
    except DataError:
        bundled = None  # a broken bundle vouches for nothing
    match = None if not isinstance(bundled, dict) else bundled.get("fingerprint") == fp
    return {"name": name, "pinned_revision": TOKENIZER_PINS.get(name), "fingerprint": fp,
            "files": tokenizer_files(tok_dir), "same_as_bundle": match}


def run_eval(run_dir: str | Path, task_names: list[str] | None, tasks_dir: str | None = None,
             weights_dir: str | None = None, probe_captions: str | None = None,
             probe_targets: str | None = None, probe_rows: int = DEFAULT_ROWS,
             probe_batch: int = DEFAULT_PROBE_BATCH, batch_size: int = 128,
             device: str = "auto", probes: bool = True,
             say: Callable[[str], None] | None = None) -> dict:
    """Evaluate `run_dir` (its final weights, or `weights_dir`); `say` gets progress lines."""
    from aleph.data import load_tokenizer
    from aleph.model.io import WEIGHTS, load_model

    run_dir = rundir.require_run_dir(run_dir)
    config = rundir.read_run_json(run_dir, rundir.CONFIG)
    if weights_dir is None:
        require_trained(run_dir, config)
    wdir = Path(weights_dir) if weights_dir else run_dir / rundir.FINAL_WEIGHTS
    tok_dir = run_dir / rundir.TOKENIZER
    if not tok_dir.is_dir():
        raise DataError(f"{tok_dir}: missing (a run directory keeps the tokenizer it trained with)")
    tasks = load_tasks(task_names or default_tasks(config), tasks_dir)  # before the model: fail fast on bad task data
    for t in tasks if say is not None else ():
        if t.name in E1_PAIRS and (why := e1_task_check(t)) is not None:
            say(f"task {t.name}: not the E1 task: {why}")
    probe, no_probe = (probe_for_run(config, probe_captions, probe_targets, probe_rows, run_dir)
                       if probes else (None, "--no-probes"))
    if probe is not None and probe.kind == "e1-hash-sample" and len(probe.texts) < probe_batch:
        # a default set too small for one R@1 batch is skipped, not an error the user never asked for
        probe, no_probe = None, (f"the run's captions give only {len(probe.texts):,} probe rows, "
                                 f"fewer than one R@1 batch ({probe_batch})")
    dev = str(pick_device(device, "--device"))
    model = load_model(wdir, device=dev)
    tokenizer = load_tokenizer(tok_dir)
    max_len = config.get("max_len", model.config.max_len)
    if not isinstance(max_len, int) or max_len < 1:
        raise DataError(f"{run_dir / rundir.CONFIG}: field 'max_len' must be a positive integer")
    if say is not None:
        n_probe = f", probes on {len(probe.texts):,} rows" if probe is not None else ""
        say(f"evaluating {run_dir} ({wdir}) on {dev}: {len(tasks)} task(s){n_probe}")
    result = evaluate_model(model, tokenizer, max_len, tasks, probe, batch_size, probe_batch, dev, say)
    result.update(device=dev, probes_skipped=None if probe is not None else no_probe,
                  tokenizer=tokenizer_record(config, tok_dir, tokenizer))
    return record(run_dir, result, wdir / WEIGHTS, weights_step(run_dir, wdir))
