"""The model on a real CUDA device (pytest -m gpu; skipped without CUDA): each arm's
forward and backward under bf16 autocast, a compiled forward and backward, and the
attention with and without a mask. Not run where this was written (no GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aleph.model import ARMS, ModelConfig, build_model

pytestmark = pytest.mark.gpu
SHAPE = dict(vocab_size=30522, max_len=128, d_model=512, n_layers=2, n_heads=8)


def _model(arm: str, **over) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(ModelConfig(arm=arm, **{**SHAPE, **over})).cuda()
    with torch.no_grad():
        for bank in model.banks():
            bank.w_out.normal_(std=0.02)  # experts live, so their path is exercised
    return model


def _batch(b: int = 8, n: int = 128, padded: bool = True):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 30522, (b, n), generator=g)
    mask = torch.ones(b, n, dtype=torch.bool)
    if padded:
        mask[1, 40:], mask[3, 9:] = False, False
    return ids.masked_fill(~mask, 0).cuda(), mask.cuda()


@pytest.mark.parametrize("arm", ARMS)
def test_forward_and_backward_under_bf16_autocast(arm):
    model = _model(arm).train()
    ids, mask = _batch()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(ids, mask)
    assert out.dtype == torch.float32 and out.shape == (8, 768)
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(8, device="cuda"))
    out.sum().backward()
    for name, p in model.named_parameters():
        if p.requires_grad and not name.startswith(("tok.", "pos.")):
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
    model.eval()
    with torch.no_grad():
        full = model(ids, mask)  # fp32
        with torch.autocast("cuda", dtype=torch.bfloat16):
            half = model(ids, mask)
    assert F.cosine_similarity(full, half).min() > 0.99  # bf16 tracks fp32


@pytest.mark.parametrize("arm", ["a1_anchored", "a2_dense"])
def test_compiled_forward_and_backward_match_eager(arm):
    model = _model(arm).train()
    ids, mask = _batch()
    compiled = torch.compile(model)
    grads = []
    for run in (model, compiled):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = run(ids, mask)
        out.float().pow(2).sum().backward()
        grads.append(model.blocks[0].attn.qkv.weight.grad.clone())
    # dropout 0 (ModelConfig default): the same function, bf16 rounding apart
    torch.testing.assert_close(grads[1], grads[0], rtol=5e-2, atol=5e-3)


@pytest.mark.parametrize("arm", ["a1_anchored", "a2_dense"])
def test_attention_with_and_without_a_mask_agree(arm):
    model = _model(arm).eval()
    ids, _ = _batch(padded=False)
    full = torch.ones(ids.shape, dtype=torch.bool, device="cuda")  # a device mask: kept
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        masked = model(ids, full)  # the additive bias (all zeros)
        unmasked = model(ids, None)  # no mask: SDPA may take its flash kernel
    assert F.cosine_similarity(masked, unmasked).min() > 0.999
    # a padded row embeds as the same row alone, cut to its real tokens
    ids, mask = _batch()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        padded = model(ids, mask)
        alone = model(ids[3:4, :9], None)
    assert F.cosine_similarity(padded[3:4], alone).item() > 0.999
