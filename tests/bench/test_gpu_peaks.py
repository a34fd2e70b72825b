"""bench/gpu_peaks.py: peaks by exact device name, never by substring."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_peaks.py"


@pytest.fixture(scope="module")
def gp():
    spec = importlib.util.spec_from_file_location("gpu_peaks_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name, peak, cls", [
    ("NVIDIA H100 80GB HBM3", 989.0, "H100"), ("NVIDIA H100 PCIe", 756.0, "H100"),
    ("NVIDIA H100 NVL", 835.0, "H100"), ("NVIDIA H200", 989.0, "H200"),
    ("NVIDIA H200 NVL", 835.0, "H200"), ("NVIDIA A40", 149.7, "A40"),
    ("NVIDIA A100-SXM4-40GB", 312.0, "A100"), ("NVIDIA A100-SXM4-80GB", 312.0, "A100"),
    ("NVIDIA A100-PCIE-40GB", 312.0, "A100"), ("NVIDIA A100 80GB PCIe", 312.0, "A100"),
    ("NVIDIA L40S", 362.05, None), ("NVIDIA L40", 181.05, None), ("NVIDIA A10", 125.0, None),
    ("  nvidia  h200 ", 989.0, "H200"),  # blanks and case aside, the whole name
])
def test_listed_gpus_get_their_own_peak(gp, name, peak, cls):
    assert gp.peak_tflops(name) == peak
    assert gp.mfu_class(name) == cls
    assert gp.peak_tflops(name, 1.5) == 1.5  # --peak-tflops wins


@pytest.mark.parametrize("name", ["NVIDIA RTX A4000", "NVIDIA H200 NVL 141GB", "Tesla T4",
                                  "NVIDIA A100", "NVIDIA GeForce RTX 4090 D", "H100", ""])
def test_a_name_not_listed_exactly_has_no_peak(gp, name):
    assert gp.peak_tflops(name) is None and gp.mfu_class(name) is None


def test_every_class_has_an_on_paper_estimate(gp):
    classes = {c for _, c in gp.PEAK_BF16_TFLOPS.values() if c}
    assert classes == set(gp.MFU_ON_PAPER) == {"A40", "A100", "H100", "H200"}
    assert 0 < gp.MFU_PASS < gp.MFU_GOAL < 1
