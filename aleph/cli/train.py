"""`aleph train`: resolve the config (failing before any work), then hand over to aleph.train."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    # No aleph.train import here: every `aleph` command registers this parser, and the
    # trainer pulls in torch. Preset names are checked by resolve() (ConfigError).
    p = subparsers.add_parser(
        "train", help="train one arm (resumes runs/<arm>-s<seed> automatically)",
        description="Train one arm of E1. Presets: 'e1' (the published shape; give captions= "
        "and targets= with --set) and 'smoke' (tiny model on the embedded data, CPU, well under "
        "a minute). Under torchrun, trains data-parallel (rank 0 writes the run directory). "
        "Exit 75 when another launch holds the run's lock.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", required=True, help="a1_anchored | a2_dense | a3_random")
    p.add_argument("--seed", type=int, default=None, help="run seed (default: the preset's, 0)")
    p.add_argument("--preset", default="e1", help="starting config: e1 | smoke (default e1)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="JSON or YAML mapping of config fields, applied over the preset")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config field (repeatable; value parsed as YAML)")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved (redacted) config as JSON and exit")
    p.set_defaults(func=_train)


def _train(args) -> int:
    import json

    from aleph.record.fingerprint import Tracer, preimport

    # The executed-code record of the launch starts here, before the config is resolved;
    # the third-party libraries are imported first, untraced (their import is not ours).
    preimport()
    tracer = Tracer().start()
    try:
        from aleph.train.config import resolve, to_dict

        cfg = resolve(args.preset, args.config, args.overrides, arm=args.arm, seed=args.seed)
        if args.print_config:
            print(json.dumps(to_dict(cfg), indent=2, sort_keys=True))
            return 0
        from aleph.train.run import train

        return train(cfg, tracer)
    finally:
        tracer.close_window()
