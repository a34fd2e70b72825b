"""`aleph env check` and `aleph env capture`."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from aleph.errors import EnvironmentDrift


def register(subparsers) -> None:
    p = subparsers.add_parser("env", help="check or record the execution environment")
    sub = p.add_subparsers(dest="env_command", metavar="ENV_COMMAND", required=True)

    c = sub.add_parser(
        "check", help="compare the live environment with pip_freeze.txt and the seed table",
        description="Exit 0 on the image or the known host variant; with --strict, exit "
        f"{EnvironmentDrift.exit_code} on any difference from the image.")
    c.add_argument("--strict", action="store_true", help="compare against the image only")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    c.add_argument("--pins-root", type=Path, default=None, help="directory holding "
                   "pip_freeze.txt and lockfiles/ (default: the source tree)")
    c.set_defaults(func=_check)
    k = sub.add_parser("capture", help="write the seed's kind of environment record")
    k.add_argument("--out", type=Path, default=None,
                   help="output directory (default: $ALEPH_CAPTURE_DIR or $ALEPH_WORK/env)")
    k.add_argument("--quiet", action="store_true", help="do not print the Markdown")
    k.set_defaults(func=_capture)


def _since_process_start() -> float | None:
    """Wall seconds since this process started (Linux), imports and CLI discovery included."""
    try:
        with open("/proc/self/stat") as f:
            # Field 22 (starttime, clock ticks after boot) follows the ")" closing field 2.
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def _check(args: argparse.Namespace) -> int:
    from aleph.env.check import REPO_ROOT, check_environment, format_report

    t0 = time.monotonic()
    result = check_environment(strict=args.strict, root=args.pins_root or REPO_ROOT)
    seconds = time.monotonic() - t0
    total = _since_process_start()
    if args.json:
        print(json.dumps({"variant": result.variant, "strict": result.strict, "ok": result.ok,
                          "seconds": round(seconds, 3),
                          "command_seconds": None if total is None else round(total, 2),
                          "drifts": [d.__dict__ for d in result.drifts]}, indent=2))
    else:
        print(format_report(result))
        whole = "" if total is None else f"; {total:.2f} s since the command started"
        print(f"(checked in {seconds:.2f} s{whole})")
    return EnvironmentDrift.exit_code if result.strict and not result.ok else 0


def _capture(args: argparse.Namespace) -> int:
    from aleph.env.capture import default_out_dir, gather, write_capture
    from aleph.env.render import render_markdown

    record = gather()
    md, js = write_capture(record, args.out or default_out_dir())
    if not args.quiet:
        print(render_markdown(record))
    print(f"wrote {md} and {js}")
    return 0
