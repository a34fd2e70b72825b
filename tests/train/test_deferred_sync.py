"""defer_step_sync (aleph.train.step.Steps): the same values as the checked-first step, read
one step late; a non-finite step is skipped by fused AdamW's found_inf and raised before the next
update. Run on CPU with torch 2.4's fused CPU AdamW, which takes found_inf like the CUDA one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from aleph.errors import NonFiniteError
from aleph.model import ModelConfig, build_model
from aleph.train.config import resolve
from aleph.train.optim import make_scheduler
from aleph.train.step import Steps, deferring, train_step
from aleph.train.trainer import step_trainer

STEPS = 6


def _trainer(defer: bool):
    cfg = dataclasses.replace(resolve("smoke", arm="a1_anchored"), defer_step_sync=defer,
                              dropout=0.0)
    torch.manual_seed(0)
    model = build_model(ModelConfig(arm="a1_anchored", vocab_size=50, max_len=8, d_model=16,
                                    n_layers=1, n_heads=2, ffn_expert=8, n_anchors=4, dropout=0.0))
    t = step_trainer(cfg, model, 10)
    # the fused kernel on both sides: the comparison is deferred vs checked-first only
    t.opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
    t.sched = make_scheduler(t.opt, cfg, 10)
    return t


def _batches():
    g = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        ids = torch.randint(5, 50, (4, 8), generator=g)
        target = torch.nn.functional.normalize(torch.randn(4, 768, generator=g), dim=-1)
        yield ids, None, target


def _advance(t):
    t.pos = dataclasses.replace(t.pos, step=t.pos.step + 1)


def test_deferred_steps_give_the_same_values_one_step_late():
    plain, deferred = _trainer(False), _trainer(True)
    assert not deferring(plain) and deferring(deferred)
    got_plain, got_deferred = [], []
    steps = Steps(deferred, got_deferred.append)
    for i, batch in enumerate(_batches()):
        got_plain.append(train_step(plain, batch))
        _advance(plain)
        steps(batch)
        _advance(deferred)
        steps.deliver()
        assert [r.step for r in got_deferred] == list(range(1, i + 1))  # one step late
    steps.settle()
    assert [r.step for r in got_plain] == [r.step for r in got_deferred] == list(range(1, STEPS + 1))
    assert [dataclasses.astuple(r) for r in got_plain] == [dataclasses.astuple(r) for r in got_deferred]
    for a, b in zip(plain.model.parameters(), deferred.model.parameters(), strict=True):
        assert torch.equal(a, b)
    steps.settle()
    assert len(got_deferred) == STEPS  # nothing left in flight


def test_a_non_finite_step_is_skipped_on_the_device_and_raised_before_the_next_update():
    t = _trainer(True)
    batches = list(_batches())
    got = []
    steps = Steps(t, got.append)
    steps(batches[0])
    _advance(t)
    before = [p.detach().clone() for p in t.model.parameters()]
    steps_before = [t.opt.state[p]["step"].clone() for p in t.model.parameters()]
    ids, mask, _ = batches[1]
    bad = torch.full((4, 768), float("nan"))
    steps((ids, mask, bad))
    steps.deliver()
    assert [r.step for r in got] == [1]  # step 2 is in flight, step 1 read fine
    _advance(t)
    # found_inf skipped step 2's update: weights and AdamW's step counters unchanged
    assert all(torch.equal(a, b) for a, b in zip(before, t.model.parameters(), strict=True))
    assert all(torch.equal(t.opt.state[p]["step"], s)
               for p, s in zip(t.model.parameters(), steps_before, strict=True))
    with pytest.raises(NonFiniteError, match=r"^step 2: loss is nan .*no update was made"):
        steps(batches[2])  # read before step 3's update
    assert all(torch.equal(a, b) for a, b in zip(before, t.model.parameters(), strict=True))
    assert all(p.grad is None for p in t.model.parameters())  # nothing left for a later step
    assert t.pos.step == 1  # set back to before step 2, which made no update


def test_a_non_finite_step_in_flight_is_never_exported_as_weights(tmp_path):
    """weights_every_steps: the export of step 2 first reads step 2 (in flight), so a NaN
    there raises before weights/step-2 (which would hold step 1's weights) is written."""
    from aleph.train.loop import Clock, after_step
    from aleph.train.signals import StopFlag

    t = _trainer(True)
    t.cfg = dataclasses.replace(t.cfg, weights_every_steps=2, ckpt_every_steps=0,
                                ckpt_every_minutes=0.0)
    t.run_dir, t.total_steps = tmp_path, 10
    batches = list(_batches())
    stop = StopFlag("flag")
    steps = Steps(t, lambda res: None)
    try:
        steps(batches[0])
        _advance(t)
        after_step(t, stop, Clock(0.0), steps.settle, logs=False)
        ids, mask, _ = batches[1]
        steps((ids, mask, torch.full((4, 768), float("nan"))))
        _advance(t)
        with pytest.raises(NonFiniteError, match="^step 2: loss is nan"):
            after_step(t, stop, Clock(0.0), steps.settle, logs=False)
    finally:
        stop.restore()
    assert not (tmp_path / "weights").exists() and t.pos.step == 1


def test_without_the_fused_optimiser_the_step_checks_first_as_before():
    t = _trainer(True)
    t.opt = torch.optim.AdamW(t.model.parameters(), lr=t.cfg.lr)  # CPU default: single-tensor
    t.sched = make_scheduler(t.opt, t.cfg, 10)
    assert not deferring(t)
    batch, got = next(_batches()), []
    steps = Steps(t, got.append)
    steps(batch)
    assert got == [] and steps.pending is None
    steps.deliver()
    assert [r.step for r in got] == [1]


def test_a_deferred_launch_logs_saves_and_ends_like_a_checked_first_one(train_work, monkeypatch):
    """Whole launches (in this process) with fused AdamW forced on CPU: with and without
    defer_step_sync, the same losses at the same logged steps, the same resume states and
    final weights; the deferred launch says it deferred."""
    from aleph.model.io import load_model
    from aleph.train import trainer as trainer_mod
    from aleph.train.identity import run_dir_for
    from aleph.train.optim import make_optimizer
    from aleph.train.run import train
    from tests.train.conftest import SMOKE_ROWS, tb_scalars

    def fused(model, cfg):
        opt = make_optimizer(model, cfg)
        for g in opt.param_groups:
            g["fused"], g["foreach"] = True, False
        return opt

    monkeypatch.setenv("ALEPH_WORK", str(train_work))
    monkeypatch.setattr(trainer_mod, "make_optimizer", fused)
    runs = {}
    for defer in (False, True):
        cfg = resolve("smoke", arm="a1_anchored", seed=7, overrides=[
            f"smoke_rows={SMOKE_ROWS}", "batch_size=64", "max_steps=7", "log_every_steps=3",
            "ckpt_every_steps=4", "dropout=0", f"defer_step_sync={str(defer).lower()}"])
        assert train(cfg, name=f"defer-{defer}") == 0
        runs[defer] = run_dir_for(cfg, f"defer-{defer}")
    log = next((runs[True] / "launches").glob("*.log")).read_text()
    assert "defer_step_sync: on: each step's loss and gradient norm are read during the next step" in log
    plain, deferred = tb_scalars(runs[False]), tb_scalars(runs[True])
    assert [s for s, _ in deferred["train/loss"]] == [s for s, _ in plain["train/loss"]] == [3, 6, 7]
    assert deferred["train/loss"] == plain["train/loss"]
    assert sorted(p.name for p in (runs[True] / "checkpoints").iterdir()) == \
        sorted(p.name for p in (runs[False] / "checkpoints").iterdir())
    a = load_model(runs[False] / "weights" / "final").state_dict()
    b = load_model(runs[True] / "weights" / "final").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
