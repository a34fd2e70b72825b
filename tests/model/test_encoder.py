import math

import pytest
import torch

from aleph.model import build_model


def _batch(seed=0, b=4, n=12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 200, (b, n), generator=g)
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[0, 6:] = False
    mask[2, 3:] = False
    return ids.masked_fill(~mask, 0), mask


@pytest.mark.parametrize("arm", ["a1_anchored", "a2_dense", "a3_random"])
def test_output_is_unit_and_ignores_padding(arm, tiny):
    torch.manual_seed(0)
    model = build_model(tiny(arm)).eval()
    ids, mask = _batch()
    out = model(ids, mask)
    assert out.shape == (4, 768) and out.dtype == torch.float32
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(4))
    # Row 0 alone, cut to its 6 real tokens: the padded copy must embed the same.
    alone = model(ids[:1, :6], mask[:1, :6])
    torch.testing.assert_close(out[:1], alone, rtol=1e-5, atol=1e-6)
    # Changing what sits under the padding changes nothing either.
    noisy = ids.masked_fill(~mask, 7)
    torch.testing.assert_close(model(noisy, mask), out, rtol=1e-5, atol=1e-6)


# torch 2.4's own checkpoint code calls the deprecated torch.cpu.amp.autocast
@pytest.mark.filterwarnings("ignore:.*torch.cpu.amp.autocast:FutureWarning")
def test_checkpointing_gives_the_same_output_and_gradients(tiny):
    ids, mask = _batch()
    grads, outs = [], []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = build_model(tiny("a1_anchored", checkpointing=ckpt)).train()
        with torch.no_grad():
            for bank in model.banks():
                bank.w_out.normal_(std=0.1)  # so the experts take part in the gradient
        out = model(ids, mask)
        out.sum().backward()
        outs.append(out.detach())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(grads[0], grads[1])


def test_health_gauges(tiny):
    torch.manual_seed(0)
    model = build_model(tiny("a1_anchored"))
    ids, mask = _batch()
    assert build_model(tiny("a2_dense")).health() == {}
    assert math.isnan(model.health()["layer00/usage_ppl"])  # no forward yet
    model(ids, mask)
    h = model.health()
    for layer in ("layer00", "layer01"):
        assert 1.0 <= h[f"{layer}/usage_ppl"] <= 6.0  # perplexity over 2K = 6 half-axes
        assert 0.0 < h[f"{layer}/neg_frac"] < 1.0
        assert abs(h[f"{layer}/anchor_drift"]) < 1e-6 and abs(h[f"{layer}/anchor_drift_max"]) < 1e-6
        assert 0.0 < h[f"{layer}/anchor_max_cos"] < 1.0
    with torch.no_grad():
        bank = model.banks()[1]
        bank.address.anchors[1] = bank.address.anchors[0]  # collapse two anchors
        bank.address.anchors[2] = -bank.address.anchors[0]
    h = model.health()
    assert h["layer01/anchor_max_cos"] == pytest.approx(1.0)
    assert h["layer01/anchor_drift"] > 0.1
    assert h["layer01/anchor_drift_max"] >= h["layer01/anchor_drift"]
    assert abs(h["layer00/anchor_drift_max"]) < 1e-6  # the other layer's anchors did not move
    model(ids, mask)
    # anchors 0 = 1 and 2 = -0, so w1 = w0 and w2 = -w0: the half-axes [0+ 1+ 2+ 0- 1- 2-]
    # pair up as 0+ = 1+ = 2- and 0- = 1- = 2+, and each token has one or two negatives.
    usage = bank._usage
    torch.testing.assert_close(usage[[1, 5]], usage[[0, 0]])
    torch.testing.assert_close(usage[[4, 2]], usage[[3, 3]])
    assert 1 / 3 - 1e-6 <= model.health()["layer01/neg_frac"] <= 2 / 3 + 1e-6


def test_neg_frac_counts_only_real_tokens(tiny):
    torch.manual_seed(0)
    model = build_model(tiny("a1_anchored", n_layers=1))
    ids, mask = _batch()
    model(ids, mask)
    bank = model.banks()[0]
    assert float(bank._count) == mask.sum().item() * 3


def test_bf16_autocast_forward_tracks_fp32(tiny):
    torch.manual_seed(0)
    model = build_model(tiny("a1_anchored")).eval()
    with torch.no_grad():
        for bank in model.banks():
            bank.w_out.normal_(std=0.1)
    ids, mask = _batch()
    ref = model(ids, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(ids, mask)
    assert low.dtype == torch.float32 and torch.isfinite(low).all()
    assert (low * ref).sum(-1).min() > 0.99


@pytest.mark.slow
def test_compiles_as_one_graph_and_keeps_health_and_toggle(tiny):
    """fullgraph=True: the health buffers and the dispatch switch cause no graph break."""
    torch.manual_seed(0)
    model = build_model(tiny("a1_anchored"))
    with torch.no_grad():
        for bank in model.banks():
            bank.w_out.normal_(std=0.1)
    ids, mask = _batch()
    ref = model(ids, mask)
    ref_health = model.health()
    model.banks()[0]._usage.zero_()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    out = compiled(ids, mask)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert model.health() == pytest.approx(ref_health)  # buffers written from inside the graph
    model.set_dispatch(False)
    off = compiled(ids, mask)  # a guard on the switch recompiles; no stale graph
    model.set_dispatch(True)
    assert not torch.allclose(off, out)
    # The gauges switch is never read under compile (no guard, no recompile): the compiled
    # graph records them always, so the trainer's per-step switching costs nothing there.
    from torch._dynamo.utils import counters

    compiled(ids, mask)
    frames = counters["stats"]["unique_graphs"]
    model.set_gauges(False)
    model.banks()[0]._usage.zero_()
    compiled(ids, mask)
    assert counters["stats"]["unique_graphs"] == frames
    assert model.health() == pytest.approx(ref_health)
