import json

import pytest
import torch

from aleph.errors import ConfigError, StoreError
from aleph.model import build_model
from aleph.model.io import CONFIG, WEIGHTS, load_model, save_weights


def _batch():
    ids = torch.randint(5, 200, (3, 10), generator=torch.Generator().manual_seed(1))
    return ids, torch.ones(3, 10, dtype=torch.bool)


@pytest.mark.parametrize("arm", ["a1_anchored", "a2_dense", "a3_random"])
def test_round_trip_reproduces_outputs(tmp_path, arm, tiny):
    torch.manual_seed(0)
    model = build_model(tiny(arm)).eval()
    if model.banks():
        with torch.no_grad():
            model.banks()[0].w_out.normal_(std=0.1)
            model.banks()[0].address.anchors.add_(0.1)  # drift must survive the round trip
    save_weights(model, tmp_path / "w")
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == sorted([CONFIG, WEIGHTS])
    loaded = load_model(tmp_path / "w").eval()
    assert loaded.config == model.config
    assert torch.equal(loaded(*_batch()), model(*_batch()))
    assert loaded.health().get("layer00/anchor_drift") == model.health().get("layer00/anchor_drift")


def test_compiled_in_place_saves_plain_keys(tmp_path, tiny):
    model = build_model(tiny("a1_anchored"))
    keys = set(model.state_dict())
    model.compile()  # what the trainer does (lazy: dynamo runs at the first forward)
    save_weights(model, tmp_path / "w")
    from safetensors.torch import load_file

    assert set(load_file(tmp_path / "w" / WEIGHTS)) == keys
    assert not any("_orig_mod" in k for k in keys)


def test_missing_file_is_a_store_error(tmp_path, tiny):
    save_weights(build_model(tiny("a2_dense")), tmp_path / "w")
    (tmp_path / "w" / WEIGHTS).unlink()
    with pytest.raises(StoreError, match=WEIGHTS):
        load_model(tmp_path / "w")


def test_config_of_another_arm_is_a_mismatch(tmp_path, tiny):
    save_weights(build_model(tiny("a2_dense")), tmp_path / "w")
    cfg_path = tmp_path / "w" / CONFIG
    cfg = json.loads(cfg_path.read_text())
    cfg["arm"] = "a1_anchored"
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(StoreError, match="does not match.*missing"):
        load_model(tmp_path / "w")
    cfg["arm"] = "splat"
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="not available"):
        load_model(tmp_path / "w")


def test_a_config_nested_too_deeply_is_one_line(tmp_path, tiny):
    """A pulled run's model_config.json of 1,000,000 B of `[`/`]` (under the 1 MiB cap)."""
    save_weights(build_model(tiny("a2_dense")), tmp_path / "w")
    (tmp_path / "w" / CONFIG).write_bytes(b"[" * 500_000 + b"]" * 500_000)
    with pytest.raises(ConfigError) as e:
        load_model(tmp_path / "w")
    assert str(e.value) == (f"{tmp_path / 'w' / CONFIG}: not valid JSON (JSON nested too deeply "
                            "to parse; expected a shallow document)")
