"""Turn texts into embeddings with a run's own tokenizer and encoder.

Evaluation is deterministic: the model is put in eval mode (no dropout), runs under
`torch.inference_mode`, and each distinct text is encoded once, in the order given,
so the result does not depend on duplicates or on the batch size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

DEFAULT_BATCH = 128


def tokenize(tokenizer, texts: Sequence[str], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to the longest text of the batch, truncate at `max_len` (the run's training length)."""
    enc = tokenizer(
        list(texts), padding=True, truncation=True, max_length=max_len, return_tensors="pt"
    )
    input_ids = enc["input_ids"].long()  # (B, L)
    attention_mask = enc["attention_mask"].bool()  # (B, L)
    return input_ids, attention_mask


@torch.inference_mode()
def encode(
    model: torch.nn.Module,
    tokenizer,
    texts: Sequence[str],
    max_len: int,
    batch_size: int = DEFAULT_BATCH,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """Embeddings (N, D) float32 on the CPU, one row per text of `texts`."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    model.eval()
    unique = list(dict.fromkeys(texts))  # first-seen order, duplicates dropped
    rows: list[torch.Tensor] = []
    for start in range(0, len(unique), batch_size):
        ids, mask = tokenize(tokenizer, unique[start : start + batch_size], max_len)
        out = model(ids.to(device), mask.to(device))  # (b, D)
        rows.append(out.float().cpu())
    table = torch.cat(rows) if rows else torch.empty(0, 0)  # (U, D)
    index = {t: i for i, t in enumerate(unique)}
    return table[torch.tensor([index[t] for t in texts], dtype=torch.long)]  # (N, D)
