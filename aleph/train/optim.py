"""The optimiser (AdamW, decay groups) and the learning-rate schedule (warmup, cosine)."""

from __future__ import annotations

import math

import torch

from aleph.train.config import TrainConfig

NO_DECAY_SUFFIXES = ("address.anchors",)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; matrices decay, vectors (norms, biases, gates) do not (as nanoGPT). Nor do
    a1's anchors: normalised before use, decay would only shrink them and speed up their
    drift, a push a3's frozen anchors never get. Fused on CUDA; on CPU the single-tensor
    path the bitwise resume tests pin (fused on CPU is another kernel in torch 2.4)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if p.ndim >= 2 and not n.endswith(NO_DECAY_SUFFIXES)]
    other = [p for n, p in named if p.ndim < 2 or n.endswith(NO_DECAY_SUFFIXES)]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": other, "weight_decay": 0.0}]
    cuda = all(p.is_cuda for _, p in named) and bool(named)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                             fused=True if cuda else None)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine to min_ratio at `total` (step counts from 0)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    span = max(total - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_scheduler(opt, cfg: TrainConfig, total_steps: int):
    warmup = min(cfg.warmup_steps, total_steps)
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, warmup, total_steps, cfg.min_lr_ratio))


DEVICE_FLAGS = ("fused", "foreach", "capturable")
"""Param-group settings that depend on the device, not on the run: a resume must keep the
ones make_optimizer chose here (load_state_dict replaces them with the saved ones)."""


def device_flags(opt: torch.optim.Optimizer) -> list[dict]:
    """Each group's DEVICE_FLAGS, as the optimiser was built."""
    return [{k: g[k] for k in DEVICE_FLAGS if k in g} for g in opt.param_groups]


def restore_device_flags(opt: torch.optim.Optimizer, built: list[dict]) -> None:
    """After load_state_dict: the groups' device flags as built for this device (a CPU state
    resumed on CUDA keeps the fused kernel, a CUDA state on CPU drops it), and every step
    counter where those flags read it: on the parameter's device for fused/capturable, on
    the host otherwise (torch 2.4 leaves it where the saved flags wanted it)."""
    for group, want in zip(opt.param_groups, built, strict=True):
        group.update(want)
        on_device = bool(group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            state = opt.state.get(p)
            if state and torch.is_tensor(state.get("step")):
                where = p.device if on_device else torch.device("cpu")
                state["step"] = state["step"].to(device=where, dtype=torch.float32)
