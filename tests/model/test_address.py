import torch

from aleph.model.address import Address, signed_address


def _reference(u: torch.Tensor) -> torch.Tensor:
    u = u.double()
    return torch.sinh(u) / torch.cosh(u).sum(-1, keepdim=True)


def test_matches_sinh_over_sum_cosh():
    u = torch.randn(64, 3) * 4
    torch.testing.assert_close(signed_address(u).double(), _reference(u), rtol=1e-5, atol=1e-7)


def test_l1_mass_at_most_one_and_signs_flip():
    torch.manual_seed(0)
    u = torch.randn(1000, 3) * 10
    w = signed_address(u)
    assert (w.abs().sum(-1) <= 1 + 1e-6).all()
    assert torch.equal(signed_address(-u), -w)
    assert (w < 0).any() and (w > 0).any()  # signed, not a softmax


def test_input_negation_flips_every_weight():
    torch.manual_seed(0)
    addr = Address(d_model=16, n_anchors=3, tau=0.1, learned=True)
    x = torch.randn(5, 7, 16)
    torch.testing.assert_close(addr(-x), -addr(x))


def test_stable_at_tau_001_with_u_near_100():
    torch.manual_seed(0)
    addr = Address(d_model=8, n_anchors=3, tau=0.01, learned=True)
    x = addr.anchors.detach()[0].repeat(4, 1) + 1e-3 * torch.randn(4, 8)  # cos ~ 1 -> u ~ 100
    x.requires_grad_(True)
    u = addr.scores(x)
    assert u.abs().max() > 95
    w = addr(x)  # naive sinh/cosh overflow to inf/inf = nan here in fp32
    assert torch.isfinite(w).all()
    assert (w.abs().sum(-1) <= 1 + 1e-6).all()
    w[:, 0].sum().backward()
    assert torch.isfinite(x.grad).all()
    u_big = torch.tensor([[100.0, -100.0, 0.0], [120.0, 119.0, -3.0]])
    torch.testing.assert_close(signed_address(u_big).double(), _reference(u_big))


def test_frozen_anchors_are_a_buffer_under_the_same_key():
    learned = Address(8, 3, 0.1, learned=True)
    frozen = Address(8, 3, 0.1, learned=False)
    assert set(learned.state_dict()) == set(frozen.state_dict()) == {"anchors", "anchors_init"}
    assert [n for n, _ in frozen.named_parameters()] == []
    assert torch.allclose(learned.anchors.detach().norm(dim=-1), torch.ones(3))


def test_scores_stay_float32_under_bf16_autocast():
    torch.manual_seed(0)
    addr = Address(d_model=64, n_anchors=3, tau=0.1, learned=True)
    x = torch.randn(4, 9, 64)
    plain = addr(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = addr(x)
    assert auto.dtype == torch.float32
    assert torch.equal(auto, plain)


def test_the_written_out_gradient_is_the_formulas():
    """_AddressFn's hand-written backward against finite differences (float64), for learned
    and frozen anchors."""
    from aleph.model.address import _AddressFn

    torch.manual_seed(0)
    for learned in (True, False):
        x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
        a = torch.randn(3, 16, dtype=torch.float64, requires_grad=learned)
        assert torch.autograd.gradcheck(lambda x, a: _AddressFn.apply(x, a, 0.1), (x, a))
