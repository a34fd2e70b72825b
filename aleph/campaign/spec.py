"""What a campaign runs (arms x seeds of one config) and where (GPUs or CPU slots).

The config is resolved here, once per (arm, seed), through the trainer's own resolver
(aleph.train.config.resolve) before anything is launched: a bad field fails the campaign
at once with the trainer's one-line message, not six times in six launch logs.

Secret fields (aleph.train.config.SECRET_FIELDS: hf_token) given with --set never reach a
child's command line, campaign.json or a log: make_spec takes them out of the overrides and
each child gets them in its environment, as the variable the trainer exports them under
(hf_token: HF_TOKEN, read there by huggingface_hub and the hub destination).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from aleph.env.hostinfo import format_cpulist
from aleph.errors import ConfigError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class Spec:
    """The identity of a campaign: a restart must name the same one (devices may change)."""

    name: str
    preset: str
    config: str | None
    overrides: tuple[str, ...]
    arms: tuple[str, ...]
    seeds: tuple[int, ...]
    # Secret field -> value, from --set: never in the identity, an argv or a repr.
    secrets: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def identity(self) -> dict[str, Any]:
        return {"preset": self.preset, "config": self.config, "overrides": list(self.overrides),
                "arms": list(self.arms), "seeds": list(self.seeds)}

    def runs(self) -> list[tuple[str, str, int]]:
        """(run id, arm, seed) in queue order: seed by seed, the arms of a seed together
        (as the seed's box ran them: a1 and a3 of one seed side by side)."""
        return [(f"{arm}-s{seed}", arm, seed) for seed in self.seeds for arm in self.arms]

    def config_args(self) -> list[str]:
        """The campaign's config as `aleph train` takes it: --preset, --config, --set."""
        args = ["--preset", self.preset] + (["--config", self.config] if self.config else [])
        return args + [word for item in self.overrides for word in ("--set", item)]

    def train_args(self, arm: str, seed: int) -> list[str]:
        """`aleph train` arguments of one run: this arm and seed, the campaign's config."""
        return ["--arm", arm, "--seed", str(seed), *self.config_args()]

    def secret_env(self) -> dict[str, str]:
        """The environment that carries the secrets to a child (hf_token: HF_TOKEN)."""
        return {name.upper(): value for name, value in self.secrets.items()}


def _is_secret(item: str) -> bool:
    """Whether a `--set` item sets a secret field (its key as parse_override reads it)."""
    from aleph.train.config import SECRET_FIELDS

    return item.partition("=")[0].strip() in SECRET_FIELDS


def split_secrets(overrides: list[str]) -> tuple[list[str], dict[str, str]]:
    """(`--set` items without the secret fields, {secret field: its value})."""
    from aleph.train.config_text import parse_override

    public = [item for item in overrides if not _is_secret(item)]  # checked by the resolver
    secrets = [parse_override(item) for item in overrides if _is_secret(item)]
    # an empty value sets no secret (the child keeps its own HF_TOKEN)
    return public, {key: str(value) for key, value in secrets if value}


def redact_overrides(overrides: list[str]) -> list[str]:
    """`--set` items as they may be recorded: each secret's value replaced by the marker."""
    from aleph.train.config import REDACTED

    return [f"{item.partition('=')[0].strip()}={REDACTED}" if _is_secret(item) else item
            for item in overrides]


def make_spec(name: str | None, preset: str, config: str | None, overrides: list[str],
              arms: list[str], seeds: list[int]) -> Spec:
    from aleph.model.config import ARMS

    for arm in arms:
        if arm not in ARMS:
            raise ConfigError(f"--arms: {arm!r} is not an arm; expected some of {', '.join(ARMS)}")
    for what, values in (("--arms", arms), ("--seeds", seeds)):
        if not values:
            raise ConfigError(f"{what}: give at least one")
        if dup := sorted({str(v) for v in values if values.count(v) > 1}):
            raise ConfigError(f"{what}: {', '.join(dup)} given more than once")
    if negative := [seed for seed in seeds if seed < 0]:
        raise ConfigError(f"--seeds: {negative[0]} is negative; seeds are integers >= 0")
    if name is None:
        name = os.path.splitext(os.path.basename(config))[0] if config else preset
    if not NAME_RE.fullmatch(name):
        raise ConfigError(f"--name {name!r}: expected 1-64 letters, digits, '.', '_' or '-' "
                          "(it names a directory under <work root>/campaigns/)")
    config = os.path.abspath(config) if config else None
    public, secrets = split_secrets(overrides)
    return Spec(name, preset, config, tuple(public), tuple(arms), tuple(seeds), secrets)


def resolve_configs(spec: Spec) -> dict[str, Any]:
    """run id -> the resolved TrainConfig of that run (ConfigError names the field)."""
    from aleph.train.config import resolve

    return {rid: resolve(spec.preset, spec.config, list(spec.overrides), arm=arm, seed=seed)
            for rid, arm, seed in spec.runs()}


# --- devices ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Device:
    """One place a run can train: a GPU or a CPU slot. One run at a time per device."""

    name: str  # "gpu0", "cpu1": how the state file and the logs name it
    kind: str  # "cuda" or "cpu"
    cuda_visible: str  # CUDA_VISIBLE_DEVICES of a run on it ("" on a CPU slot: no GPU)
    cpus: tuple[int, ...] | None = None  # CPU affinity of a run on a CPU slot (None: inherited)

    def describe(self) -> str:
        if self.kind == "cuda":
            return f"{self.name} (CUDA_VISIBLE_DEVICES={self.cuda_visible})"
        where = f"CPUs {format_cpulist(self.cpus)}" if self.cpus else "CPU affinity inherited"
        return f"{self.name} ({where}, no GPU)"


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def parse_devices(text: str, gpu_count=_gpu_count, visible: str | None = None,
                  cpus: set[int] | None = None) -> list[Device]:
    """`--devices`: auto | all | GPU indices "0,1" | cpu:N (N CPU slots).

    GPU indices count the GPUs this process sees; when CUDA_VISIBLE_DEVICES is set, index i
    is its i-th entry, so a run on "gpu1" gets that entry as its only visible device. CPU
    slots split this process's CPU affinity into N contiguous groups (one per slot) when
    there are at least N CPUs; otherwise the runs share them.
    """
    text = text.strip()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if text.startswith("cpu:"):
        n = int(text[4:]) if text[4:].isdecimal() else 0
        if n < 1:
            raise ConfigError(f"--devices {text!r}: expected cpu:N with N >= 1 CPU slots")
        mine = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
        groups: list[tuple[int, ...] | None] = [None] * n
        if len(mine) >= n:
            groups = [tuple(mine[i * len(mine) // n:(i + 1) * len(mine) // n]) for i in range(n)]
        return [Device(f"cpu{i}", "cpu", "", g) for i, g in enumerate(groups)]
    if text == "auto":
        return parse_devices("all", gpu_count, visible) if gpu_count() else parse_devices("cpu:1")
    count = gpu_count()
    if text == "all":
        if count == 0:
            raise ConfigError("--devices all: no CUDA device is visible; use cpu:N for N CPU slots")
        indices = list(range(count))
    else:
        try:
            indices = [int(x) for x in text.split(",")]
        except ValueError:
            raise ConfigError(f"--devices {text!r}: expected auto, all, GPU indices such as 0,1, "
                              "or cpu:N") from None
        if dup := sorted({i for i in indices if indices.count(i) > 1}):
            raise ConfigError(f"--devices {text!r}: GPU {dup[0]} given more than once")
        if bad := [i for i in indices if not 0 <= i < count]:
            raise ConfigError(f"--devices {text!r}: GPU {bad[0]} does not exist; this process "
                              f"sees {count} CUDA device(s) (indices 0-{count - 1})"
                              if count else f"--devices {text!r}: no CUDA device is visible; "
                              "use cpu:N for N CPU slots")
    entries = [v.strip() for v in visible.split(",")] if visible else None
    return [Device(f"gpu{i}", "cuda", entries[i] if entries and i < len(entries) else str(i))
            for i in indices]


def check_devices(configs: dict[str, Any], devices: list[Device]) -> None:
    """Refuse a config whose `device` contradicts the devices (one line, naming the run)."""
    kind = devices[0].kind
    for rid, cfg in configs.items():
        if kind == "cuda" and cfg.device == "cpu":
            raise ConfigError(f"{rid}: config field 'device' is 'cpu' but --devices names GPUs; "
                              "add --set device=cuda (the smoke preset trains on CPU), or use "
                              "--devices cpu:N")
        if kind == "cpu" and cfg.device == "cuda":
            raise ConfigError(f"{rid}: config field 'device' is 'cuda' but --devices gives CPU "
                              "slots (a run on a CPU slot sees no GPU); use GPU indices or "
                              "--set device=cpu")
