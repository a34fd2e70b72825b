"""`aleph runs diff A B`: equivalence report between two run directories."""

from __future__ import annotations

import argparse
from pathlib import Path

NOT_EQUIVALENT_EXIT = 1


def register(subparsers) -> None:
    p = subparsers.add_parser("runs", help="compare run directories")
    sub = p.add_subparsers(dest="runs_command", metavar="RUNS_COMMAND", required=True)
    d = sub.add_parser(
        "diff", help="environment, code, config, target store and launches of two runs, with a verdict",
        description="Ends with a verdict: equivalent / equivalent with caveats / not equivalent. "
        f"Exit status 0 unless not equivalent ({NOT_EQUIVALENT_EXIT}).",
    )
    d.add_argument("run_a", metavar="RUN_A")
    d.add_argument("run_b", metavar="RUN_B")
    d.add_argument("--repo", type=Path, default=Path("."),
                   help="git checkout holding both code revisions, for changed files and hunks "
                   "(default: the current directory)")
    d.add_argument("--patch", action="store_true", help="print the full code diff")
    d.add_argument("--json", type=Path, default=None, help="also write the diff as JSON to this file")
    d.set_defaults(func=_diff)


def _diff(args: argparse.Namespace) -> int:
    from aleph._io import atomic_write_json
    from aleph.report.diff import diff_runs
    from aleph.report.diff_text import as_json, format_diff

    d = diff_runs(args.run_a, args.run_b, repo=args.repo)
    print(format_diff(d, patch=args.patch), end="")
    if args.json is not None:
        atomic_write_json(args.json, as_json(d))
    return NOT_EQUIVALENT_EXIT if d.verdict == "not equivalent" else 0
