"""Loop pieces in-process: data order, schedule, finite checks, checkpoint completeness."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aleph.model import ModelConfig, build_model
from aleph.train import checkpoint as ckpt
from aleph.train.config import resolve
from aleph.train.distributed import World
from aleph.train.loop import (
    DataOrder,
    NonFiniteError,
    lr_factor,
    make_optimizer,
    make_scheduler,
    train_step,
)


def test_data_order_is_a_function_of_seed_and_epoch_and_shards_by_rank():
    a, b = DataOrder(7, 100, 20), DataOrder(7, 100, 20)
    assert a.steps_per_epoch == 5
    assert np.array_equal(a.permutation(1), b.permutation(1))
    assert not np.array_equal(a.permutation(0), a.permutation(1))
    assert sorted(a.permutation(2)) == list(range(100))
    whole = a.indices(1, 3, World())
    halves = [a.indices(1, 3, World(rank=r, size=2)) for r in (0, 1)]
    assert np.array_equal(np.concatenate(halves), whole)  # rank order = global batch order
    epoch = np.concatenate([a.indices(0, i, World()) for i in range(5)])
    assert sorted(epoch) == list(range(100))  # each row once per epoch
    with pytest.raises(Exception, match="batch_size"):
        DataOrder(0, 10, 11)


def test_schedule_warmup_then_cosine():
    f = [lr_factor(s, 10, 110, 0.1) for s in range(111)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0) and f[60] == pytest.approx(0.55)
    assert f[110] == pytest.approx(0.1)
    assert all(x >= y for x, y in zip(f[10:], f[11:], strict=False))


def _tiny():
    cfg = resolve("smoke", arm="a2_dense")
    torch.manual_seed(0)
    model = build_model(ModelConfig(arm="a2_dense", vocab_size=50, max_len=8, d_model=16,
                                    n_layers=1, n_heads=2, ffn_dense=32))
    opt = make_optimizer(model, cfg)
    return cfg, model, opt, make_scheduler(opt, cfg, 10)


def test_nonfinite_loss_stops_before_the_update():
    cfg, model, opt, sched = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids, mask = torch.randint(5, 50, (4, 8)), torch.ones(4, 8, dtype=torch.bool)
    target = torch.full((4, 768), float("nan"))
    with pytest.raises(NonFiniteError, match="step 7: loss is nan"):
        train_step(model, opt, sched, ids, mask, target, cfg, World(), 6, torch.device("cpu"))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    good = torch.nn.functional.normalize(torch.randn(4, 768), dim=-1)
    res = train_step(model, opt, sched, ids, mask, good, cfg, World(), 0, torch.device("cpu"))
    assert np.isfinite(res.loss) and res.grad_norm > 0
    assert not all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_only_complete_checkpoints_count_and_two_are_kept(tmp_path):
    cfg, model, opt, sched = _tiny()
    for step in (3, 6, 9):
        pos = ckpt.Position(step, 0, step, step * 4, 1.0)
        ckpt.save(tmp_path, model, opt, sched, pos, [ckpt.rng_state()], "h", keep=2)
    assert [p.name for p in ckpt.complete_steps(tmp_path)] == ["step-00000006", "step-00000009"]
    torn = ckpt.step_dir(tmp_path, 12)
    torn.mkdir()
    (torn / "meta.json").write_text("{}")  # a killed save: no COMPLETE marker
    path, meta = ckpt.latest(tmp_path)
    assert meta["step"] == 9 and path.name == "step-00000009"
    assert ckpt.remove_incomplete(tmp_path) == ["step-00000012"]
    pos, rngs, _ = ckpt.load(path, model, opt, sched)
    assert pos.samples_seen == 36 and len(rngs) == 1


def test_eta_format_does_not_wrap_at_a_day():
    from aleph.train.fit import fmt_duration

    assert fmt_duration(59.6) == "00:01:00"
    assert fmt_duration(3 * 86400 + 3723) == "3d 01:02:03"


def test_nonfinite_gradient_stops_before_the_update():
    cfg, model, opt, sched = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    next(model.parameters()).register_hook(lambda g: g * float("inf"))  # finite loss, inf grad
    ids, mask = torch.randint(5, 50, (4, 8)), torch.ones(4, 8, dtype=torch.bool)
    good = torch.nn.functional.normalize(torch.randn(4, 768), dim=-1)
    with pytest.raises(NonFiniteError, match=r"step 3: gradient norm is (inf|nan) \(loss \d"):
        train_step(model, opt, sched, ids, mask, good, cfg, World(), 2, torch.device("cpu"))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
