"""The site options of `aleph campaign --on slurm`, checked before anything is written or
submitted: each bad value is one ConfigError line naming the option.

Nothing here schedules: these values become `#SBATCH` lines and `srun` options in the
scripts aleph.campaign.slurm writes; Slurm does the rest.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass

from aleph.errors import ConfigError

LAUNCHERS = ("srun", "torchrun")
DEFAULT_LEAD_S = 300
"""--signal-lead: seconds between Slurm's SIGTERM and the time limit. It must cover one
training step and one save (an E1 step is about 0.13 s on an A40 and a resume state a few
seconds to write; 300 s leaves room for a slow shared filesystem) and, with sync_to set, the
stop's final push (bounded by sync_stop_wait_seconds, 120 s). Slurm may deliver the
signal up to 60 s earlier than asked (its timer ticks every 30 s), never later."""
MAX_LEAD_S = 65535  # the largest value sbatch --signal accepts
DEFAULT_MAX_REQUEUES = 3
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
SITE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")  # partition, account, qos
_TIME_RE = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
# Launchers that run a container beside Slurm instead of under it: the job's processes
# would escape its cgroup, its signals and its SLURM_* variables.
_ESCAPING = {"docker", "podman", "nerdctl"}
# A Hugging Face token by value (a reference such as HF_TOKEN=$HF_TOKEN is fine): the
# option's text is written into the scripts and campaign.json.
_SECRET_VALUE_RE = re.compile(r"\b(?:HF_TOKEN|HUGGING_FACE_HUB_TOKEN)=(?!\$)\S|\bhf_[A-Za-z0-9]{20,}")


def refuse_secret_values(options: dict[str, str | None]) -> None:
    """ConfigError naming the first option whose text gives a token by value (never echoed)."""
    for opt, text in options.items():
        if text and _SECRET_VALUE_RE.search(text):
            raise ConfigError(f"{opt}: holds a Hugging Face token by value; with --on slurm a "
                              "secret reaches the jobs by name only (export HF_TOKEN in the "
                              "submitting shell and give --env HF_TOKEN); its value never goes "
                              "into a script")


@dataclass(frozen=True)
class Site:
    """Where and how the scripts run (every field passed through to sbatch / srun)."""

    python: str = "python3"
    """Interpreter on the compute nodes (inside the container when one is given)."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gpus_per_task: int = 0
    """GPUs per task (per rank); 0 trains on CPU (the smoke preset)."""
    cpus_per_task: int | None = None
    nodes: int = 1
    """Nodes per run: above 1 one run trains data-parallel across nodes."""
    tasks_per_node: int = 1
    """Ranks per node (srun-native: one task each; torchrun: its --nproc-per-node)."""
    launcher: str = "srun"
    time_s: int = 24 * 3600
    signal_lead_s: int = DEFAULT_LEAD_S
    max_requeues: int = DEFAULT_MAX_REQUEUES
    array_limit: int | None = None
    """At most this many array elements at once (sbatch --array=0-N%K)."""
    sbatch_lines: tuple[str, ...] = ()
    container_exec: str | None = None
    """Prefix run by srun before python, e.g. `apptainer exec --nv /images/aleph.sif`."""
    container_image: str | None = None
    """pyxis: srun --container-image=IMAGE --container-mounts=<work root>."""
    env: tuple[str, ...] = ()
    """Names of variables the jobs need from the submitting shell (values never written)."""
    finish_time_s: int = 2 * 3600

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node


def parse_time(text: str, option: str = "--time") -> int:
    """Seconds of a Slurm time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    if not (m := _TIME_RE.fullmatch(text.strip())):
        raise ConfigError(f"{option} {text!r}: expected a Slurm time limit (minutes, H:MM:SS "
                          "or D-HH:MM:SS)")
    d, a, b, c = (int(x) if x else None for x in m.groups())
    if d is not None:  # D-H, D-H:M, D-H:M:S
        secs = d * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:
        secs = a * 3600 + b * 60 + c
    elif b is not None:
        secs = a * 60 + b
    else:
        secs = a * 60
    if secs <= 0:
        raise ConfigError(f"{option} {text!r}: expected a time limit above zero")
    return secs


def format_time(secs: int) -> str:
    d, rest = divmod(secs, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


SITE_OPTIONS = ("partition", "account", "qos", "gpus_per_task", "cpus_per_task", "nodes",
                "tasks_per_node", "launcher", "max_requeues", "array_limit", "container_exec",
                "container_image")
"""`aleph campaign` option dests that are Site fields under the same name."""


def make_site(*, python: str, time: str = "1-00:00:00", finish_time: str = "02:00:00",
              signal_lead: int = DEFAULT_LEAD_S, sbatch_line=(), env=(), **options) -> Site:
    """The Site of `aleph campaign`'s options (`options`: SITE_OPTIONS), every value checked;
    ConfigError (one line, the option named) on the first bad one."""
    s = Site(python=python, time_s=parse_time(time), signal_lead_s=signal_lead,
             sbatch_lines=tuple(sbatch_line), env=tuple(dict.fromkeys(env)),
             finish_time_s=parse_time(finish_time, "--finish-time"), **options)
    if not python.strip() or any(c.isspace() for c in python):
        raise ConfigError(f"--python {python!r}: expected one interpreter path or name")
    for opt, value in (("--partition", s.partition), ("--account", s.account), ("--qos", s.qos)):
        if value is not None and not SITE_NAME_RE.fullmatch(value):
            raise ConfigError(f"{opt} {value!r}: expected a Slurm name (letters, digits, "
                              "'.', '_', '+', '-')")
    for opt, value, low in (("--gpus-per-task", s.gpus_per_task, 0), ("--nodes", s.nodes, 1),
                            ("--tasks-per-node", s.tasks_per_node, 1),
                            ("--max-requeues", s.max_requeues, 0),
                            ("--cpus-per-task", s.cpus_per_task, 1),
                            ("--array-limit", s.array_limit, 1)):
        if value is not None and value < low:
            raise ConfigError(f"{opt} {value}: expected an integer >= {low}")
    if s.launcher not in LAUNCHERS:
        raise ConfigError(f"--launcher {s.launcher!r}: expected one of {', '.join(LAUNCHERS)}")
    if not 1 <= signal_lead <= MAX_LEAD_S:
        raise ConfigError(f"--signal-lead {signal_lead}: expected seconds from 1 to {MAX_LEAD_S}")
    if s.time_s <= signal_lead:
        raise ConfigError(f"--time {time} ({s.time_s} s) is not longer than --signal-lead "
                          f"{signal_lead} s: the stop would come before training starts; give "
                          "a longer --time, or a shorter lead (it must cover one step and one "
                          "save)")
    for line in sbatch_line:
        if "\n" in line or "\r" in line or not line.startswith("--"):
            raise ConfigError(f"--sbatch-line {line!r}: expected one sbatch option such as "
                              "--constraint=a40 (one line, starting with --)")
    _check_container(s.container_exec, s.container_image)
    refuse_secret_values({"--sbatch-line": "\n".join(sbatch_line),
                          "--container-exec": s.container_exec,
                          "--container-image": s.container_image})
    for name in env:
        if not ENV_NAME_RE.fullmatch(name):
            raise ConfigError(f"--env {name!r}: expected a variable name (the jobs read its "
                              "value from the submitting environment; values are never given "
                              "here)")
    return s


def _check_container(container_exec: str | None, container_image: str | None) -> None:
    if container_exec is not None:
        words = shlex.split(container_exec)
        if not words:
            raise ConfigError("--container-exec '': expected a prefix such as 'apptainer exec "
                              "--nv IMAGE.sif'")
        if words[0].rsplit("/", 1)[-1] in _ESCAPING:
            raise ConfigError(f"--container-exec {container_exec!r}: {words[0]} runs the "
                              "container beside Slurm, not under it (no SLURM_* variables, no "
                              "signals, it outlives the job); use apptainer exec or pyxis "
                              "(--container-image)")
        if container_image:
            raise ConfigError("--container-exec and --container-image: give one container "
                              "runner, not both")
    if container_image is not None and (not container_image.strip()
                                        or any(c.isspace() for c in container_image)):
        raise ConfigError(f"--container-image {container_image!r}: expected one image name "
                          "or .sqsh path")


def check_partition(site: Site, run=subprocess.run) -> str | None:
    """Refuse a partition `sinfo` does not list (ConfigError); returns a note when it could
    not be asked (no sinfo here, or it failed), None when checked."""
    if site.partition is None:
        return None
    if shutil.which("sinfo") is None:
        return f"--partition {site.partition}: not checked (no sinfo on this host)"
    try:
        got = run(["sinfo", "--noheader", "--format=%R"], capture_output=True, text=True,
                  timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"--partition {site.partition}: not checked (sinfo: {e})"
    if got.returncode != 0:
        first = (got.stderr.strip().splitlines() or ["no output"])[0]
        return f"--partition {site.partition}: not checked (sinfo exit {got.returncode}: {first})"
    names = sorted({x.strip() for x in got.stdout.split() if x.strip()})
    if site.partition not in names:
        raise ConfigError(f"--partition {site.partition!r}: not a partition of this cluster; "
                          f"sinfo lists {', '.join(names) or 'none'}")
    return None
