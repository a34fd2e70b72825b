"""The `aleph` command: parses arguments and dispatches, nothing else.

Each module in this package that defines `register(subparsers)` contributes one
top-level subcommand; modules are discovered, so adding a command touches one file.
A handler returns an exit code (or None for 0). `AlephError`s are printed without a
traceback and exit with the error's code.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from aleph import __version__
from aleph.errors import AlephError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aleph", description="AlephLM-0 E1: environment, target store, training, evaluation."
    )
    parser.add_argument("--version", action="version", version=f"aleph {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except AlephError as e:
        print(f"aleph {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    return 0 if rc is None else int(rc)
