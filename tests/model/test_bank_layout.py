"""The merged bank layout: weights of the earlier layout load with equal outputs, a bad
one is refused in one line, and the health gauges are recorded only when asked for."""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F

from aleph.errors import StoreError
from aleph.model import build_model
from aleph.model.bank import upgrade_bank_state
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


def _earlier_bank(old: dict, p: str, x: torch.Tensor, tau: float) -> torch.Tensor:
    """The earlier bank's forward, from its own weights (trunk, then the expert stacks)."""
    trunk = F.linear(F.gelu(F.linear(x, old[p + "trunk.w_in.weight"])), old[p + "trunk.w_out.weight"])
    a = F.normalize(old[p + "address.anchors"], dim=-1)
    u = F.normalize(x, dim=-1) @ a.T / tau
    w = torch.sinh(u) / torch.cosh(u).sum(-1, keepdim=True)  # (B, L, K)
    coef = w * torch.sigmoid(old[p + "gates"])  # (B, L, K)
    e_in, e_out = old[p + "w_in"], old[p + "w_out"]
    h = F.gelu(torch.einsum("bld,kdf->blkf", x, e_in)) * coef.unsqueeze(-1)
    return trunk + torch.einsum("blkf,kfd->bld", h, e_out)


@pytest.fixture
def trained(tiny):
    torch.manual_seed(0)
    model = build_model(tiny("a1_anchored")).eval()
    with torch.no_grad():
        for bank in model.banks():
            bank.w_out.normal_(std=0.1)  # experts live
            bank.address.anchors.add_(0.3 * torch.randn_like(bank.address.anchors))
    return model


def test_earlier_layout_loads_into_the_merged_one_with_equal_outputs(trained, tiny, tmp_path):
    cfg = trained.config
    old = _earlier_layout(trained.state_dict(), cfg.n_layers, cfg.ffn_expert)
    assert "blocks.0.ffn.trunk.w_in.weight" in old and old["blocks.0.ffn.w_in"].ndim == 3
    torch.manual_seed(1)  # another init: everything must come from the loaded weights
    fresh = build_model(tiny("a1_anchored")).eval()
    mapped = dict(old)
    for i in range(cfg.n_layers):
        assert upgrade_bank_state(mapped, f"blocks.{i}.ffn.", 3)
    fresh.load_state_dict(mapped, strict=True)
    for k, v in trained.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    ids, mask = torch.randint(5, 200, (3, 12)), torch.ones(3, 12, dtype=torch.bool)
    mask[1, 6:] = False
    assert torch.equal(fresh(ids, mask), trained(ids, mask))
    # one bank against the earlier formula run on the earlier tensors
    x = torch.randn(2, 7, cfg.d_model)
    torch.testing.assert_close(fresh.banks()[0](x), _earlier_bank(old, "blocks.0.ffn.", x, 0.1),
                               rtol=1e-5, atol=1e-6)
    # and a weights directory written in the earlier layout (aleph eval / pull)
    (tmp_path / WEIGHTS).write_bytes(safetensors.torch.save(old))
    (tmp_path / CONFIG).write_text(json.dumps(cfg.to_dict()))
    assert torch.equal(load_model(tmp_path).eval()(ids, mask), trained(ids, mask))


def test_a_resume_state_of_the_earlier_layout_is_refused_in_one_line(trained):
    """The trainer's resume loads with load_state_dict: its optimiser state has the
    earlier parameters, so the earlier layout is refused there, in one line."""
    cfg = trained.config
    old = _earlier_layout(trained.state_dict(), cfg.n_layers, cfg.ffn_expert)
    with pytest.raises(StoreError) as e:
        trained.load_state_dict(old, strict=True)
    msg = str(e.value)
    assert msg.count("\n") == 0 and msg.startswith("blocks.0.ffn: weights of the earlier bank layout")
    assert "cannot continue" in msg and "load_model" in msg


def test_an_earlier_layout_of_another_expert_count_is_refused_in_one_line(trained, tmp_path):
    cfg = trained.config
    old = _earlier_layout(trained.state_dict(), cfg.n_layers, cfg.ffn_expert)
    old["blocks.1.ffn.w_in"] = old["blocks.1.ffn.w_in"][:2].contiguous()  # K = 2
    (tmp_path / WEIGHTS).write_bytes(safetensors.torch.save(old))
    (tmp_path / CONFIG).write_text(json.dumps(cfg.to_dict()))
    with pytest.raises(StoreError) as e:
        load_model(tmp_path)
    msg = str(e.value)
    assert msg.count("\n") == 0 and str(tmp_path / WEIGHTS) in msg
    assert "blocks.1.ffn.w_in: earlier-layout expert stack of shape (2, 64, 64)" in msg


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
