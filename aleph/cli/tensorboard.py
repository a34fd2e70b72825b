"""`aleph tensorboard`: serve the runs directory with the real TensorBoard program."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from aleph.errors import DataError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tensorboard", help="serve TensorBoard over the runs directory (training + eval scalars)",
        description="Runs `python -m tensorboard.main` over LOGDIR; every run's tb/ appears as "
        "<run>/tb. Stop with Ctrl-C.",
    )
    p.add_argument("--logdir", type=Path, default=None, help="default: <work root>/runs")
    p.add_argument("--port", type=int, default=6006, help="default 6006")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default loopback; 0.0.0.0 inside the container)")
    p.set_defaults(func=_serve)


def command(logdir: Path, port: int, host: str) -> list[str]:
    """The exact command line that serves `logdir` (also used by the tests)."""
    return [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
            "--port", str(port), "--host", host]


def _serve(args: argparse.Namespace) -> int:
    from aleph._io import work_root

    logdir = args.logdir if args.logdir is not None else work_root() / "runs"
    if not logdir.is_dir():
        raise DataError(f"--logdir {logdir}: no such directory (train a run first, or pass --logdir)")
    cmd = command(logdir, args.port, args.host)
    print(f"serving {logdir} at http://{args.host}:{args.port}/", flush=True)
    # Replace this process: signals (Ctrl-C, docker stop) reach TensorBoard directly.
    os.execv(cmd[0], cmd)
    return 0  # not reached
