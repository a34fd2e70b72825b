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
    """The bank written out one expert at a time, straight from the formula (the address
    too: normalised x and anchors, sinh over the sum of cosh)."""
    a = F.normalize(bank.address.anchors, dim=-1)  # (K, D)
    u = F.normalize(x, dim=-1) @ a.T / bank.address.tau  # (B, L, K)
    w = torch.sinh(u) / torch.cosh(u).sum(-1, keepdim=True)  # (B, L, K)
    v = bank.blocks()
    out = F.gelu(x @ v["trunk_in"]) @ v["trunk_out"]  # (B, L, D)
    for k in range(bank.n_anchors):
        expert = F.gelu(x @ v[f"{k}_in"]) @ v[f"{k}_out"]  # (B, L, D)
        out = out + w[..., k:k + 1] * torch.sigmoid(bank.gates[k]) * expert
    return out


def test_bank_equals_the_per_expert_formula():
    torch.manual_seed(0)
    bank = AnchoredBank(16, 8, 3, 0.1, -3.0, learned_anchors=True)
    with torch.no_grad():
        bank.w_out.normal_(std=0.5)
        bank.gates.copy_(torch.tensor([-1.0, 0.0, 2.0]))
    x = torch.randn(2, 5, 16, requires_grad=True)
    out, ref = bank(x), _reference_bank(bank, x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    # and the gradients (the address's is written out by hand in _AddressFn)
    g = torch.randn_like(out)
    params = [x, bank.w_in, bank.w_out, bank.gates, bank.address.anchors]
    for mine, theirs in zip(torch.autograd.grad(out, params, g),
                            torch.autograd.grad(ref, params, g), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)


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
        experts = bank.w_out[bank.ff:]  # the trunk's rows come first
        assert torch.equal(experts, torch.zeros_like(experts))
        assert torch.equal(bank.gates, torch.full((3,), -3.0))
    assert abs(model.health()["layer00/gate0"] - 0.0474258731) < 1e-7


def test_expert_hidden_stays_bf16_under_cpu_autocast():
    # The E1 bank under bf16 autocast: x is the LayerNorm's fp32 output, the matmul's hidden
    # is bf16, and scaling it by the coefficients must not promote it to fp32.
    torch.manual_seed(0)
    bank = AnchoredBank(d_model=32, ff=16, n_anchors=3, tau=0.1, gate_init=-3.0,
                        learned_anchors=True)
    torch.nn.init.normal_(bank.w_out, std=0.1)  # experts live (their w_out starts at zero)
    seen = []
    orig = torch.Tensor.flatten

    def spy(t, *a, **k):
        out = orig(t, *a, **k)
        if t.dim() == 4:  # the (B, L, 1+K, ff) scaled hidden, flattened for w_out
            seen.append(t.dtype)
        return out

    x = torch.randn(2, 5, 32)  # fp32, as a LayerNorm output is under autocast
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.Tensor, "flatten", spy)
        y = bank(x)
    assert seen == [torch.bfloat16]
    assert y.shape == (2, 5, 32)
    # fp32 without autocast is unchanged: the coefficients follow the hidden (fp32 there).
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.Tensor, "flatten", spy)
        bank(x)
    assert seen == [torch.bfloat16, torch.float32]


def test_health_gauges_of_all_banks_cost_one_host_transfer(tiny):
    model = build_model(tiny("a1_anchored", n_layers=3))
    model(torch.randint(0, 200, (2, 8)), torch.ones(2, 8, dtype=torch.bool))
    syncs = []
    with pytest.MonkeyPatch.context() as mp:
        for name in ("item", "tolist", "__float__", "__bool__", "numpy"):
            orig = getattr(torch.Tensor, name)
            mp.setattr(torch.Tensor, name,
                       lambda t, *a, _o=orig, _n=name, **k: (syncs.append(_n), _o(t, *a, **k))[1])
        gauges = model.health()
    assert syncs == ["tolist"], syncs
    assert len(gauges) == 3 * (3 + 6) and all(isinstance(v, float) for v in gauges.values())
    # Same values as each bank's own gauges (which also transfer once per bank).
    for i, bank in enumerate(model.banks()):
        for k, v in bank.health().items():
            assert gauges[f"layer{i:02d}/{k}"] == pytest.approx(v, nan_ok=True)
    # Before any forward, usage is undefined: NaN, still without a per-gauge sync.
    fresh = build_model(tiny("a1_anchored")).banks()[0].health()
    assert fresh["usage_ppl"] != fresh["usage_ppl"] and fresh["neg_frac"] != fresh["neg_frac"]
    assert fresh["anchor_drift"] == pytest.approx(0.0, abs=1e-6)
