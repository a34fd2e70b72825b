"""A resume keeps the optimiser that make_optimizer builds for the device it runs on: the
saved param groups' `fused` flag (and the step counters' placement) must not come back
with the state. Checked both ways on CPU by faking the flags a CUDA state would carry."""

from __future__ import annotations

import torch

from aleph.record.layout import RunLayout
from aleph.train import checkpoint as ckpt
from aleph.train.optim import restore_device_flags
from tests.train.conftest import tiny_trainer


def _stepped(fused):
    cfg, model, _, _ = tiny_trainer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    model(torch.randint(5, 50, (2, 8)), torch.ones(2, 8, dtype=torch.bool)).sum().backward()
    opt.step()
    return model, opt


def test_a_state_saved_with_the_fused_kernel_resumes_without_it_on_cpu():
    _, saved_opt = _stepped(fused=True)  # what a CUDA launch saved (fused=True)
    saved = saved_opt.state_dict()
    assert saved["param_groups"][0]["fused"] is True
    model, opt = _stepped(fused=None)  # what make_optimizer builds on CPU
    built = [{k: g[k] for k in ("fused", "foreach", "capturable")} for g in opt.param_groups]
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["fused"] is True  # torch 2.4: the saved flag comes back
    restore_device_flags(opt, built)
    assert opt.param_groups[0]["fused"] is None
    assert all(s["step"].device.type == "cpu" for s in opt.state.values())
    opt.step()  # and the default kernel runs on it


def test_a_state_saved_without_it_resumes_with_the_fused_kernel():
    _, saved_opt = _stepped(fused=None)  # a CPU launch's state
    model, opt = _stepped(fused=True)  # what make_optimizer builds where fused applies
    built = [{k: g[k] for k in ("fused", "foreach", "capturable")} for g in opt.param_groups]
    opt.load_state_dict(saved_opt.state_dict())
    assert opt.param_groups[0]["fused"] is None
    restore_device_flags(opt, built)
    assert opt.param_groups[0]["fused"] is True
    assert all(s["step"].dtype == torch.float32 for s in opt.state.values())
    opt.step()


def test_checkpoint_load_keeps_the_groups_make_optimizer_built(tmp_path):
    cfg, model, opt, sched = tiny_trainer()
    ckpt.save(tmp_path, model, opt, sched, ckpt.Position(3, 0, 3, 12), [ckpt.rng_state()], "h", 3)
    state = RunLayout(tmp_path).state_dir(3)
    trainer = torch.load(state / "trainer.pt", weights_only=True)
    for g in trainer["optimizer"]["param_groups"]:
        g["fused"] = True  # as a CUDA launch would have saved it
    torch.save(trainer, state / "trainer.pt")
    from tests.train.test_untrusted_state import _rewrite_marker

    _rewrite_marker(state)
    _, model2, opt2, sched2 = tiny_trainer()
    ckpt.load(state, model2, opt2, sched2)
    assert [g["fused"] for g in opt2.param_groups] == [g["fused"] for g in opt.param_groups]
