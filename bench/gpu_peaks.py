"""Dense bf16 tensor-core peaks of NVIDIA GPUs, matched by the exact device name.

Figures in TFLOP/s per GPU from NVIDIA's data sheets (the sparse figure halved). Names are
what `torch.cuda.get_device_name` reports; a name is matched whole (case and surrounding
blanks aside), never as a substring: an "NVIDIA RTX A4000" is not an A40, an "H200 NVL"
(about 835, the NVL form factor) is not an SXM H200 (989). A GPU not listed has no peak:
the caller says so and asks for --peak-tflops.
"""

from __future__ import annotations

# name -> (dense bf16 TFLOP/s, class of the MFU pass mark or None)
PEAK_BF16_TFLOPS: dict[str, tuple[float, str | None]] = {
    "NVIDIA H100 80GB HBM3": (989.0, "H100"),  # SXM5
    "NVIDIA H100 PCIe": (756.0, "H100"),
    "NVIDIA H100 NVL": (835.0, "H100"),
    "NVIDIA H200": (989.0, "H200"),  # SXM
    "NVIDIA H200 NVL": (835.0, "H200"),
    "NVIDIA A100-SXM4-40GB": (312.0, "A100"),
    "NVIDIA A100-SXM4-80GB": (312.0, "A100"),
    "NVIDIA A100-PCIE-40GB": (312.0, "A100"),
    "NVIDIA A100 80GB PCIe": (312.0, "A100"),
    "NVIDIA A40": (149.7, "A40"),
    "NVIDIA L40S": (362.05, None),
    "NVIDIA L40": (181.05, None),
    "NVIDIA A10": (125.0, None),
    "NVIDIA L4": (121.0, None),
    "NVIDIA GeForce RTX 4090": (165.2, None),  # fp32 accumulate at full rate
}

MFU_PASS = 0.25
"""Compiled a2 at the E1 shape in bf16 must reach this MFU (on slots) on an A40-, A100-,
H100- or H200-class GPU (gpu_check's bench-compiled item); the goal is MFU_GOAL."""
MFU_GOAL = 0.40
MFU_ON_PAPER = {"H200": "about 36-42%", "H100": "about 36-42%", "A100": "about 40-45%",
                "A40": "about 42-47%"}
"""The on-paper estimate of that MFU per class, printed next to the measured figure (the
A100 figure is interpolated between the two measured-class estimates, not measured)."""


def _key(name: str) -> str:
    return " ".join(name.split()).casefold()


_BY_KEY = {_key(k): v for k, v in PEAK_BF16_TFLOPS.items()}


def peak_tflops(name: str, override: float | None = None) -> float | None:
    """The GPU's dense bf16 peak: `override` if given, else the table's entry for exactly
    `name`, else None."""
    if override:
        return override
    found = _BY_KEY.get(_key(name))
    return found[0] if found else None


def mfu_class(name: str) -> str | None:
    """"A40", "A100", "H100" or "H200" for a GPU the MFU pass mark applies to, else None."""
    found = _BY_KEY.get(_key(name))
    return found[1] if found else None
