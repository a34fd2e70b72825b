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


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A10", 125.0),
    ("NVIDIA L40", 181.05), ("NVIDIA L40S", 362.05), ("NVIDIA A40", 149.7), ("NVIDIA L4", 121.0),
    ("Tesla T4", None)])
def test_peak_table_matches_the_most_specific_name(bm, name, peak):
    assert bm._peak(name, None) == peak
    assert bm._peak(name, 1.5) == 1.5  # --peak-tflops wins


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
