import pytest
import torch
import torch.nn.functional as F

from aleph.errors import ConfigError
from aleph.model.objective import distill_loss


def _unit(b=8, d=32, seed=0):
    return F.normalize(torch.randn(b, d, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_terms_match_a_direct_computation():
    s, t = _unit(seed=0), _unit(seed=1)
    total, parts = distill_loss(s, t, tau=0.07)
    logits = s @ t.T / 0.07
    row = -torch.log_softmax(logits, dim=1).diagonal().mean()  # student -> its target
    col = -torch.log_softmax(logits, dim=0).diagonal().mean()  # target -> its student
    torch.testing.assert_close(parts["nce"], (row + col) / 2)
    torch.testing.assert_close(parts["mse"], ((s - t) ** 2).mean())
    torch.testing.assert_close(total, parts["nce"] + parts["mse"])
    weighted, _ = distill_loss(s, t, weights={"nce": 0.5, "mse": 3.0})
    torch.testing.assert_close(weighted, 0.5 * parts["nce"] + 3.0 * parts["mse"])


def test_matching_student_beats_a_shuffled_one():
    t = _unit(b=16, d=64)
    good, parts = distill_loss(t.clone(), t)
    bad, _ = distill_loss(t[torch.randperm(16, generator=torch.Generator().manual_seed(0))], t)
    assert parts["mse"].item() == pytest.approx(0.0, abs=1e-12)
    assert good < bad


def test_fp16_targets_are_cast_and_renormalised():
    s = _unit(d=768)
    t16 = (s * 3).half()  # wrong norm and fp16: the loss compares directions in float32
    total, parts = distill_loss(s, t16)
    assert total.dtype == torch.float32
    assert parts["mse"].item() < 1e-6


def test_gradient_reaches_the_student():
    s = _unit().requires_grad_(True)
    distill_loss(s, _unit(seed=3))[0].backward()
    assert s.grad is not None and s.grad.abs().sum() > 0


def test_shape_mismatch_names_out_dim():
    with pytest.raises(ConfigError, match="out_dim"):
        distill_loss(_unit(d=512), _unit(d=768))


def test_every_term_needs_its_weight():
    with pytest.raises(ConfigError, match=r"weights for \['nce'\], terms \['mse', 'nce'\]"):
        distill_loss(_unit(), _unit(seed=1), weights={"nce": 1.0})
