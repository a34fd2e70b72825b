"""bench/bench_model.py on CPU: the peak table names the right GPU, and a measurement runs
the trainer's real step (optimiser included)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_model.py"


@pytest.fixture(scope="module")
def bm():
    spec = importlib.util.spec_from_file_location("bench_model", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_model"] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop("bench_model", None)


def test_the_bench_takes_its_peaks_from_the_exact_name_table(bm):
    assert bm._peak("NVIDIA H200 NVL", None) == 835.0  # not the SXM H200's 989
    assert bm._peak("NVIDIA RTX A4000", None) is None  # not an A40
    assert bm._peak("NVIDIA RTX A4000", 2.0) == 2.0


def test_flops_count_the_projection_once_per_sample(bm, tiny_shape):
    import torch

    cfg = bm.ModelConfig(arm="a2_dense", **tiny_shape)
    model = bm.build_model(cfg)
    per_token = sum(p.numel() for n, p in model.named_parameters()
                    if not n.startswith(("tok.", "pos.", "proj.")))
    proj = cfg.d_model * cfg.out_dim + cfg.out_dim
    one = bm.flops_per_sample(cfg, model, torch.tensor([4, 4]))
    assert one == 6 * per_token * 4 + 6 * proj + 12 * cfg.n_layers * cfg.d_model * 16
    # mixed lengths: the attention term averages L^2, not (mean L)^2
    mixed = bm.flops_per_sample(cfg, model, torch.tensor([2, 6]))
    assert mixed - one == 12 * cfg.n_layers * cfg.d_model * ((4 + 36) / 2 - 16)


def test_op_counts_see_forward_and_backward(bm, tiny_shape):
    a1 = bm.count_ops("a1_anchored", tiny_shape, 2, min_len=4)
    a2 = bm.count_ops("a2_dense", tiny_shape, 2, min_len=4)
    assert a1["forward_ops"] > 0 and a1["backward_ops"] > 0
    assert a1["ops"] == a1["forward_ops"] + a1["backward_ops"] > a2["ops"]


@pytest.fixture
def tiny_shape(bm):
    return dict(bm.SMOKE, d_model=16, n_heads=2, ffn_dense=32, ffn_expert=8, n_layers=1)


def test_a_measurement_runs_train_step_with_the_optimiser(bm, monkeypatch):
    from aleph.train import step

    steps = []
    real = step.train_step
    monkeypatch.setattr(bm, "train_step", lambda *a, **k: steps.append(real(*a, **k)))
    shape = dict(bm.SMOKE, d_model=16, n_heads=2, ffn_dense=32, ffn_expert=8, n_layers=1)
    r = bm.measure("a1_anchored", shape, 8, 2, torch.device("cpu"), min_len=4)
    assert len(steps) == 5 and all(s.lr > 0 and s.grad_norm > 0 for s in steps)  # 3 warm-up
    assert r["step"] == "train_step" and r["samples_per_s"] > 0
    assert 4 <= r["real_tokens_per_sample"] <= r["width"] <= shape["max_len"]
    assert 0 < r["tflops_real"] < r["tflops_slots"]  # padding costs compute, not real work
    assert r["dropout"] == 0.0  # the smoke preset's; the e1 preset's is 0.1
    e1 = bm.measure("a2_dense", shape, 8, 1, torch.device("cpu"), min_len=4, preset="e1")
    assert e1["dropout"] == 0.1
