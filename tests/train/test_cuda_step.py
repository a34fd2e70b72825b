"""The trainer's step on a real CUDA device (pytest -m gpu; skipped without CUDA): a fused
AdamW step through train_step, and the per-device RNG state round trip on two devices.
Not run where this was written (no GPU)."""

from __future__ import annotations

import pytest
import torch

from aleph.model import ModelConfig, build_model
from aleph.train import checkpoint as ckpt
from aleph.train.config import resolve
from aleph.train.distributed import World
from aleph.train.step import train_step
from aleph.train.trainer import step_trainer

pytestmark = pytest.mark.gpu


def test_a_fused_adamw_step_through_train_step():
    cfg = resolve("e1", arm="a1_anchored", overrides=["smoke_data=true", "tokenizer="])
    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    model = build_model(ModelConfig(arm="a1_anchored", vocab_size=30522, n_layers=2)).to(dev)
    t = step_trainer(cfg, model, 10, World(), dev)
    opt = t.opt
    assert [g["fused"] for g in opt.param_groups] == [True, True]
    ids = torch.randint(5, 30522, (16, 128), device=dev)
    mask = torch.ones(16, 128, dtype=torch.bool, device=dev)
    target = torch.nn.functional.normalize(torch.randn(16, 768, device=dev), dim=-1).half()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    res = train_step(t, (ids, mask, target))
    assert res.grad_norm > 0 and res.lr > 0
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert "blocks.0.ffn.w_in" in moved and "proj.weight" in moved
    state = opt.state[model.blocks[0].ffn.w_in]
    assert state["step"].is_cuda  # fused: the step counter lives on the device


def test_per_device_rng_state_round_trips_on_two_devices():
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two CUDA devices, {torch.cuda.device_count()} visible")
    devs = [torch.device("cuda", 0), torch.device("cuda", 1)]
    torch.cuda.manual_seed_all(5)
    states = [ckpt.rng_state(d) for d in devs]
    assert [s["cuda_device"] for s in states] == [0, 1]
    drawn = [torch.rand(6, device=d) for d in devs]
    torch.cuda.manual_seed_all(6)  # both generators move on
    for state, d, want in zip(states, devs, drawn, strict=True):
        assert ckpt.set_rng_state(state, d) == "restored"
        assert torch.equal(torch.rand(6, device=d), want)
    # each state restores its own device only: restoring device 0 leaves device 1 alone
    torch.cuda.manual_seed_all(7)
    ahead = torch.rand(6, device=devs[1])
    torch.cuda.manual_seed_all(7)
    ckpt.set_rng_state(states[0], devs[0])
    assert torch.equal(torch.rand(6, device=devs[1]), ahead)
