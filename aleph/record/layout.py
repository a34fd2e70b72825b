"""The run directory's layout, defined once: every name the trainer writes under `runs/<name>/`.

    runs/<name>/
      config.json            the run's config (first launch; replaced until a resume state exists)
      manifest.json          launches, inputs, store, execution facts, end status
      metrics.json           the last step's figures and the carried-over totals
      run.lock               flock of the live launch (a duplicate exits 75)
      launches/<id>.log      one console log per launch (rank r > 0: <id>.rank<r>.log)
      launches/<id>.heartbeat.json, <id>.executed.json
      checkpoints/step-NNNNNNNN/   resume states (COMPLETE marker last)
      weights/final/         final weights (model.safetensors + model_config.json)
      weights/step-NNNNNNNN/ periodic weights (weights_every_steps)
      tb/                    TensorBoard events
      tokenizer/             the run's own copy of its tokenizer
      eval.json              what `aleph eval` measured

Train writes it; eval, report, campaign and sync read it, all through `RunLayout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIG = "config.json"
MANIFEST = "manifest.json"
METRICS = "metrics.json"
EVAL = "eval.json"
LOCK = "run.lock"
LAUNCHES = "launches"
CHECKPOINTS = "checkpoints"
WEIGHTS = "weights"
FINAL = "final"
TB = "tb"
TOKENIZER = "tokenizer"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class RunLayout:
    """Paths of one run directory."""

    dir: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir))

    @property
    def config(self) -> Path:
        return self.dir / CONFIG

    @property
    def manifest(self) -> Path:
        return self.dir / MANIFEST

    @property
    def metrics(self) -> Path:
        return self.dir / METRICS

    @property
    def eval(self) -> Path:
        return self.dir / EVAL

    @property
    def lock(self) -> Path:
        return self.dir / LOCK

    @property
    def launches(self) -> Path:
        return self.dir / LAUNCHES

    def launch_log(self, launch_id: str, rank: int = 0) -> Path:
        return self.launches / (f"{launch_id}.log" if rank == 0 else f"{launch_id}.rank{rank}.log")

    @property
    def checkpoints(self) -> Path:
        return self.dir / CHECKPOINTS

    @property
    def weights(self) -> Path:
        return self.dir / WEIGHTS

    @property
    def final_weights(self) -> Path:
        """weights/final/: the directory of the last step's weights."""
        return self.weights / FINAL

    @property
    def final_weights_file(self) -> Path:
        return self.final_weights / WEIGHTS_FILE

    def step_weights(self, step: int) -> Path:
        return self.weights / f"step-{step:08d}"

    @property
    def tb(self) -> Path:
        return self.dir / TB

    @property
    def tokenizer(self) -> Path:
        return self.dir / TOKENIZER
