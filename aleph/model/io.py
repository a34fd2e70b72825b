"""Weights on disk: `model.safetensors` + `model_config.json` in one directory, both atomic."""

from __future__ import annotations

from pathlib import Path

import safetensors.torch
import torch
from safetensors import SafetensorError

from aleph._io import atomic_write_bytes, atomic_write_json, parse_json_bytes, read_bounded
from aleph.errors import ConfigError, StoreError
from aleph.model.config import ModelConfig
from aleph.model.encoder import AlephEncoder, build_model

WEIGHTS = "model.safetensors"
CONFIG = "model_config.json"
CONFIG_MAX_BYTES = 1 << 20  # a model config is ~20 fields; a pulled one may be anything


def plain_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict as contiguous CPU tensors (the trainer compiles in place,
    `model.compile()`, so the keys carry no wrapper prefix)."""
    return {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}


def save_weights(model: torch.nn.Module, out_dir: str | Path) -> Path:
    """Write the weights and config of `model` (compiled in place or not) into `out_dir`, the
    config last: a directory whose config is present has complete weights."""
    out_dir = Path(out_dir)
    cfg: ModelConfig = model.config
    blob = safetensors.torch.save(plain_state_dict(model), metadata={"arm": cfg.arm})
    atomic_write_bytes(out_dir / WEIGHTS, blob)
    atomic_write_json(out_dir / CONFIG, cfg.to_dict())
    return out_dir


def load_model(weights_dir: str | Path, device: str | torch.device = "cpu") -> AlephEncoder:
    """Rebuild the encoder from `weights_dir` and load its weights (strict key/shape match)."""
    weights_dir = Path(weights_dir)
    cfg_path, w_path = weights_dir / CONFIG, weights_dir / WEIGHTS
    for path in (cfg_path, w_path):
        if not path.is_file():
            raise StoreError(f"{path}: missing (a weights directory holds {WEIGHTS} and {CONFIG})")
    try:
        cfg = ModelConfig.from_dict(parse_json_bytes(read_bounded(cfg_path, CONFIG_MAX_BYTES)),
                                    source=str(cfg_path))
    except OSError as e:
        raise StoreError(f"{cfg_path}: cannot read ({e.strerror})") from None
    except ValueError as e:  # invalid JSON, not UTF-8, nested too deeply (parse_json_bytes)
        raise ConfigError(f"{cfg_path}: not valid JSON ({e})") from e
    try:
        state = safetensors.torch.load_file(str(w_path), device=str(device))
    except (SafetensorError, OSError) as e:
        raise StoreError(f"{w_path}: unreadable safetensors file ({e})") from e
    try:
        model = build_model(cfg).to(device)
    except ConfigError as e:  # a shape too large to allocate: name the file that asks for it
        raise ConfigError(f"{cfg_path}: {e}") from None
    if problem := state_mismatch(model.state_dict(), state, 5):
        raise StoreError(f"{w_path}: does not match {cfg_path} (arm {cfg.arm}): {problem}")
    model.load_state_dict(state, strict=True)
    return model


def state_mismatch(expected: dict, state: dict, n: int) -> str | None:
    """'missing [..], unexpected [..], wrong shape [..]' (the first `n` keys of each) when
    `state` does not fit a module whose state dict is `expected`, else None."""
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    bad = sorted(k for k in set(expected) & set(state) if expected[k].shape != state[k].shape)
    if missing or unexpected or bad:
        return f"missing {missing[:n]}, unexpected {unexpected[:n]}, wrong shape {bad[:n]}"
    return None
