"""`aleph train` from its parsed arguments: the executed-code tracer, then one launch.

The tracer starts before the config is resolved and the trainer is imported only then, so
the executed-code record holds every aleph module the launch imports (third-party ones are
imported first, untraced).
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
        recorded = None if config or overrides else _recorded(preset, arm, seed, name)
        cfg = resolve(preset, config, overrides, arm=arm, seed=seed, **(recorded or {}))
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


def _recorded(preset: str, arm: str, seed: int | None, name: str | None) -> dict | None:
    """The config.json fields (secrets aside) of the run this command names, when it sets no
    field: a relaunch with only --arm/--seed/--preset resumes the run as it was made,
    overrides included. None when the run has no config.json yet."""
    from aleph._io import RUNS_DIR, read_json, work_root
    from aleph.errors import ConfigError
    from aleph.record.layout import RunLayout, check_version
    from aleph.sync.transfer import foreign_sync_to
    from aleph.train.config import PRESETS, RETIRED, SECRET_FIELDS
    from aleph.train.identity import run_name

    if preset not in PRESETS:
        return None  # resolve() names the bad preset
    chosen = name or run_name(preset, arm, seed if seed is not None else PRESETS[preset].get("seed", 0))
    path = RunLayout(work_root() / RUNS_DIR / chosen).config
    if not path.is_file():
        return None
    try:  # a pulled run's config.json is a stranger's JSON too
        saved = check_version(path, read_json(path))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: unreadable ({e}); expected the run's recorded config") from None
    if saved.get("preset") != preset or saved.get("arm") != arm:
        return None  # another run's config under this name: the launch refuses it as today
    print(f"aleph train: no field given: run {chosen} continues with its recorded config "
          f"({path})", flush=True)
    skip = {*SECRET_FIELDS, *RETIRED, "format_version", "arm", "seed", "preset"}
    sync_to = saved.get("sync_to")
    if isinstance(sync_to, str) and (src := foreign_sync_to(path.parent, sync_to)):
        skip.add("sync_to")  # chosen by whoever wrote the destination it was pulled from
        print(f"aleph train: run {chosen} was pulled from {src}; the sync_to its config came "
              f"with ({sync_to}) is not used (give --set sync_to={sync_to} to push there)",
              flush=True)
    return {k: v for k, v in saved.items() if k not in skip}
