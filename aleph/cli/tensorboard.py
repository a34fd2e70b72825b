"""`aleph tensorboard`: serve the runs directory with the real TensorBoard program."""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from pathlib import Path

from aleph.errors import ConfigError, DataError


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


def _bind(host: str, port: int) -> int:
    """Bind a listening socket as TensorBoard's server would (SO_REUSEADDR, so a port
    left in TIME_WAIT counts as free, as it does for TensorBoard); the port bound."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr)
        s.listen()
        return s.getsockname()[1]


def check_port(host: str, port: int) -> None:
    """Refuse a port TensorBoard could not bind, before saying it serves there: TensorBoard
    itself would print its banner and only then fail. A busy port names a free one."""
    if not 1 <= port <= 65535:  # getaddrinfo would blame the host for a port out of range
        raise ConfigError(f"--port {port}: expected a TCP port from 1 to 65535")
    try:
        _bind(host, port)
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: not an address of this machine ({e.strerror})") from e
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from e
        raise ConfigError(f"--port {port}: {host}:{port} is already in use (another TensorBoard?); "
                          f"pass a free one, e.g. --port {_bind(host, 0)}") from e


def _serve(args: argparse.Namespace) -> int:
    from aleph._io import work_root

    logdir = args.logdir if args.logdir is not None else work_root() / "runs"
    if not logdir.is_dir():
        raise DataError(f"--logdir {logdir}: no such directory (train a run first, or pass --logdir)")
    check_port(args.host, args.port)
    cmd = command(logdir, args.port, args.host)
    print(f"serving {logdir} at http://{args.host}:{args.port}/", flush=True)
    # Replace this process: signals (Ctrl-C, docker stop) reach TensorBoard directly.
    os.execv(cmd[0], cmd)
