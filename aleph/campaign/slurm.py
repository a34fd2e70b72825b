"""`aleph campaign --on slurm`: the campaign as reviewable sbatch scripts (Slurm schedules).

Written into <campaign>/slurm/:
- train.sbatch + train.table: one array element per (arm, seed), mapped by
  SLURM_ARRAY_TASK_ID through the table. `--signal=TERM@LEAD` (no `B:`: Slurm signals the
  job step, and the trainer runs as that step under srun). An element whose trainer stopped
  (exit 76; under torchrun, which reports its own status, the run directory says stopped)
  requeues itself alone while SLURM_RESTART_COUNT is under --max-requeues.
- finish.sbatch: after every element succeeded (afterok), `aleph campaign --finish-only`.
- extract.sbatch + consensus.sbatch, only with --extract-shards (extract_scripts).

Several nodes per run: srun-native (one task per rank, the trainer reads SLURM_PROCID /
SLURM_LOCALID / SLURM_NTASKS), or `srun torchrun` (one agent per node, c10d rendezvous at
the first host on a port picked free there). Secrets never enter a script: --env names
the variables the jobs need, and the script only checks that each is set.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from aleph.campaign.finish import EvalOptions
from aleph.campaign.slurm_site import Site, format_time, refuse_secret_values
from aleph.campaign.spec import Spec
from aleph.errors import EXIT_STOPPED, ConfigError

SLURM_DIR = "slurm"
TABLE = "train.table"
LOG = "aleph-slurm:"  # prefix of every line the scripts print themselves
# What a path may hold to be written into #SBATCH lines (unquotable: a newline ends the
# line, a space splits it, % is sbatch's pattern), into the scripts' echo strings and into
# pyxis's --container-mounts=SRC:DST,... (a ':' or ',' would split it).
_SCRIPT_PATH_RE = re.compile(r"/[A-Za-z0-9._+@=/-]*")
_FREE_PORT = 'import socket; s = socket.socket(); s.bind(("0.0.0.0", 0)); print(s.getsockname()[1])'


@dataclass(frozen=True)
class Extraction:
    """The optional extraction stage: `aleph targets extract ARGS --shard I/N` per element."""

    shards: int
    extract_args: str
    consensus_args: str | None
    python: str


def make_extraction(shards: int | None, extract_args: str | None, consensus_args: str | None,
                    python: str) -> Extraction | None:
    """The extraction stage of --extract-shards, or None; ConfigError (one line) on bad options."""
    if shards is None:
        if extract_args or consensus_args:
            raise ConfigError("--extract-args/--consensus-args: only with --extract-shards N")
        return None
    if shards < 1 or not extract_args:
        raise ConfigError("--extract-shards: expected N >= 1 and --extract-args (the "
                          "arguments of aleph targets extract)")
    refuse_secret_values({"--extract-args": extract_args, "--consensus-args": consensus_args})
    words = {"--extract-args": shlex.split(extract_args),
             "--consensus-args": shlex.split(consensus_args or "")}
    if bad := [opt for opt, w in words.items() if "--shard" in w]:
        raise ConfigError(f"{bad[0]}: without --shard (each element adds its own)")
    if "--consensus-out" in words["--extract-args"]:
        raise ConfigError("--extract-args: without --consensus-out (the consensus is its "
                          "own job after every shard: --consensus-args)")
    return Extraction(shards, shlex.join(words["--extract-args"]),
                      shlex.join(words["--consensus-args"]) if consensus_args else None, python)


@dataclass(frozen=True)
class Layout:
    """Paths the scripts name: all absolute, on the filesystem every node shares."""

    work: Path
    package_root: Path | None  # exported as PYTHONPATH when no container brings aleph

    def __post_init__(self) -> None:
        if not _SCRIPT_PATH_RE.fullmatch(str(self.work)):
            raise ConfigError(f"work root (ALEPH_WORK) {str(self.work)!r}: the Slurm scripts "
                              "write it into #SBATCH lines and shell commands; expected an "
                              "absolute path of letters, digits and . _ + @ = - / only (no space, "
                              "quote, $, `, %, :, comma, \\ or newline): set ALEPH_WORK to such "
                              "a path (a symbolic link to the work root will do)")

    def dir(self, spec: Spec) -> Path:
        return self.work / "campaigns" / spec.name / SLURM_DIR


def q(word: str | Path) -> str:
    return shlex.quote(str(word))


def table_text(spec: Spec) -> str:
    rows = [f"{i}\t{arm}\t{seed}\t{rid}" for i, (rid, arm, seed) in enumerate(spec.runs())]
    return ("# index\tarm\tseed\trun: SLURM_ARRAY_TASK_ID -> the (arm, seed) it trains\n"
            + "\n".join(rows) + "\n")


def _header(spec: Spec, site: Site, what: str, job: str, log: str, time_s: int) -> list[str]:
    lines = ["#!/bin/bash", f"# aleph campaign {spec.name}: {what}",
             "# Written by `aleph campaign --on slurm`; review it, then submit with --submit.",
             f"#SBATCH --job-name=aleph-{spec.name}-{job}", f"#SBATCH --output={log}",
             "#SBATCH --open-mode=append", f"#SBATCH --time={format_time(time_s)}"]
    for opt, value in (("partition", site.partition), ("account", site.account),
                       ("qos", site.qos)):
        if value:
            lines.append(f"#SBATCH --{opt}={value}")
    return lines


def _environment(site: Site, lay: Layout) -> list[str]:
    """The --sbatch-line options, then the job's environment and its check of --env names."""
    lines = [f"#SBATCH {line}" for line in site.sbatch_lines]
    lines += ["", "set -u", f"export ALEPH_WORK={q(lay.work)}", "export PYTHONUNBUFFERED=1"]
    if lay.package_root is not None and not (site.container_exec or site.container_image):
        lines.append(f"export PYTHONPATH={q(lay.package_root)}${{PYTHONPATH:+:$PYTHONPATH}}")
    if site.env:
        lines += ["# Variables the jobs need, by name only: their values come from the "
                  "submitting shell.",
                  f"for name in {' '.join(site.env)}; do",
                  '  if [ -z "${!name:-}" ]; then',
                  f'    echo "{LOG} variable $name is not set in the job\'s environment; export '
                  'it in the shell that submits" >&2',
                  "    exit 2", "  fi", "done"]
    return lines


def _container(site: Site, lay: Layout) -> str:
    """What goes between `srun [options]` and the command: the container runner, if any,
    then `env ALEPH_WORK=...` inside it (an image's own ALEPH_WORK, /workspace in the
    project's, may take precedence over the job's environment: Apptainer gives image
    variables the last word)."""
    inside = f"env ALEPH_WORK={q(lay.work)} "
    if site.container_image:
        return (f"--container-image={q(site.container_image)} "
                f"--container-mounts={q(f'{lay.work}:{lay.work}')} {inside}")
    if site.container_exec:
        return shlex.join(shlex.split(site.container_exec)) + " " + inside
    return ""


def train_script(spec: Spec, site: Site, lay: Layout, sdir: Path) -> str:
    array = f"0-{len(spec.runs()) - 1}" + (f"%{site.array_limit}" if site.array_limit else "")
    lines = _header(spec, site, f"the training array, one element per (arm, seed) of {TABLE}",
                    "train", str(sdir / "logs" / "train-%A_%a.out"), site.time_s)
    lines += [f"#SBATCH --array={array}", "#SBATCH --requeue",
              f"#SBATCH --signal=TERM@{site.signal_lead_s}", f"#SBATCH --nodes={site.nodes}"]
    # torchrun: one task per node (its agent), holding the GPUs and CPUs of the node's ranks
    per = site.tasks_per_node if site.launcher == "torchrun" else 1
    lines.append(f"#SBATCH --ntasks-per-node={site.tasks_per_node // per}")
    if site.gpus_per_task:
        gpus = "gpus-per-node" if site.launcher == "torchrun" else "gpus-per-task"
        lines.append(f"#SBATCH --{gpus}={site.gpus_per_task * per}")
    if site.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={site.cpus_per_task * per}")
    lines += _environment(site, lay)
    py, box, m = q(site.python), _container(site, lay), site.max_requeues
    train = ["--arm", '"$ARM"', "--seed", '"$SEED"', *map(q, spec.config_args())]
    lines += [
        "", f"TABLE={q(sdir / TABLE)}",
        'row=$(awk -F "\\t" -v i="$SLURM_ARRAY_TASK_ID" \'$1 == i {print $2, $3, $4}\' "$TABLE")',
        'read -r ARM SEED RUN <<< "$row"',
        'if [ -z "${RUN:-}" ]; then',
        f'  echo "{LOG} no row $SLURM_ARRAY_TASK_ID in $TABLE" >&2', "  exit 2", "fi",
        'ELEMENT="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
        'RESTARTS="${SLURM_RESTART_COUNT:-0}"',
        f'echo "{LOG} element $ELEMENT: run $RUN (arm $ARM, seed $SEED) on '
        f'$SLURM_JOB_NODELIST (batch host $(hostname)), requeues so far $RESTARTS (limit {m}), '
        f'{site.ranks} rank(s) by {site.launcher}"',
        "# A short helper step on the first node (inside the container when one is used).",
        f'helper() {{ srun --nodes=1 --ntasks=1 {box}"$@"; }}',
    ]
    if site.launcher == "torchrun":
        lines += [
            'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            "# The rendezvous port: one the kernel gives free on the first host (a port derived",
            "# from the job id collides when two jobs share a node).",
            f"PORT=$(helper {py} -c {q(_FREE_PORT)})",
            f'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 {box}{py} -m '
            'torch.distributed.run --nnodes="$SLURM_JOB_NUM_NODES" '
            f'--nproc-per-node={site.tasks_per_node} --rdzv-backend=c10d '
            '--rdzv-endpoint="$HEAD:$PORT" --rdzv-id="$ELEMENT.$RESTARTS" '
            f"-m aleph train {' '.join(train)}",
        ]
    else:
        lines.append(f"srun {box}{py} -m aleph train {' '.join(train)}")
    lines += [
        "rc=$?",
        f'echo "{LOG} element $ELEMENT: run $RUN: the training step ended with exit $rc"',
        'if [ "$rc" -eq 0 ]; then exit 0; fi',
        f'if [ "$rc" -ne {EXIT_STOPPED} ]; then',
        "  # torchrun reports its own status: the run directory says whether the run stopped",
        f"  helper {py} -m aleph campaign status {q(spec.name)} --run \"$RUN\"",
        "  st=$?",
        '  if [ "$st" -eq 0 ]; then exit 0; fi',
        f'  if [ "$st" -ne {EXIT_STOPPED} ]; then',
        f'    echo "{LOG} element $ELEMENT: run $RUN failed (exit $rc); not requeued"',
        '    exit "$rc"', "  fi", "fi",
    ]
    lines += _requeue_lines("element $ELEMENT: run $RUN", "element $ELEMENT", "this element alone",
                            f'sbatch --array=$SLURM_ARRAY_TASK_ID {q(sdir / "train.sbatch")}', m)
    return "\n".join(lines) + "\n"


def _requeue_lines(who: str, short: str, what: str, resume: str, limit: int) -> list[str]:
    """After a step that exited errors.EXIT_STOPPED: `scontrol requeue "$ELEMENT"` while
    $RESTARTS is under `limit`, else say it gives up and how to resume (exit 76)."""
    return [
        f'if [ "$RESTARTS" -ge {limit} ]; then',
        f'  echo "{LOG} {who} stopped (resumable) after $RESTARTS requeue(s), the limit '
        f'(--max-requeues {limit}): giving up; resume it with: {resume}"',
        f"  exit {EXIT_STOPPED}", "fi",
        f'echo "{LOG} {who} stopped (resumable): requeueing {what} (requeue $((RESTARTS + 1)) '
        f'of {limit})"',
        'if scontrol requeue "$ELEMENT"; then exit 0; fi',
        f'echo "{LOG} {short}: scontrol requeue refused; resume it with: {resume}"',
        f"exit {EXIT_STOPPED}",
    ]


def finish_argv(spec: Spec, site: Site, opts: EvalOptions, published: bool | None,
                repo: str | None) -> list[str]:
    """`aleph campaign --finish-only` on this campaign's spec: the one-box finish code."""
    argv = ["campaign", "--finish-only", "--name", spec.name, *spec.config_args(),
            "--arms", *spec.arms, "--seeds", *map(str, spec.seeds),
            "--devices", "0" if site.gpus_per_task else "cpu:1"]
    for flag, value in (("--tasks", opts.tasks), ("--tasks-dir", opts.tasks_dir),
                        ("--probe-captions", opts.probe_captions),
                        ("--probe-targets", opts.probe_targets), ("--repo", repo)):
        if value is not None:
            argv += [flag, str(value)]
    if opts.probes:
        argv += ["--probe-rows", str(opts.probe_rows), "--probe-batch", str(opts.probe_batch)]
    else:
        argv.append("--no-probes")
    if published is not None:
        argv.append("--published" if published else "--no-published")
    return argv


def finish_script(spec: Spec, site: Site, lay: Layout, sdir: Path, argv: list[str]) -> str:
    lines = _header(spec, site, "the finish job: evaluate, report and diff every run (after "
                    "the training array succeeded)", "finish",
                    str(sdir / "logs" / "finish-%j.out"), site.finish_time_s)
    lines += ["#SBATCH --nodes=1", "#SBATCH --ntasks=1"]
    if site.gpus_per_task:
        lines.append("#SBATCH --gpus-per-task=1")
    lines += _environment(site, lay)
    lines += ["", f'echo "{LOG} finish job $SLURM_JOB_ID on $(hostname)"',
              f"exec srun {_container(site, lay)}{q(site.python)} -m aleph {shlex.join(argv)}"]
    return "\n".join(lines) + "\n"


def _stage_job(site: Site, lay: Layout, head: list[str], element: str, who: str, step: str,
               scope: tuple[str, str], resume: str) -> str:
    """A job of one `srun python -m aleph targets ...` step: `head` (its #SBATCH lines), the
    environment, the step; exit 0 on success, the step's status on a failure, and after a
    stop (errors.EXIT_STOPPED) the requeue lines."""
    m = site.max_requeues
    lines = [*head, *_environment(site, lay), "", f'ELEMENT="{element}"',
             'RESTARTS="${SLURM_RESTART_COUNT:-0}"',
             f'echo "{LOG} {who} on $(hostname), requeues so far $RESTARTS (limit {m})"',
             f"srun {_container(site, lay)}{step}",
             "rc=$?", f'echo "{LOG} {who}: the step ended with exit $rc"',
             'if [ "$rc" -eq 0 ]; then exit 0; fi', f'if [ "$rc" -ne {EXIT_STOPPED} ]; then',
             f'  echo "{LOG} {who} failed (exit $rc); not requeued"', '  exit "$rc"', "fi",
             *_requeue_lines(who, *scope, resume, m)]
    return "\n".join(lines) + "\n"


def extract_scripts(spec: Spec, site: Site, lay: Layout, sdir: Path,
                    ex: Extraction) -> dict[str, str]:
    """extract.sbatch (an element per shard) and, with consensus arguments, consensus.sbatch.

    Both stop the way training does: `--signal=TERM@LEAD`, the step exits 76
    (errors.EXIT_STOPPED) keeping its finished chunks, and the element (the job) requeues
    itself alone while SLURM_RESTART_COUNT is under --max-requeues; a requeued shard redoes
    none of its finished chunks. The consensus job refuses to start while a chunk of any
    shard is missing, so it runs only after every element succeeded (afterok)."""
    py, stop = q(ex.python), ["#SBATCH --requeue", f"#SBATCH --signal=TERM@{site.signal_lead_s}",
                              "#SBATCH --nodes=1", "#SBATCH --ntasks=1"]
    head = _header(spec, site, f"teacher extraction, {ex.shards} shards (aleph targets "
                   "extract --shard I/N)", "extract", str(sdir / "logs" / "extract-%A_%a.out"),
                   site.time_s)
    head += [f"#SBATCH --array=0-{ex.shards - 1}", *stop]
    if site.gpus_per_task:
        head.append(f"#SBATCH --gpus-per-task={site.gpus_per_task}")
    out = {"extract.sbatch": _stage_job(
        site, lay, head, "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}",
        f"element $ELEMENT: shard $SLURM_ARRAY_TASK_ID/{ex.shards}",
        f"{py} -m aleph targets extract {ex.extract_args} "
        f'--shard "$SLURM_ARRAY_TASK_ID/{ex.shards}"', ("element $ELEMENT", "this element alone"),
        f'sbatch --array=$SLURM_ARRAY_TASK_ID {q(sdir / "extract.sbatch")}')}
    if ex.consensus_args:
        head = _header(spec, site, "the teacher consensus, after every extraction shard",
                       "consensus", str(sdir / "logs" / "consensus-%j.out"), site.time_s)
        out["consensus.sbatch"] = _stage_job(
            site, lay, head + stop, "$SLURM_JOB_ID", "consensus job $ELEMENT",
            f"{py} -m aleph targets consensus {ex.consensus_args}",
            ("consensus job $ELEMENT", "this job"), f'sbatch {q(sdir / "consensus.sbatch")}')
    return out


def scripts(spec: Spec, site: Site, lay: Layout, opts: EvalOptions, *,
            published: bool | None = None, repo: str | None = None,
            extraction: Extraction | None = None) -> dict[str, str]:
    """File name -> text of everything written into <work>/campaigns/<name>/slurm/."""
    sdir = lay.dir(spec)
    out = {TABLE: table_text(spec),
           "train.sbatch": train_script(spec, site, lay, sdir),
           "finish.sbatch": finish_script(spec, site, lay, sdir,
                                          finish_argv(spec, site, opts, published, repo))}
    if extraction is not None:
        out.update(extract_scripts(spec, site, lay, sdir, extraction))
    return out
