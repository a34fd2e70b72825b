"""`aleph train` from its parsed arguments: the executed-code tracer, then one launch.

The tracer starts before the config is resolved, and this module imports the trainer
only once it runs, so the launch's executed-code record (aleph.record.fingerprint) holds
the module code of every aleph module the launch imports; the third-party libraries are
imported first, untraced (their import is not ours).
"""

from __future__ import annotations

from collections.abc import Callable

from aleph._signals import ignore_stops


def train_command(preset: str, config: str | None, overrides: list[str], arm: str,
                  seed: int | None, name: str | None, print_config: bool,
                  again: Callable[[], str]) -> int:
    """Resolve the config (a bad field fails before any work) and run the launch; returns
    its exit code. `again()`: the command line that relaunches the run (its resume hint)."""
    import json

    from aleph.record.fingerprint import Tracer, preimport

    preimport()
    tracer = Tracer().start()
    try:
        from aleph.train.config import resolve, to_dict
        from aleph.train.identity import check_run_name

        if name is not None:
            check_run_name(name)  # before any work, like a bad config field
        cfg = resolve(preset, config, overrides, arm=arm, seed=seed)
        if print_config:
            print(json.dumps(to_dict(cfg), indent=2, sort_keys=True))
            return 0
        from aleph.train.run import train

        try:
            return train(cfg, tracer, name=name, again=again())
        finally:
            ignore_stops()
    finally:
        tracer.close_window()

