"""`aleph campaign`: every (arm, seed) trained once on the given devices, evaluated, tabulated,
and compared pair by pair (aleph.campaign)."""

from __future__ import annotations

import argparse
from pathlib import Path

ALL_ARMS = ("a1_anchored", "a2_dense", "a3_random")  # aleph.model.ARMS (checked there)


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
        "command continues a killed campaign. SIGTERM/SIGINT: the trainers checkpoint, exit 0. "
        "Exit 1 when a run failed or could not be evaluated.")
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
    p.set_defaults(func=_campaign)


def _campaign(args: argparse.Namespace) -> int:
    from aleph.campaign.finish import EvalOptions
    from aleph.campaign.main import run_campaign
    from aleph.campaign.spec import make_spec

    spec = make_spec(args.name, args.preset, args.config, args.overrides, args.arms, args.seeds)
    opts = EvalOptions(tasks=args.tasks, tasks_dir=args.tasks_dir,
                       probe_captions=args.probe_captions, probe_targets=args.probe_targets,
                       probe_rows=args.probe_rows, probe_batch=args.probe_batch,
                       probes=not args.no_probes)
    return run_campaign(spec, args.devices, opts, retries=args.retries,
                        retry_failed=args.retry_failed, published=args.published, repo=args.repo,
                        poll_seconds=args.poll_seconds,
                        options={k: str(v) if isinstance(v, Path) else v
                                 for k, v in vars(args).items() if k not in ("func", "command")})
