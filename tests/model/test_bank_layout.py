"""The merged bank layout: weights of the earlier layout are refused in one line (weights
directory and resume state), and the health gauges are recorded only when asked for."""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch

from aleph.errors import StoreError
from aleph.model import build_model
from aleph.model.io import CONFIG, WEIGHTS, load_model


def _earlier_layout(state: dict, n_layers: int, ff: int) -> dict:
    """The same weights as the earlier code stored them: trunk Linear pair (out, in) and
    (K, D, ff) / (K, ff, D) expert stacks."""
    old = dict(state)
    for i in range(n_layers):
        p = f"blocks.{i}.ffn."
        w_in, w_out = old.pop(p + "w_in"), old.pop(p + "w_out")  # (D, 4ff), (4ff, D)
        d = w_in.shape[0]
        old[p + "trunk.w_in.weight"] = w_in[:, :ff].T.contiguous()  # (ff, D)
        old[p + "trunk.w_out.weight"] = w_out[:ff].T.contiguous()  # (D, ff)
        old[p + "w_in"] = w_in[:, ff:].reshape(d, -1, ff).permute(1, 0, 2).contiguous()
        old[p + "w_out"] = w_out[ff:].reshape(-1, ff, d).contiguous()  # (K, ff, D)
    return old


@pytest.fixture
def trained(tiny):
    torch.manual_seed(0)
    model = build_model(tiny("a1_anchored")).eval()
    with torch.no_grad():
        for bank in model.banks():
            bank.w_out.normal_(std=0.1)  # experts live
            bank.address.anchors.add_(0.3 * torch.randn_like(bank.address.anchors))
    return model


def test_weights_of_the_earlier_layout_are_refused_in_one_line(trained, tmp_path):
    """The layout before the bank's matmuls were merged is not read: a weights directory of
    it is one line naming the file and the keys it lacks and holds."""
    cfg = trained.config
    old = _earlier_layout(trained.state_dict(), cfg.n_layers, cfg.ffn_expert)
    (tmp_path / WEIGHTS).write_bytes(safetensors.torch.save(old))
    (tmp_path / CONFIG).write_text(json.dumps(cfg.to_dict()))
    with pytest.raises(StoreError) as e:
        load_model(tmp_path)
    msg = str(e.value)
    assert msg.count("\n") == 0 and msg.startswith(f"{tmp_path / WEIGHTS}: does not match ")
    assert "unexpected ['blocks.0.ffn.trunk.w_in.weight'" in msg and "wrong shape ['blocks.0.ffn.w_in'" in msg


def test_a_resume_state_of_the_earlier_layout_is_refused_in_one_line(trained, tmp_path):
    from aleph.record.layout import RunLayout
    from aleph.train import checkpoint as ckpt
    from aleph.train.config import resolve
    from aleph.train.optim import make_optimizer, make_scheduler

    cfg = trained.config
    opt = make_optimizer(trained, resolve("smoke", arm="a1_anchored"))
    sched = make_scheduler(opt, resolve("smoke", arm="a1_anchored"), 10)
    ckpt.save(tmp_path, trained, opt, sched, ckpt.Position(2, 0, 2, 8), [ckpt.rng_state()], "h", 2)
    state = RunLayout(tmp_path).state_dir(2)
    old = _earlier_layout(trained.state_dict(), cfg.n_layers, cfg.ffn_expert)
    (state / "model.safetensors").write_bytes(safetensors.torch.save(old))
    with pytest.raises(StoreError) as e:
        ckpt.load(state, trained, opt, sched)
    msg = str(e.value)
    assert msg.count("\n") == 0 and msg.startswith(
        f"{state / 'model.safetensors'}: does not match the model this config builds: ")


def test_gauges_are_recorded_only_when_asked_and_never_change_the_output(trained):
    ids, mask = torch.randint(5, 200, (2, 10)), torch.ones(2, 10, dtype=torch.bool)
    trained.set_gauges(False)
    quiet = trained(ids, mask)
    assert all(torch.equal(b._usage, torch.zeros_like(b._usage)) for b in trained.banks())
    trained.set_gauges(True)
    loud = trained(ids, mask)
    assert torch.equal(quiet, loud)
    recorded = trained.health()["layer00/usage_ppl"]
    assert 1.0 <= recorded <= 6.0
    trained.set_gauges(False)
    trained(torch.randint(5, 200, (4, 3)), torch.ones(4, 3, dtype=torch.bool))
    assert trained.health()["layer00/usage_ppl"] == recorded  # still the recorded forward's
