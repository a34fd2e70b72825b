"""`aleph env check` and `aleph env capture`."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from aleph.errors import EnvironmentDrift


def register(subparsers) -> None:
    p = subparsers.add_parser("env", help="check or record the execution environment")
    sub = p.add_subparsers(dest="env_command", metavar="ENV_COMMAND", required=True)

    c = sub.add_parser(
        "check",
        help="compare the live environment with pip_freeze.txt and the seed table",
        description="Exit 0 on the image or the known host variant; with --strict, exit "
        f"{EnvironmentDrift.exit_code} on any difference from the image.",
    )
    c.add_argument("--strict", action="store_true", help="compare against the image only")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    c.add_argument(
        "--pins-root",
        type=Path,
        default=None,
        help="directory holding pip_freeze.txt and lockfiles/ (default: the source tree)",
    )
    c.set_defaults(func=_check)

    k = sub.add_parser("capture", help="write the seed's kind of environment record")
    k.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: $ALEPH_CAPTURE_DIR or $ALEPH_WORK/env)",
    )
    k.add_argument("--quiet", action="store_true", help="do not print the Markdown")
    k.set_defaults(func=_capture)


def _check(args: argparse.Namespace) -> int:
    from aleph.env.check import REPO_ROOT, check_environment, format_report

    t0 = time.monotonic()
    result = check_environment(strict=args.strict, root=args.pins_root or REPO_ROOT)
    seconds = time.monotonic() - t0
    if args.json:
        print(
            json.dumps(
                {
                    "variant": result.variant,
                    "strict": result.strict,
                    "ok": result.ok,
                    "seconds": round(seconds, 3),
                    "drifts": [d.__dict__ for d in result.drifts],
                },
                indent=2,
            )
        )
    else:
        print(format_report(result))
        print(f"(checked in {seconds:.2f} s)")
    if result.strict and not result.ok:
        return EnvironmentDrift.exit_code
    return 0


def _capture(args: argparse.Namespace) -> int:
    from aleph.env.capture import default_out_dir, gather, write_capture
    from aleph.env.render import render_markdown

    record = gather()
    md, js = write_capture(record, args.out or default_out_dir())
    if not args.quiet:
        print(render_markdown(record))
    print(f"wrote {md} and {js}")
    return 0
