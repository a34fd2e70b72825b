import pytest
import torch
import torch.nn.functional as F

from aleph.model import ARMS, ModelConfig, build_model, count_parameters
from aleph.model.bank import AnchoredBank, DenseFFN
from aleph.model.config import INIT_SCHEMES


def test_parameter_counts_at_e1_shape(record_property):
    counts = {}
    for arm in ARMS:
        with torch.device("meta"):  # shapes only: no 54M-parameter initialisation
            model = build_model(ModelConfig(arm=arm, vocab_size=30522))
        counts[arm] = count_parameters(model)
        record_property(f"params_{arm}", counts[arm]["total"])
        print(f"{arm}: total {counts[arm]['total']:,} trainable {counts[arm]['trainable']:,}")
    dense = counts["a2_dense"]["total"]
    assert counts["a1_anchored"]["total"] == counts["a3_random"]["total"]
    for arm in ("a1_anchored", "a3_random"):
        assert abs(counts[arm]["total"] - dense) / dense < 0.01
    # the extra numbers are exactly the anchors (3 x 512) and gates (3) of 12 blocks
    assert counts["a1_anchored"]["total"] - dense == 12 * (3 * 512 + 3)
    assert counts["a3_random"]["trainable"] == counts["a1_anchored"]["trainable"] - 12 * 3 * 512


def test_bank_ffn_matrices_match_the_dense_ffn_exactly():
    bank = AnchoredBank(512, 512, 3, 0.1, -3.0, learned_anchors=True)
    dense = DenseFFN(512, 2048)
    matrices = sum(p.numel() for n, p in bank.named_parameters() if n.endswith(("w_in", "w_out",
                                                                              "weight")))
    assert matrices == sum(p.numel() for p in dense.parameters()) == 2 * 512 * 2048


def _reference_bank(bank: AnchoredBank, x: torch.Tensor) -> torch.Tensor:
    """The bank written out one expert at a time, straight from the formula."""
    w = bank.address(x)  # (B, L, K)
    out = bank.trunk(x)
    for k in range(bank.n_anchors):
        expert = F.gelu(x @ bank.w_in[k]) @ bank.w_out[k]  # (B, L, D)
        out = out + w[..., k:k + 1] * torch.sigmoid(bank.gates[k]) * expert
    return out


def test_bank_equals_the_per_expert_formula():
    torch.manual_seed(0)
    bank = AnchoredBank(16, 8, 3, 0.1, -3.0, learned_anchors=True)
    with torch.no_grad():
        bank.w_out.normal_(std=0.5)
        bank.gates.copy_(torch.tensor([-1.0, 0.0, 2.0]))
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(bank(x), _reference_bank(bank, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("init", INIT_SCHEMES)
def test_a1_at_init_equals_dispatch_off_bitwise(init, tiny):
    for arm in ("a1_anchored", "a3_random"):
        torch.manual_seed(0)
        model = build_model(tiny(arm, init=init)).eval()
        ids = torch.randint(5, 200, (3, 12))
        mask = torch.ones(3, 12, dtype=torch.bool)
        mask[1, 7:] = False
        on = model(ids, mask)
        model.set_dispatch(False)
        off = model(ids, mask)
        assert torch.equal(on, off), arm
        # and once the experts have weight, the switch does change the output
        model.set_dispatch(True)
        with torch.no_grad():
            for bank in model.banks():
                bank.w_out.normal_(std=0.1)
        assert not torch.allclose(model(ids, mask), off)


def test_gates_start_at_sigmoid_minus_three_and_w_out_at_zero(tiny):
    model = build_model(tiny("a1_anchored"))
    for bank in model.banks():
        assert torch.equal(bank.w_out, torch.zeros_like(bank.w_out))
        assert torch.equal(bank.gates, torch.full((3,), -3.0))
    assert abs(model.health()["layer00/gate0"] - 0.0474258731) < 1e-7
