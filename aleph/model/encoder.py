"""The AlephLM-0 sentence encoder: embeddings, pre-LN transformer blocks, mean pooling,
projection to the target width, L2 normalisation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint  # explicit: torch 2.4.1 does not import it with `import torch`
from torch import nn

from aleph.env.hostinfo import meminfo_bytes
from aleph.errors import ConfigError
from aleph.model.bank import AnchoredBank, DenseFFN, init_matrix, tensors_to_floats
from aleph.model.config import ModelConfig

_STD = 0.02  # embeddings, under either init scheme


def key_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, 1, L) additive attention bias of a (B, L) key mask (True = real token): 0 on
    real keys, -inf on padding, the values SDPA makes of a boolean mask (it would make them
    again in every layer; the encoder builds them once per forward)."""
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)  # (B, L)
    return bias.masked_fill_(~mask, float("-inf"))[:, None, None, :]  # (B, 1, 1, L)


class Attention(nn.Module):
    """Multi-head self-attention through scaled_dot_product_attention, with an additive key
    bias or none (no padding: SDPA may then pick its flash kernel)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x (B, L, D); bias (B, 1, 1, L) of key_bias, or None when no key is padding."""
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.n_heads, d // self.n_heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, L, Dh) each
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p)  # (B, H, L, Dh)
        return self.out(y.transpose(1, 2).reshape(b, n, d))  # (B, L, D)


class Block(nn.Module):
    """Pre-LN block: x + attn(LN(x)), then x + ffn(LN(x)); ffn is dense (a2) or the bank."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        if cfg.is_bank:
            self.ffn = AnchoredBank(cfg.d_model, cfg.ffn_expert, cfg.n_anchors, cfg.address_tau,
                                    cfg.gate_init, learned_anchors=cfg.arm == "a1_anchored",
                                    init=cfg.init)
        else:
            self.ffn = DenseFFN(cfg.d_model, cfg.ffn_dense, cfg.init)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None,
                mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x), bias))  # (B, L, D)
        return x + self.drop(self.ffn(self.ln2(x), mask))  # (B, L, D)


class AlephEncoder(nn.Module):
    """input_ids (B, L) long, attention_mask (B, L) bool -> (B, out_dim) unit vectors."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.out_dim)
        self._init_weights()

    def _init_weights(self) -> None:
        """Embeddings normal(0, 0.02); attention and projection matrices by `config.init`
        (the FFNs initialise themselves the same way); biases zero."""
        for m in (self.tok, self.pos):
            nn.init.normal_(m.weight, std=_STD)
        for blk in self.blocks:
            for lin in (blk.attn.qkv, blk.attn.out):
                init_matrix(lin.weight, self.config.init)
                nn.init.zeros_(lin.bias)
        init_matrix(self.proj.weight, self.config.init)
        nn.init.zeros_(self.proj.bias)

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """attention_mask None: every slot is a real token, and no attention mask is passed
        (SDPA may pick its flash kernel). The mask is never read here (on a GPU that would
        be a host sync): a caller whose host batch has no padding passes None."""
        n = input_ids.shape[1]
        if n > self.config.max_len:
            raise ValueError(f"input length {n} exceeds ModelConfig.max_len {self.config.max_len}")
        mask = None if attention_mask is None else attention_mask.bool()  # (B, L) True on real
        pos = torch.arange(n, device=input_ids.device)  # (L,)
        x = self.drop(self.tok(input_ids) + self.pos(pos))  # (B, L, D)
        # Rows must hold >= 1 real token (tokenizers always add [CLS]/[SEP]): an all-padding
        # row gives a NaN softmax. The bias has the dtype of the attention's q (autocast's).
        dev = input_ids.device.type
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        bias = None if mask is None else key_bias(mask, dtype)  # (B, 1, 1, L)
        for blk in self.blocks:
            if self.config.checkpointing and self.training:
                # Not under torch.compile: on torch 2.4 the recompute re-enters dynamo and fails.
                x = torch.utils.checkpoint.checkpoint(blk, x, bias, mask, use_reentrant=False)
            else:
                x = blk(x, bias, mask)  # (B, L, D)
        x = self.ln_f(x)  # (B, L, D)
        if mask is None:
            pooled = x.mean(dim=1)  # (B, D)
        else:
            m = mask.unsqueeze(-1).to(x.dtype)  # (B, L, 1)
            pooled = (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)  # (B, D) mean of real tokens
        return F.normalize(self.proj(pooled).float(), dim=-1)  # (B, out_dim)

    def banks(self) -> list[AnchoredBank]:
        return [blk.ffn for blk in self.blocks if isinstance(blk.ffn, AnchoredBank)]

    def set_dispatch(self, enabled: bool) -> None:
        """Dispatch off = every bank runs its trunk only (the evaluation's toggle); no-op for a2."""
        for bank in self.banks():
            bank.dispatch = bool(enabled)

    def set_gauges(self, enabled: bool) -> None:
        """Whether the next forwards record the address statistics health() reports (the
        trainer: only on the steps that log gauges; eager mode then skips their ops)."""
        for bank in self.banks():
            bank.gauges = bool(enabled)

    def health(self) -> dict[str, float]:
        """Per-layer gauges `layerNN/<gauge>` of the bank arms; {} for a2. One host transfer
        for all of them (about 108 gauges at E1: one sync each would stall a GPU step)."""
        out: dict[str, torch.Tensor] = {}
        for i, blk in enumerate(self.blocks):
            if isinstance(blk.ffn, AnchoredBank):
                out.update({f"layer{i:02d}/{k}": v for k, v in blk.ffn.health_tensors().items()})
        return tensors_to_floats(out)


def model_bytes(cfg: ModelConfig) -> int:
    """Bytes of `cfg`'s parameters and buffers, counted on the meta device (nothing allocated,
    no random number drawn)."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = AlephEncoder(cfg)
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def check_fits(cfg: ModelConfig, available: int | None) -> None:
    """ConfigError (one line: the shape, bytes needed vs available) when the model alone
    cannot fit `available` bytes: a huge d_model is refused, not left to the allocator."""
    need = model_bytes(cfg)
    if available is not None and need > available:
        raise ConfigError(
            f"model shape d_model={cfg.d_model}, n_layers={cfg.n_layers}, max_len={cfg.max_len}, "
            f"vocab_size={cfg.vocab_size}: its weights alone need {need:,} B, {available:,} B of "
            "memory is available; expected a shape that fits")


def build_model(cfg: ModelConfig) -> AlephEncoder:
    """A freshly initialised encoder for `cfg` (seed torch's RNG first for reproducibility);
    a shape whose weights exceed the memory available is refused first (check_fits)."""
    check_fits(cfg, meminfo_bytes("MemAvailable"))
    return AlephEncoder(cfg)


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Parameter counts: `trainable`, and `total` = trainable + a3's frozen anchors (a buffer,
    but the K x D numbers a1 learns): the figure compared across arms (a1 == a3 exactly,
    both within 0.1% of a2 at E1). `anchors_init` and the health buffers never count."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    for name, buf in model.named_buffers():
        if name.endswith("address.anchors"):
            frozen += buf.numel()
    return {"trainable": trainable, "total": trainable + frozen}
