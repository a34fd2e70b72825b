"""The seed's software table: the stack the E1 seed-1 arms trained on.

Source: the seed's environment record ("AlephLM-0 E1 - execution environment", captured
2026-08-07). `pip_freeze.txt` carries the full set; these rows are the ones the seed
states explicitly, so a freeze edited to agree with a drifted image still fails here.
"""

from __future__ import annotations

# Interpreter and toolchain facts, as `aleph.env.facts.runtime_facts()` reports them.
SEED_FACTS: dict[str, str] = {
    "python": "3.11.10",
    "compiler": "GCC 11.4.0",
    "torch": "2.4.1+cu124",
    "cuda": "12.4",
    "cudnn": "90100",  # torch.backends.cudnn.version() of cuDNN 9.1.0
    "triton": "3.0.0",
}

# Package rows of the seed table, PEP 503 names.
SEED_PACKAGES: dict[str, str] = {
    "torch": "2.4.1+cu124",
    "triton": "3.0.0",
    "transformers": "5.14.1",
    "tokenizers": "0.22.2",
    "huggingface-hub": "1.26.0",
    "datasets": "5.0.1",
    "safetensors": "0.8.0",
    "numpy": "1.26.3",
    "tensorboard": "2.21.0",
    "torchvision": "0.19.1+cu124",
    "torchaudio": "2.4.1+cu124",
}

