"""The training config: one frozen, typed dataclass, two presets, file and key=value overrides,
resolved in that order (then `--arm`/`--seed`); a bad key, type or combination is a
ConfigError naming the field before any work starts.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from aleph._fields import AT_LEAST_0, POSITIVE, POSITIVE_INT, Rule, check_fields, rule
from aleph._io import short_repr
from aleph.env import laws
from aleph.errors import ConfigError
from aleph.model.config import Arm, ModelConfig, ModelShape
from aleph.sync.dest import check_spec
from aleph.train.config_text import coerce, fields_help, load_file, parse_override, with_suggestion

REDACTED = "<redacted>"


def knob(default: Any, *checks: Rule, resumable: bool, basis: bool, secret: bool = False,
         term: str | None = None):
    """A TrainConfig field with its value rules (`checks`, aleph._fields) and its facts,
    declared where the field is:
    resumable: may change between launches of one run (check_same_run lets it);
    basis: defines which runs compare (`aleph report`: equal values, arm and seed aside);
    secret: never written to a file, log or echo;
    term: the field is the weight of this term of the objective (aleph.model.objective)."""
    facts = {"resumable": resumable, "basis": basis, "secret": secret, "checks": checks}
    return field(default=default, metadata=facts if term is None else {**facts, "term": term})


# ModelConfig fields TrainConfig does not carry: they come from the data (or, arm, from above).
MODEL_FIELDS_FROM_DATA = ("vocab_size", "pad_id", "out_dim")

SOME_TERM = rule(lambda v, c: any(w > 0 for w in loss_weights(c).values()),
                 lambda c: " or ".join(f.name for f in fields(c) if "term" in f.metadata)
                 + " > 0 (all are 0: nothing to train)")  # declared by every loss weight


@dataclass(frozen=True)
class TrainConfig(ModelShape):
    """Every knob of one training run; see docs on each field. The encoder's shape fields
    (max_len ... checkpointing) are ModelShape's, with their rules and docstrings there."""

    # --- identity -------------------------------------------------------------------
    arm: Arm = knob("a2_dense", resumable=False, basis=False)
    """Model arm: a1_anchored (learned anchors), a2_dense (dense control), a3_random (frozen anchors)."""
    seed: int = knob(0, AT_LEAST_0, resumable=False, basis=False)
    """Seed of the model init, the data order (permutation of epoch e derives from (seed, e)) and dropout."""
    preset: str = knob("e1", resumable=False, basis=True)
    """Name of the preset the config started from: it names the run directory (README.md) and,
    for e1, requires 768-wide targets unless target_dim says otherwise."""

    # --- data -----------------------------------------------------------------------
    smoke_data: bool = knob(False, resumable=False, basis=True)
    """Use the embedded, generated smoke data under <work>/data/smoke-<smoke_rows> (offline). Then captions,
    targets and tokenizer must be left empty: they come from the smoke data."""
    smoke_rows: int = knob(4096, POSITIVE_INT, resumable=False, basis=True)
    """Rows of the generated smoke data (only with smoke_data); each size has its own directory."""
    captions: str = knob("", resumable=False, basis=False)
    """Caption source: a text/jsonl/json/parquet file or a HF dataset id (row i pairs with target row i)."""
    captions_column: str = knob("caption", resumable=False, basis=True)
    """Field (JSON/JSONL), column (parquet) or dataset column holding the caption text."""
    targets: tuple[str, ...] = knob((), resumable=False, basis=False)
    """Target sources: the chunk files (or one directory of them) of the 768-d teacher consensus."""
    target_dim: int = knob(0, AT_LEAST_0, resumable=False, basis=True)
    """Width the targets must have: 0 = 768 (E1's teacher consensus) for the e1 preset, any
    width for other presets; set it to train an e1 arm on targets of another width on purpose."""
    tokenizer: str = knob("bert-base-uncased", resumable=False, basis=False)
    """Tokenizer name (HF hub) or local directory; copied into the run directory. Empty with
    smoke_data: the smoke data's own tokenizer."""
    hf_token: str | None = knob(None, resumable=True, basis=False, secret=True)
    """Token for gated HF downloads of captions or tokenizer, exported as HF_TOKEN for
    huggingface_hub (secret: redacted in every echo and in config.json)."""
    store_implementation: Literal["auto", "streaming", "in_ram"] = knob("auto", resumable=True, basis=False)
    """Target store: 'auto' lets the store's quota planner choose (choice and reason are logged),
    or force 'streaming' (memmap) or 'in_ram'."""
    store_headroom_gib: float = knob(16.0, AT_LEAST_0, resumable=True, basis=False)
    """Memory the target store planner keeps free beside the store for the rest of the process,
    in GiB: an implementation is allowed when its predicted peak <= memory limit - headroom
    (capped at a quarter of the limit, aleph/targets/plan.py)."""
    store_override: bool = knob(False, resumable=True, basis=False)
    """Build the store_implementation given even when the quota planner refuses it (e.g. the
    seed's a1 in-RAM store), logged with the plan's reason; without it such a launch exits 2."""
    allow_input_change: bool = knob(False, resumable=True, basis=False)
    """Let a resumed launch continue although its target or token store's content differs from
    what the run trained on so far (logged, recorded as input_change_allowed)."""
    allow_misaligned: bool = knob(False, resumable=True, basis=False)
    """Train an e1 run although the preflight's alignment check (`aleph data check-align` on a
    sample) finds caption row i does not pair with target row i (recorded as
    misalignment_allowed)."""

    # --- objective ------------------------------------------------------------------
    tau: float = knob(0.07, POSITIVE, resumable=False, basis=True)
    """InfoNCE temperature of the distillation loss."""
    w_nce: float = knob(1.0, AT_LEAST_0, SOME_TERM, resumable=False, basis=True, term="nce")
    """Weight of the symmetric InfoNCE term."""
    w_mse: float = knob(1.0, AT_LEAST_0, SOME_TERM, resumable=False, basis=True, term="mse")
    """Weight of the per-sample MSE-to-target term."""

    # --- optimisation ---------------------------------------------------------------
    batch_size: int = knob(256, POSITIVE_INT, resumable=False, basis=True)
    """GLOBAL batch (rows per optimiser step, summed over all ranks; each rank takes
    batch_size / world_size). The InfoNCE negatives are the whole global batch. E1's value is
    not public: 256 is our choice."""
    lr: float = knob(5e-4, POSITIVE, resumable=False, basis=True)
    """Peak AdamW learning rate, the same for any world size (the global batch is fixed).
    E1's value is not public: 5e-4 is our choice for a 12x512 encoder at batch 256."""
    weight_decay: float = knob(0.01, AT_LEAST_0, resumable=False, basis=True)
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = knob((0.9, 0.999), rule(
        lambda v, c: all(0 <= b < 1 for b in v), "two numbers in [0, 1)"), resumable=False, basis=True)
    """AdamW betas."""
    eps: float = knob(1e-8, POSITIVE, resumable=False, basis=True)
    """AdamW epsilon."""
    warmup_steps: int = knob(2000, AT_LEAST_0, resumable=False, basis=True)
    """Linear warmup steps: step k < warmup uses lr * (k+1)/warmup. Then cosine decay that reaches
    min_lr_ratio * lr at the end of the schedule (the last step itself is one cosine step above it)."""
    min_lr_ratio: float = knob(0.0, rule(lambda v, c: 0 <= v <= 1, "a number in [0, 1]"),
                               resumable=False, basis=True)
    """Floor of the cosine decay, as a fraction of lr."""
    grad_clip: float = knob(1.0, AT_LEAST_0, resumable=False, basis=True)
    """Clip the global grad norm to this (0 disables clipping; the norm is still checked finite)."""
    epochs: int = knob(4, POSITIVE_INT, resumable=False, basis=True)
    """Passes over the rows (E1: 4). The last incomplete global batch of each epoch is dropped."""
    max_steps: int = knob(0, AT_LEAST_0, resumable=False, basis=True)
    """Stop after this many optimiser steps (0 = all epochs). The schedule still spans all epochs
    unless max_steps is smaller, in which case it spans max_steps."""

    # --- execution ------------------------------------------------------------------
    device: Literal["auto", "cpu", "cuda"] = knob("auto", resumable=True, basis=True)
    """'auto' (CUDA when available), 'cpu' or 'cuda'."""
    bf16: bool = knob(True, resumable=False, basis=True)
    """bf16 autocast of the forward pass on CUDA (ignored on CPU, where it is always fp32)."""
    compile: bool = knob(False, resumable=False, basis=True)
    """torch.compile the model in place. Exclusive with checkpointing on torch 2.4 (law 2)."""
    alloc_cap_fraction: float | None = knob(None, rule(
        lambda v, c: v is None or 0 < v <= 1, "a fraction in (0, 1] or null"), resumable=True, basis=False)
    """torch.cuda.set_per_process_memory_fraction for the training GPU (None = no cap)."""
    vram_probe: bool = knob(True, resumable=True, basis=False)
    """Require the VRAM probe to pass on CUDA (free memory >= vram_required_gib) before building."""
    vram_required_gib: float = knob(0.0, AT_LEAST_0, resumable=True, basis=False)
    """Free GPU memory the run needs; 0 = estimate from parameters, optimiser state and batch."""
    num_threads: int = knob(0, AT_LEAST_0, resumable=True, basis=True)
    """torch CPU threads (0 = torch's default)."""
    deterministic: bool = knob(False, resumable=False, basis=True)
    """torch.use_deterministic_algorithms(True): bitwise-repeatable runs (slower on CUDA; sets
    CUBLAS_WORKSPACE_CONFIG=:4096:8 unless already set, as cuBLAS requires)."""

    # --- cadence --------------------------------------------------------------------
    ckpt_every_steps: int = knob(2000, AT_LEAST_0, resumable=True, basis=False)
    """Write resume state every this many steps (0 = never by step count)."""
    ckpt_every_minutes: float = knob(30.0, AT_LEAST_0, resumable=True, basis=False)
    """Also write resume state when this many minutes passed since the last one (0 = never)."""
    keep_checkpoints: int = knob(2, rule(
        lambda v, c: v >= 2, "at least 2 (a torn newest state must leave an older one)"), resumable=True, basis=False)
    """Complete resume states kept (at least 2, so a torn newest one still leaves one)."""
    weights_every_steps: int = knob(0, AT_LEAST_0, resumable=True, basis=False)
    """Export periodic weights to weights/step-N every this many steps (0 = final only)."""
    log_every_steps: int = knob(50, POSITIVE_INT, resumable=True, basis=False)
    """TensorBoard scalar cadence in steps (health gauges at the same cadence)."""
    progress_every_seconds: float = knob(30.0, POSITIVE, resumable=True, basis=False)
    """Console progress/ETA line cadence."""
    collective_timeout_s: float = knob(600.0, rule(  # heartbeats every timeout/4, <= 5 s
        lambda v, c: v >= 1, "a number of seconds >= 1"), resumable=True, basis=False)
    """Under torchrun: a collective that waits longer than this fails, naming the rank that
    stopped answering (by its heartbeat in the c10d store). Rank 0's long one-off work
    (store builds, resume-state saves) is waited for by polling, so it never trips this."""
    heartbeat_seconds: float = knob(5.0, POSITIVE, resumable=True, basis=False)
    """Rewrite launches/<launch id>.heartbeat.json (step, RSS, memory cgroup) every this many
    seconds, so the next launch can say how a launch that vanished ended."""

    # --- off-box sync (aleph.sync) -------------------------------------------------------
    sync_to: str = knob("", rule(lambda v, c: not (v and check_spec(v)),
                                   lambda c: f"empty (off) or {check_spec(c.sync_to)}"), resumable=True, basis=False)
    """Where the run is copied while it trains, so a lost VM loses little: empty = off;
    hf:<namespace>/<repo> (a hub model repo, created private; token from HF_TOKEN or hf_token,
    never written to any file or log) or an existing directory as an absolute path (a mounted
    bucket, NFS share, second disk). `aleph runs pull` restores the run elsewhere."""
    sync_every_minutes: float = knob(30.0, AT_LEAST_0, resumable=True, basis=False)
    """Least minutes between two syncs while training, each after a complete resume state
    (0 = after every one); a final sync comes at the end and at a stop."""
    sync_stop_wait_seconds: float = knob(120.0, AT_LEAST_0, resumable=True, basis=False)
    """At a stop, the most seconds the launch waits for the push in flight and the final
    push before it exits (a further stop signal ends the wait at once); the destination
    keeps its previous snapshot and `aleph runs push` sends the rest. Our choice: well
    inside the Slurm lead (300 s), which must also cover one step and one save."""

    # --- the encoder's shape: ModelShape's fields; only dropout's default differs ----
    dropout: float = field(default=0.1, metadata=ModelShape.__dataclass_fields__["dropout"].metadata)
    """Dropout on embeddings, attention probabilities and block outputs. E1's value is not
    public: 0.1 (BERT's) is our choice for training (ModelConfig's 0 is inference's)."""

    def __post_init__(self) -> None:
        check_fields(self, "config field {!r}")  # each field's type and rules
        _check_sources(self)
        laws.check_compile_checkpointing(self.compile, self.checkpointing)


def _check_sources(c: TrainConfig) -> None:
    """The data fields as a whole: the smoke data, or captions, targets and tokenizer."""
    def bad(name: str, expected: str) -> ConfigError:
        return ConfigError(f"config field {name!r}: got {short_repr(getattr(c, name))}, expected {expected}")

    if c.smoke_data:
        for name in ("captions", "targets"):
            if getattr(c, name):
                raise bad(name, "empty with smoke_data=true (the smoke data provides it)")
        return
    if not c.captions:
        raise bad("captions", "a caption file or HF dataset id (or smoke_data=true)")
    if not c.targets:
        raise bad("targets", "one or more target chunk files or a directory (or smoke_data=true)")
    if not c.tokenizer:
        raise bad("tokenizer", "a tokenizer name or directory (empty only with smoke_data=true)")


def loss_weights(cfg: TrainConfig) -> dict[str, float]:
    """{term of the objective: its weight}, from the fields declared with `term=`."""
    return {f.metadata["term"]: getattr(cfg, f.name) for f in fields(cfg) if "term" in f.metadata}


# --- presets ----------------------------------------------------------------------------

PRESETS: dict[str, dict[str, Any]] = {
    # E1 as published: 12x512x8, FFN 2048 (bank 512 + 3x512), 31.9M rows x 4 epochs. The
    # sources are given by path (--set captions=... --set targets=...); batch and LR are ours.
    "e1": {"preset": "e1"},
    # A tiny model on the embedded smoke data: finishes in well under a minute on 2 CPU
    # cores with the loss clearly falling; every output of a real run is produced.
    "smoke": {
        "preset": "smoke", "smoke_data": True, "smoke_rows": 4096, "tokenizer": "",
        "max_len": 32, "d_model": 64, "n_layers": 2, "n_heads": 4, "ffn_dense": 256,
        "ffn_expert": 64, "dropout": 0.0, "batch_size": 64, "lr": 2e-3, "warmup_steps": 20,
        "epochs": 2, "ckpt_every_steps": 50, "ckpt_every_minutes": 0.0, "log_every_steps": 5,
        "progress_every_seconds": 5.0, "weights_every_steps": 64, "device": "cpu",
        # One thread: the matrices are tiny, so thread synchronisation costs more than it
        # saves (measured 68 ms/step at 1 thread vs 700 ms at 2 on a loaded 2-core box).
        "deterministic": True, "num_threads": 1,
    },
}


def resolve(preset: str = "e1", file: str | None = None, overrides: list[str] | None = None,
            **direct: Any) -> TrainConfig:
    """Build the frozen config; unknown keys raise ConfigError naming them."""
    hints = typing.get_type_hints(TrainConfig)
    if preset not in PRESETS:
        raise ConfigError(f"preset {preset!r}: expected one of {', '.join(PRESETS)}")
    values: dict[str, Any] = dict(PRESETS[preset])
    layers: list[tuple[str, dict[str, Any]]] = []
    if file:
        data = load_file(file)
        layers.append((f"config file {file}", {k: coerce(hints.get(k), v) for k, v in data.items()}))
    layers.append(("--set", dict(parse_override(o, hints) for o in overrides or [])))
    layers.append(("command line", {k: v for k, v in direct.items() if v is not None}))
    known = {f.name for f in fields(TrainConfig)}
    for origin, layer in layers:
        unknown = sorted(set(layer) - known)
        if unknown:
            raise ConfigError(f"{origin}: unknown config field(s) "
                              f"{', '.join(with_suggestion(k, known) for k in unknown)}; "
                              "`aleph train --help` lists every field")
        values.update(layer)
    return TrainConfig(**values)


def help_text() -> str:
    """Every field, its type, default and docstring's first line: `aleph train --help`."""
    return fields_help(TrainConfig, PRESETS)


def model_config(cfg: TrainConfig, vocab_size: int, pad_id: int, out_dim: int = 768) -> ModelConfig:
    """The ModelConfig of a run: its arm and shape (TrainConfig inherits ModelShape, so
    `--set d_model=...` works), plus the data's sizes."""
    shape = {f.name: getattr(cfg, f.name) for f in fields(ModelShape)}
    return ModelConfig(**shape, arm=cfg.arm, vocab_size=vocab_size, pad_id=pad_id, out_dim=out_dim)


def to_dict(cfg: TrainConfig, redact: bool = True) -> dict[str, Any]:
    """JSON-able dict of the config; secrets replaced by a marker unless redact=False."""
    d = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()}
    if redact:
        d.update({name: REDACTED for name in SECRET_FIELDS if d.get(name)})
    return d


def echo(cfg: TrainConfig) -> str:
    """One-line, key-sorted, redacted echo for the launch header."""
    return json.dumps(to_dict(cfg), sort_keys=True, separators=(",", ":"))


def _facts(name: str) -> dict[str, Any]:
    return {f.name: f.metadata[name] for f in fields(TrainConfig) if name in f.metadata}


RESUMABLE_CHANGES = frozenset(k for k, v in _facts("resumable").items() if v)
"""Fields that may change between launches of one run: they do not change what the run
trains, but num_threads and device change the floating-point rounding (each launch records
its execution facts; `aleph runs diff` names such a change as not bitwise comparable)."""
RETIRED = frozenset({"defer_step_sync"})
"""Fields the config.json of an earlier version holds that no longer exist: none changed what
was computed, so reading one back ignores it (resume, relaunch, comparisons)."""
OPERATIONAL = frozenset(k for k, v in _facts("basis").items() if not v) | RETIRED
"""Fields that do not define a run's comparability basis (arm and seed are compared apart)."""
SECRET_FIELDS = tuple(k for k, v in _facts("secret").items() if v)


def check_same_run(saved: dict[str, Any], cfg: TrainConfig) -> None:
    """Refuse to resume a run directory with a config that computes something else."""
    now = to_dict(cfg)
    diff = sorted(k for k in set(saved) | set(now)
                  if k not in RESUMABLE_CHANGES | RETIRED and saved.get(k) != now.get(k))
    detail = "; ".join(f"{k}: run has {saved.get(k)!r}, launch asks {now.get(k)!r}" for k in diff)
    if diff:
        raise ConfigError(f"this run directory was started with a different config ({detail}); "
                          "use another --seed/arm or remove the run directory")

