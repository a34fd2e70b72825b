"""`aleph report RUN...` (run directories or names): the E1 table for any set of evaluated runs."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="E1 results table (Markdown + CSV/JSON) from runs' eval.json",
        description="Summary table (run, mean, dispatch OFF, toggle, R@1, cos->target, "
        "erank/768) and per-task Spearman; runs of one arm get mean and spread across seeds.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN",
                   help="runs to tabulate: directories, or names under <work root>/runs "
                   "(e.g. smoke/a2_dense-s0)")
    p.add_argument("--published", action="store_true",
                   help="add the published E1 figures as labelled reference rows")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for report.md, runs.csv, tasks.csv, report.json, report.png "
                   "(default: <work root>/reports)")
    p.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    from aleph._io import work_root
    from aleph.eval.rundir import resolve_run
    from aleph.report.plot import write_png
    from aleph.report.render import markdown, write_all
    from aleph.report.table import build

    run_dirs = [resolve_run(d) for d in args.run_dirs]
    report = build(run_dirs, with_published=args.published)
    print(markdown(report), end="")
    out = args.out if args.out is not None else work_root() / "reports"
    for path in [*write_all(report, out), write_png(report, run_dirs, out / "report.png")]:
        print(f"wrote {path}")
    return 0
