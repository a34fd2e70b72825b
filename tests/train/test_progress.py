"""aleph.train.progress: every value of a step goes out under its own name, so a new loss term
needs no change in the reporter (TensorBoard, metrics.json, the console line)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from aleph.train.config import resolve
from aleph.train.progress import Reporter
from aleph.train.step import StepResult
from aleph.train.trainer import step_trainer
from tests.train.conftest import tb_scalars, tiny_trainer


def test_a_new_term_reaches_tensorboard_metrics_and_the_progress_line(tmp_path):
    cfg = resolve("smoke", arm="a2_dense", overrides=["log_every_steps=2"])
    t = step_trainer(cfg, tiny_trainer()[1], total_steps=4, rows=256)
    lines = []
    t.run_dir, t.log, t.tokens = tmp_path, lines.append, SimpleNamespace(rows=256)
    rep = Reporter(t, 0)
    try:
        for step in (1, 2):
            values = {"loss": 2.5 / step, "nce": 2.0, "mse": 0.25, "cos": 0.125 * step,
                      "grad_norm": 0.5}
            rep.after_step(StepResult(values, 1e-3, step))
    finally:
        rep.close()
    scalars = tb_scalars(tmp_path)
    assert scalars["train/cos"] == [(2, 0.25)] and scalars["train/loss"] == [(2, 1.25)]
    assert {"train/nce", "train/mse", "train/grad_norm", "train/lr"} <= set(scalars)
    final = json.loads((tmp_path / "metrics.json").read_text())["final"]
    assert final == {"loss": 1.25, "nce": 2.0, "mse": 0.25, "cos": 0.25, "grad_norm": 0.5,
                     "lr": 1e-3}
    assert "loss 2.5000 (nce 2 mse 0.25 cos 0.125) lr 0.001" in lines[0]
