"""`aleph train`: its arguments, handed to aleph.train.command (tracer, config, launch)."""

from __future__ import annotations

import argparse
import shlex


class _HelpWithFields(argparse.Action):
    """-h/--help that appends every config field (type, default, first line of its
    docstring) to the help. The field list needs aleph.train.config, which imports torch,
    so it is built only when help is asked for, not each time the parser is registered."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):  # noqa: A002 (argparse's own keyword)
        super().__init__(option_strings, dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from aleph.train.config import help_text

        parser.epilog = help_text()
        parser.print_help()
        parser.exit()


def register(subparsers) -> None:
    # No aleph.train import here: every `aleph` command registers this parser, and the
    # trainer pulls in torch. Preset names are checked by resolve() (ConfigError).
    p = subparsers.add_parser(
        "train", help="train one arm (resumes its run directory automatically)",
        description="Train one arm of E1. Presets: 'e1' (the published shape; give captions= "
        "and targets= with --set) and 'smoke' (tiny model on the embedded data, CPU, well under "
        "a minute). The run directory is <work root>/runs/<arm>-s<seed> for e1, "
        "runs/<preset>/<arm>-s<seed> for any other preset, or runs/NAME with --name; launching "
        "again resumes it. Under torchrun, trains data-parallel (rank 0 writes the run "
        "directory). Exit 75 when another launch holds the run's lock.",
        formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False)
    p.add_argument("-h", "--help", action=_HelpWithFields,
                   help="show this help, with every config field, and exit")
    p.add_argument("--arm", required=True, help="a1_anchored | a2_dense | a3_random")
    p.add_argument("--seed", type=int, default=None, help="run seed (default: the preset's, 0)")
    p.add_argument("--preset", default="e1", help="starting config: e1 | smoke (default e1)")
    p.add_argument("--name", default=None, metavar="NAME",
                   help="run name under <work root>/runs instead of the default (one or two "
                   "'/'-separated parts of letters, digits, '.', '_', '-'); `aleph eval NAME` "
                   "and the other commands accept it")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="JSON or YAML mapping of config fields, applied over the preset")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config field (repeatable; value parsed as YAML); the "
                   "fields are listed below")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved (redacted) config as JSON and exit")
    p.set_defaults(func=_train)


def again_command(args) -> str:
    """The command line that relaunches this run (its resume hint), secrets redacted."""
    from aleph.train.config import REDACTED, SECRET_FIELDS

    argv = ["aleph", "train", "--arm", args.arm, "--preset", args.preset]
    if args.seed is not None:
        argv += ["--seed", str(args.seed)]
    if args.name:
        argv += ["--name", args.name]
    if args.config:
        argv += ["--config", args.config]
    for item in args.overrides:
        key = item.partition("=")[0].strip()
        argv += ["--set", f"{key}={REDACTED}" if key in SECRET_FIELDS else item]
    return shlex.join(argv)


def _train(args) -> int:
    from aleph.train.command import train_command

    return train_command(args.preset, args.config, args.overrides, args.arm, args.seed,
                         args.name, args.print_config, again=lambda: again_command(args))
