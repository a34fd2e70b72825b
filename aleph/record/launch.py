"""The launch entries of `manifest.json` (`launches[]`): schema, statuses, actions, step ranges.

Every launch appends one entry and writes only its own, except to mark an earlier one
`lost` (with its heartbeat's diagnosis) when it died without recording its end. Fields
(docs/ARCHITECTURE.md has the full list): `status`, `exit_status`, `note`, `action`,
`steps` {from, to}, `code`, `environment`, `envelope`, `execution`, `inputs`.
"""

from __future__ import annotations

from dataclasses import dataclass

# 'running' while the launch lives; then 'complete', 'stopped' (SIGTERM/SIGINT: exit 76,
# resumable), 'failed' (with its exit status) or 'lost' (set by a later launch).
RUNNING, COMPLETE, STOPPED, FAILED, LOST = "running", "complete", "stopped", "failed", "lost"
STATUSES = (RUNNING, COMPLETE, STOPPED, FAILED, LOST)
# Note of a launch that found the run already finished and trained nothing (not a resume).
NOTHING_TO_TRAIN = "already complete"

# What a launch did for the run.
TRAINED, RESUMED, NOOP, REFUSED, NOTHING = (
    "trained", "resumed", "no-op: already complete", "refused", "nothing trained")
ACTIONS = (TRAINED, RESUMED, NOOP, REFUSED, NOTHING)
TRAINING_ACTIONS = (TRAINED, RESUMED)

# Execution facts of a launch that change the floating-point result, and why. A difference
# in any of them makes two runs (or two launches of one run) not bitwise comparable.
NUMERIC_FACTS: dict[str, str] = {
    "device": "CPU and CUDA kernels compute differently (and bf16 autocast applies only on CUDA)",
    "autocast": "bf16 autocast computes the forward pass in bfloat16",
    "num_threads": "the CPU intra-op thread count changes how reductions are split and summed",
    "deterministic": "torch.use_deterministic_algorithms selects other kernels",
    "compile": "torch.compile fuses kernels, which reorders floating-point operations",
    "world_size": "data-parallel ranks split the batch and reduce gradients in another order",
}
# Config fields behind those facts (config field -> execution fact).
NUMERIC_CONFIG_FIELDS = {"num_threads": "num_threads", "device": "device", "bf16": "autocast",
                         "deterministic": "deterministic", "compile": "compile"}


def choose_action(step_from: int | None, step_to: int | None, status: str, note: str,
                  refused: bool) -> str:
    """The action of a launch from what it reached (written by the trainer at its end)."""
    if step_from is None:  # it never reached the step loop
        return REFUSED if refused else NOTHING
    if step_to is not None and step_to > step_from:
        return RESUMED if step_from > 0 else TRAINED
    if status == COMPLETE and note.split(";")[0] == NOTHING_TO_TRAIN:  # "; SIGTERM after ..."
        return NOOP
    return NOTHING


@dataclass
class LaunchRecord:
    """One entry of `launches[]`, as read_launches reads it."""

    index: int  # 1-based position in launches[]
    entry: dict
    action: str
    steps: tuple[int | None, int | None] | None  # recorded (from, to); None: not recorded
    effective: tuple[int, int | None] | None  # the steps of this launch the run kept
    code: dict
    environment: dict | None
    envelope: dict | None
    execution: dict | None

    @property
    def launch_id(self) -> str:
        return str(self.entry.get("launch_id", f"#{self.index}"))

    @property
    def trained(self) -> bool:
        """Whether steps of this launch are part of the run's final state."""
        if self.action not in TRAINING_ACTIONS:
            return False
        if self.effective is None:  # no step record (legacy): assume it trained
            return True
        start, end = self.effective
        return end is None or end > start

    def label(self) -> str:
        """'launch 2 (<id>, steps 6-12)': the launch and the step range the run kept of it."""
        start, end = self.effective or (None, None)
        rng = "" if self.effective is None else f", steps {start}-{'?' if end is None else end}"
        return f"launch {self.index} ({self.launch_id}{rng})"


def _steps(entry: dict) -> tuple[int | None, int | None] | None:
    steps = entry.get("steps")
    if not isinstance(steps, dict):
        return None
    start, end = steps.get("from"), steps.get("to")
    return (start if isinstance(start, int) else None, end if isinstance(end, int) else None)


def read_launches(manifest: dict) -> list[LaunchRecord]:
    """Every launch of a manifest, with its effective step range: from the step it started
    at to the step it reached, cut where a later launch resumed from (steps a killed launch
    made after its last resume state were redone by the next one, so they are not kept)."""
    entries = [e for e in manifest.get("launches") or [] if isinstance(e, dict)]
    out = []
    for i, e in enumerate(entries, start=1):
        steps = _steps(e)
        effective = None
        if steps is not None and steps[0] is not None:
            start, end = steps
            for later in entries[i:]:  # the next launch that started the step loop
                nxt = _steps(later)
                if nxt is not None and nxt[0] is not None:
                    cut = nxt[0]
                    end = max(start, min(cut, end) if end is not None else cut)
                    break
            effective = (start, end)
        code, env, envelope, execution = (
            e.get(k) if isinstance(e.get(k), dict) else None
            for k in ("code", "environment", "envelope", "execution"))
        # no action yet (running, or lost before its first heartbeat): of unknown effect,
        # so it counts as one that trained
        action = e.get("action") if e.get("action") in ACTIONS else TRAINED
        out.append(LaunchRecord(i, e, action, steps, effective, code or {}, env, envelope,
                                execution))
    return out


def training_launches(manifest: dict) -> list[LaunchRecord]:
    """The launches whose steps the run kept, in order (none for a run that never trained)."""
    return [r for r in read_launches(manifest) if r.trained]


def reference_launch(manifest: dict) -> LaunchRecord | None:
    """The first launch that trained steps the run kept; else the first launch at all."""
    launches = read_launches(manifest)
    return next((r for r in launches if r.trained), launches[0] if launches else None)


def describe_lost(entry: dict) -> str:
    """The lost launch's diagnosis as recorded by the launch that found it, or ''."""
    lost = entry.get("lost")
    return str(lost.get("diagnosis", "")) if isinstance(lost, dict) else ""

