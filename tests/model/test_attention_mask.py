"""The attention mask: one additive key bias per forward, equal to the per-layer boolean
mask it replaces; no mask at all when the caller says the batch has no padding (None)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aleph.model import build_model
from aleph.model.encoder import key_bias


def _reference(model, ids, mask):
    """The encoder as it was: the boolean key mask handed to every layer's SDPA (which
    converts it there), masked mean pooling even without padding."""
    n = ids.shape[1]
    x = model.tok(ids) + model.pos(torch.arange(n))
    for blk in model.blocks:
        x = blk(x, mask[:, None, None, :], mask)
    x = model.ln_f(x)
    m = mask.unsqueeze(-1).to(x.dtype)
    return F.normalize(model.proj((x * m).sum(1) / m.sum(1)).float(), dim=-1)


def _attn_masks(model, ids, mask):
    seen = []
    real = F.scaled_dot_product_attention

    def spy(*a, **k):
        seen.append(k.get("attn_mask"))
        return real(*a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(F, "scaled_dot_product_attention", spy)
        out = model(ids, mask)
    return out, seen


@pytest.mark.parametrize("arm", ["a1_anchored", "a2_dense"])
def test_padded_batch_equals_the_per_layer_boolean_mask(arm, tiny):
    torch.manual_seed(0)
    model = build_model(tiny(arm)).eval()
    ids = torch.randint(5, 200, (4, 12))
    mask = torch.ones(4, 12, dtype=torch.bool)
    mask[0, 6:], mask[2, 3:] = False, False
    out, seen = _attn_masks(model, ids, mask)
    assert torch.equal(out, _reference(model, ids, mask))
    assert len(seen) == model.config.n_layers
    assert all(s is seen[0] for s in seen)  # one bias tensor for every layer
    assert seen[0].dtype == torch.float32 and seen[0].shape == (4, 1, 1, 12)
    assert torch.equal(seen[0][:, 0, 0] == 0, mask) and torch.isinf(seen[0][~mask[:, None, None, :]]).all()


@pytest.mark.parametrize("arm", ["a1_anchored", "a2_dense"])
def test_unpadded_batch_passes_no_mask_and_equals_the_masked_path(arm, tiny):
    torch.manual_seed(0)
    model = build_model(tiny(arm)).eval()
    ids = torch.randint(5, 200, (3, 10))
    full = torch.ones(3, 10, dtype=torch.bool)
    out, seen = _attn_masks(model, ids, None)  # no padding: the caller passes no mask
    assert seen == [None] * model.config.n_layers
    masked, seen = _attn_masks(model, ids, full)  # an all-True mask is not read: a zero bias
    assert seen[0] is not None and torch.equal(seen[0], torch.zeros(3, 1, 1, 10))
    assert torch.equal(masked, _reference(model, ids, full))
    torch.testing.assert_close(out, masked, rtol=1e-5, atol=1e-6)
    # a padded batch holding the same rows: those rows embed the same
    ids2 = torch.cat([ids, torch.zeros(3, 2, dtype=ids.dtype)], 1)
    mask2 = torch.cat([full, torch.zeros(3, 2, dtype=torch.bool)], 1)
    torch.testing.assert_close(model(ids2, mask2), out, rtol=1e-5, atol=1e-6)


def test_bias_follows_autocast(tiny):
    mask = torch.tensor([[True, True, False]])
    assert key_bias(mask, torch.bfloat16).dtype == torch.bfloat16
    torch.manual_seed(0)
    model = build_model(tiny("a2_dense")).eval()
    ids = torch.randint(5, 200, (2, 3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, seen = _attn_masks(model, ids, torch.tensor([[True, True, False], [True] * 3]))
    assert seen[0].dtype == torch.bfloat16  # SDPA needs the mask in q's dtype
