"""Turn texts into embeddings with a run's own tokenizer and encoder.

Evaluation is deterministic: the model is put in eval mode (no dropout), runs under
`torch.inference_mode`, and each distinct text is encoded once, in the order given,
so the result does not depend on duplicates or on the batch size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

DEFAULT_BATCH = 128


def tokenize(tokenizer, texts: Sequence[str], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to the longest text of the batch, truncate at `max_len` (the run's training length)."""
    enc = tokenizer(list(texts), padding=True, truncation=True, max_length=max_len,
                    return_tensors="pt")
    return enc["input_ids"].long(), enc["attention_mask"].bool()  # (B, L), (B, L)


@torch.inference_mode()
def encode(model: torch.nn.Module, tokenizer, texts: Sequence[str], max_len: int,
           batch_size: int = DEFAULT_BATCH, device: str | torch.device = "cpu",
           on_batch: Callable[[int, int], None] | None = None) -> torch.Tensor:
    """Embeddings (N, D) float32 on the CPU, one row per text of `texts`; `on_batch(done,
    total)` is called after each batch with the distinct texts encoded so far."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    model.eval()
    unique = list(dict.fromkeys(texts))  # first-seen order, duplicates dropped
    rows: list[torch.Tensor] = []
    for start in range(0, len(unique), batch_size):
        ids, mask = tokenize(tokenizer, unique[start : start + batch_size], max_len)
        rows.append(model(ids.to(device), mask.to(device)).float().cpu())  # (b, D)
        if on_batch is not None:
            on_batch(min(start + batch_size, len(unique)), len(unique))
    table = torch.cat(rows) if rows else torch.empty(0, 0)  # (U, D)
    index = {t: i for i, t in enumerate(unique)}
    return table[torch.tensor([index[t] for t in texts], dtype=torch.long)]  # (N, D)


class Progress:
    """An `on_batch` that prints `<label>: encoded done/total texts` at most every `every_s`
    seconds (and once at the end, when the encoding took longer than that)."""

    def __init__(self, say: Callable[[str], None], label: str, every_s: float = 2.0) -> None:
        self.say, self.label, self.every_s = say, label, every_s
        self.start = self.last = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s or (done == total and now - self.start >= self.every_s):
            self.last = now
            self.say(f"{self.label}: encoded {done:,}/{total:,} texts ({now - self.start:.0f} s)")
