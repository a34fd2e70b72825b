"""The `aleph` command: parses arguments and dispatches, nothing else.

Each module in this package that defines `register(subparsers)` contributes one
top-level subcommand; modules are discovered, so adding a command touches one file.
A handler returns an exit code (or None for 0). `AlephError`s are printed without a
traceback and exit with the error's code; an `OSError` that escapes a handler (a path
that cannot be read or written) is printed the same way, naming the path, with the
base `AlephError` code.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from aleph import __version__
from aleph._signals import console, hold_early
from aleph.errors import AlephError, PeerLost


def _command_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or (when `only` names a command module) one with just that command.

    Registering only the invoked command keeps `aleph env check` from paying for the
    torch-heavy imports of `train` or `eval`: each module imports what it needs at the top.
    """
    parser = argparse.ArgumentParser(
        prog="aleph", description="AlephLM-0 E1: environment, target store, training, evaluation."
    )
    parser.add_argument("--version", action="version", version=f"aleph {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    names = _command_modules()
    if only in names:
        names = [only]
    for name in names:
        module = importlib.import_module(f"{__name__}.{name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the process's own command (not a caller's): its stop signals
        hold_early(sys.argv[1:])  # held before the seconds of imports, for its StopFlag
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(only=argv[0] if argv else None)
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except (AlephError, PeerLost) as e:  # PeerLost: a rank stopped answering, exit 1
        console(f"aleph {args.command}: error: {e}", sys.stderr)
        return getattr(e, "exit_code", 1)
    except KeyboardInterrupt:
        return 130
    except OSError as e:
        # Backstop: a file the user named (or the work root) that cannot be read or written
        # is a user-facing condition; name it in one line instead of a traceback.
        where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
        what = e.strerror or str(e) or type(e).__name__
        console(f"aleph {args.command}: error: {where + ': ' if where else ''}{what}", sys.stderr)
        return AlephError.exit_code
    return 0 if rc is None else int(rc)
