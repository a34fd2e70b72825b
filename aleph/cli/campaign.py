"""`aleph campaign`: every (arm, seed) trained once on the given devices, evaluated, tabulated,
and compared pair by pair (aleph.campaign)."""

from __future__ import annotations

import argparse
from pathlib import Path

ALL_ARMS = ("a1_anchored", "a2_dense", "a3_random")  # aleph.model.ARMS (checked there)
# aleph.campaign.slurm_site's defaults (a test checks they agree), spelled here because
# registering this parser imports no aleph.campaign module
DEFAULT_LEAD_S, DEFAULT_MAX_REQUEUES, LAUNCHERS = 300, 3, ("srun", "torchrun")


def register(subparsers) -> None:
    # No aleph.campaign import here: every `aleph` command registers this parser.
    p = subparsers.add_parser(
        "campaign", help="train every (arm, seed) once on the given GPUs or CPU slots, then "
        "evaluate, report and diff them",
        description="Runs `aleph train` for each arm x seed of one config as a subprocess, at "
        "most one per device at a time (a GPU via CUDA_VISIBLE_DEVICES, or a CPU slot via its "
        "CPU affinity), the next queued run starting when a device frees. Complete runs are "
        "skipped; a run held by another launch (its run lock) is reported and waited for, never "
        "duplicated; a failed run is retried --retries times. Then each run is evaluated (aleph "
        "eval), the E1 table written (aleph report; published rows for e1) and every pair "
        "compared (aleph runs diff). State: <work root>/campaigns/<name>/campaign.json; the same "
        "command continues a killed campaign. SIGTERM/SIGINT: the trainers save a resume state; "
        "exit 76 (stopped, resumable). Exit 1 when a run failed or could not be evaluated. "
        "--on slurm writes sbatch scripts instead (Slurm schedules; docs/cluster.md); "
        "`aleph campaign status NAME` shows where each run stands.")
    p.add_argument("--arms", nargs="+", default=list(ALL_ARMS), metavar="ARM",
                   help=f"arms to run (default: {' '.join(ALL_ARMS)})")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1], metavar="SEED",
                   help="run seeds (default: 0 1)")
    p.add_argument("--preset", default="e1", help="starting config: e1 | smoke (default e1)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="JSON or YAML mapping of config fields, applied over the preset")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config field of every run (repeatable; as aleph train); "
                   "hf_token reaches the trainers only as HF_TOKEN in their environment (better: "
                   "export HF_TOKEN, which keeps it off this command line too)")
    p.add_argument("--devices", default="auto",
                   help="auto (every visible GPU, else one CPU slot) | all (every visible GPU) | "
                   "GPU indices such as 0,1 | cpu:N (N CPU slots) (default auto)")
    p.add_argument("--retries", type=int, default=2,
                   help="relaunches of a run whose launch failed, before it is reported failed "
                   "(default 2; a refusal, exit 2, is never retried)")
    p.add_argument("--retry-failed", action="store_true",
                   help="on a restart, requeue runs an earlier campaign process gave up on")
    p.add_argument("--name", default=None,
                   help="campaign name: its directory under <work root>/campaigns/ (default: the "
                   "preset, or the config file's stem)")
    p.add_argument("--published", action=argparse.BooleanOptionalAction, default=None,
                   help="add the published E1 rows to the report (default: on for the e1 preset)")
    p.add_argument("--tasks", default=None, help="aleph eval --tasks (default: eval's)")
    p.add_argument("--tasks-dir", default=None, help="aleph eval --tasks-dir")
    p.add_argument("--probe-captions", default=None, help="aleph eval --probe-captions")
    p.add_argument("--probe-targets", default=None, help="aleph eval --probe-targets")
    p.add_argument("--probe-rows", type=int, default=2048, help="aleph eval --probe-rows (2048)")
    p.add_argument("--probe-batch", type=int, default=256, help="aleph eval --probe-batch (256)")
    p.add_argument("--no-probes", action="store_true", help="aleph eval --no-probes")
    p.add_argument("--repo", type=Path, default=None,
                   help="git checkout for the code hunks of runs diff (default: none)")
    p.add_argument("--poll-seconds", type=float, default=1.0,
                   help="how often the scheduler looks at its runs (default 1)")
    p.add_argument("--finish-only", action="store_true",
                   help="launch nothing: evaluate, report and diff the runs that are complete "
                   "(what the Slurm finish job runs); exit 1 if some run is not")
    _slurm_options(p)
    p.set_defaults(func=_campaign)
    sub = p.add_subparsers(dest="action", metavar="status", required=False)
    st = sub.add_parser("status", help="each run's state from its run directory, and the "
                        "Slurm jobs recorded at submission (squeue when present)")
    st.add_argument("campaign", metavar="NAME", help="the campaign's --name")
    st.add_argument("--run", default=None, metavar="RUN",
                    help="one run (arm-sSEED): exit 0 complete, 76 stopped and resumable, 1 "
                    "otherwise (what an array element asks before it requeues itself)")
    st.set_defaults(func=_status)


def _slurm_options(p) -> None:
    g = p.add_argument_group(
        "Slurm (--on slurm)", "Write sbatch scripts into <work root>/campaigns/<name>/slurm/ "
        "(a training array, one element per arm x seed, and a finish job after it); the work "
        "root must be on a filesystem every node sees. Nothing is submitted without --submit.")
    g.add_argument("--on", choices=("local", "slurm"), default="local",
                   help="local: schedule the runs on this machine (default); slurm: write "
                   "(and with --submit, submit) sbatch scripts: Slurm schedules them")
    g.add_argument("--submit", action="store_true", help="submit the scripts (sbatch)")
    g.add_argument("--dry-run", action="store_true", help="print the scripts, write nothing")
    g.add_argument("--partition", default=None, help="#SBATCH --partition for every job (checked with sinfo when present)")
    g.add_argument("--account", default=None, help="#SBATCH --account for every job")
    g.add_argument("--qos", default=None, help="#SBATCH --qos for every job")
    g.add_argument("--gpus-per-task", type=int, default=0,
                   help="GPUs per rank (default 0: CPU, the smoke preset)")
    g.add_argument("--cpus-per-task", type=int, default=None, help="#SBATCH --cpus-per-task of each training task")
    g.add_argument("--nodes", type=int, default=1, help="nodes per run (default 1)")
    g.add_argument("--tasks-per-node", type=int, default=1,
                   help="ranks per node (default 1; usually the GPUs of a node)")
    g.add_argument("--launcher", choices=LAUNCHERS, default="srun",
                   help="srun: one task per rank, ranks from SLURM_* (default); torchrun: "
                   "srun starts one torchrun agent per node")
    g.add_argument("--time", default="1-00:00:00",
                   help="time limit of each array element (Slurm format; default 1-00:00:00)")
    g.add_argument("--signal-lead", type=int, default=DEFAULT_LEAD_S, metavar="SECONDS",
                   help="SIGTERM this long before the time limit: covers one step and one save "
                   f"(default {DEFAULT_LEAD_S})")
    g.add_argument("--max-requeues", type=int, default=DEFAULT_MAX_REQUEUES,
                   help="an element that stopped requeues itself while SLURM_RESTART_COUNT "
                   f"is below this (default {DEFAULT_MAX_REQUEUES})")
    g.add_argument("--array-limit", type=int, default=None, metavar="K",
                   help="at most K elements at once (--array=0-N%%K)")
    g.add_argument("--sbatch-line", action="append", default=[], metavar="OPTION",
                   help="one more #SBATCH line, written --sbatch-line=--constraint=a40 (repeatable)")
    g.add_argument("--container-exec", default=None, metavar="PREFIX",
                   help="run python under srun inside this, e.g. 'apptainer exec --nv "
                   "/images/aleph.sif' (docker/podman refused: they escape Slurm)")
    g.add_argument("--container-image", default=None, metavar="IMAGE",
                   help="pyxis: srun --container-image=IMAGE, the work root mounted")
    g.add_argument("--env", action="append", default=[], metavar="NAME",
                   help="a variable the jobs need from the submitting shell, by name (e.g. "
                   "HF_TOKEN); the scripts check it is set and never hold its value")
    g.add_argument("--python", default=None, metavar="PATH",
                   help="interpreter on the nodes (default: this one without a container, "
                   "python3 inside one)")
    g.add_argument("--finish-time", default="02:00:00", help="time limit of the finish job")
    g.add_argument("--extract-shards", type=int, default=None, metavar="N",
                   help="also an extraction array of N shards (aleph targets extract "
                   "--shard I/N) before training")
    g.add_argument("--extract-args", default=None, metavar="ARGS",
                   help="arguments of `aleph targets extract` for --extract-shards")
    g.add_argument("--consensus-args", default=None, metavar="ARGS",
                   help="arguments of `aleph targets consensus`, a job after the shards")
    g.add_argument("--extract-python", default=None, metavar="PATH",
                   help="interpreter of the teacher environment (default: --python)")


def _status(args: argparse.Namespace) -> int:
    from aleph.campaign.status import run_status

    return run_status(args.campaign, args.run)


def _campaign(args: argparse.Namespace) -> int:
    from aleph.campaign.finish import EvalOptions
    from aleph.campaign.main import run_campaign
    from aleph.campaign.spec import make_spec
    from aleph.errors import ConfigError

    spec = make_spec(args.name, args.preset, args.config, args.overrides, args.arms, args.seeds)
    opts = EvalOptions(tasks=args.tasks, tasks_dir=args.tasks_dir,
                       probe_captions=args.probe_captions, probe_targets=args.probe_targets,
                       probe_rows=args.probe_rows, probe_batch=args.probe_batch,
                       probes=not args.no_probes)
    if args.on == "slurm":
        return _slurm(args, spec, opts)
    for flag in ("submit", "dry_run"):
        if getattr(args, flag):
            raise ConfigError(f"--{flag.replace('_', '-')}: only with --on slurm")
    return run_campaign(spec, args.devices, opts, retries=args.retries,
                        retry_failed=args.retry_failed, published=args.published, repo=args.repo,
                        poll_seconds=args.poll_seconds, finish_only=args.finish_only,
                        options={k: str(v) if isinstance(v, Path) else v
                                 for k, v in vars(args).items() if k not in ("func", "command")})


def _slurm(args: argparse.Namespace, spec, opts) -> int:
    import sys

    from aleph.campaign.slurm import make_extraction
    from aleph.campaign.slurm_main import run_slurm
    from aleph.campaign.slurm_site import SITE_OPTIONS, make_site
    from aleph.errors import ConfigError

    if args.finish_only:
        raise ConfigError("--finish-only: not with --on slurm (the finish job runs it)")
    boxed = bool(args.container_exec or args.container_image)
    python = args.python or ("python3" if boxed else sys.executable)
    given = ("time", "signal_lead", "sbatch_line", "env", "finish_time", *SITE_OPTIONS)
    site = make_site(python=python, **{k: getattr(args, k) for k in given})
    extraction = make_extraction(args.extract_shards, args.extract_args, args.consensus_args,
                                 args.extract_python or python)
    return run_slurm(spec, site, opts, submit=args.submit, dry_run=args.dry_run,
                     published=args.published, repo=str(args.repo) if args.repo else None,
                     extraction=extraction)
