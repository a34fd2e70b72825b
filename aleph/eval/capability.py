"""Capability: unweighted mean Spearman over STS tasks, with dispatch on and off.

For each pair the score is the cosine of the two embeddings (no task tuning); a task's
figure is Spearman(cosine, gold). For bank arms the same is measured with dispatch off
(trunk FFN only), and the toggle is off minus on: how much of the capability the
dispatched experts carry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext

import numpy as np

from aleph.errors import DataError
from aleph.eval.encode import DEFAULT_BATCH, Progress, encode
from aleph.eval.sts import pair_cosines, spearman
from aleph.eval.tasks import STSTask

Say = Callable[[str], None]


def task_spearman(model, tokenizer, task: STSTask, max_len: int, batch_size: int, device,
                  say: Say | None = None, label: str = "") -> float:
    a, b = [p[0] for p in task.pairs], [p[1] for p in task.pairs]
    gold = np.array([p[2] for p in task.pairs])  # (N,)
    on_batch = Progress(say, f"{label}{task.name}") if say is not None else None
    emb = encode(model, tokenizer, a + b, max_len, batch_size, device, on_batch)  # (2N, D)
    cos = pair_cosines(emb[: len(a)], emb[len(a) :])  # (N,)
    try:
        return spearman(cos, gold)
    except DataError as e:  # e.g. a collapsed model giving every pair the same cosine
        raise DataError(f"STS task {task.name!r} ({task.source}): {e}") from e


def capability(model, tokenizer, tasks: Sequence[STSTask], max_len: int,
               batch_size: int = DEFAULT_BATCH, device="cpu", say: Say | None = None,
               label: str = "") -> dict:
    """{"tasks": {name: rho}, "mean": unweighted mean over the tasks}; with `say`, one line
    per task (and encoding progress for long ones)."""
    per_task = {}
    for i, t in enumerate(tasks, 1):
        start = time.monotonic()
        per_task[t.name] = task_spearman(model, tokenizer, t, max_len, batch_size, device, say, label)
        if say is not None:
            say(f"{label}task {i}/{len(tasks)} {t.name}: {len(t.pairs):,} pairs, Spearman "
                f"{per_task[t.name]:.4f} ({time.monotonic() - start:.1f} s)")
    return {"tasks": per_task, "mean": float(np.mean(list(per_task.values())))}


@contextmanager
def dispatch(model, on: bool):
    """Temporarily set the bank's dispatch; always restores it to on."""
    model.set_dispatch(on)
    try:
        yield model
    finally:
        model.set_dispatch(True)


def capability_with_toggle(model, tokenizer, tasks: Sequence[STSTask], max_len: int,
                           has_bank: bool, batch_size: int = DEFAULT_BATCH, device="cpu",
                           say: Say | None = None) -> dict:
    """Capability with dispatch on; for bank arms also off and the toggle (off - on)."""
    with dispatch(model, True) if has_bank else nullcontext():  # a dense model has no bank
        on = capability(model, tokenizer, tasks, max_len, batch_size, device, say,
                        "dispatch on: " if has_bank else "")
    result = {"tasks": on["tasks"], "mean": on["mean"],
              "tasks_dispatch_off": None, "mean_dispatch_off": None, "toggle": None}
    if has_bank:
        with dispatch(model, False):
            off = capability(model, tokenizer, tasks, max_len, batch_size, device, say, "dispatch off: ")
        result.update(tasks_dispatch_off=off["tasks"], mean_dispatch_off=off["mean"],
                      toggle=off["mean"] - on["mean"])
    return result
