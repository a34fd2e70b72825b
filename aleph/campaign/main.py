"""`aleph campaign` end to end: check, schedule the runs, evaluate, report, diff, summarise."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from aleph._io import atomic_write_text
from aleph.campaign import finish, rundirs
from aleph.campaign.runner import Campaign
from aleph.campaign.spec import (
    Spec,
    check_devices,
    parse_devices,
    redact_overrides,
    resolve_configs,
)
from aleph.campaign.state import COMPLETE, FAILED, LAUNCH_LOGS
from aleph.errors import EXIT_STOPPED, ConfigError
from aleph.train.identity import utc_now

FAILED_EXIT = 1  # some run failed (retries used up, or refused) or could not be evaluated


def run_campaign(spec: Spec, devices: str, eval_opts: finish.EvalOptions, *, retries: int = 2,
                 retry_failed: bool = False, published: bool | None = None,
                 repo: Path | None = None, poll_seconds: float = 1.0,
                 options: dict | None = None, finish_only: bool = False,
                 out: TextIO = sys.stdout) -> int:
    """0: every run complete and evaluated; errors.EXIT_STOPPED (76): stopped by
    SIGTERM/SIGINT (resumable: the same command continues); 1: some run failed or could
    not be evaluated (the rest is still reported), or, with finish_only (nothing launched:
    the Slurm finish job), some run is not complete."""
    if retries < 0:
        raise ConfigError(f"--retries {retries}: expected an integer >= 0")
    if poll_seconds <= 0:
        raise ConfigError(f"--poll-seconds {poll_seconds}: expected a number > 0")
    configs = resolve_configs(spec)  # every run's config, before anything is launched
    devs = parse_devices(devices)
    check_devices(configs, devs)
    finish.check_eval_inputs(configs, eval_opts)
    if eval_opts.device == "auto":  # evaluate where the runs trained
        eval_opts = finish.EvalOptions(**{**eval_opts.__dict__, "device": devs[0].kind})
    if published is None:
        published = spec.preset == "e1"
    options = dict(options or {})
    if "overrides" in options:  # recorded in campaign.json: the secrets' values left out
        options["overrides"] = redact_overrides(options["overrides"])
    c = Campaign(spec, configs, devs, retries=retries, retry_failed=retry_failed,
                 poll_seconds=poll_seconds, out=out)
    with c.session(options):
        if finish_only:
            c.adopt_finished()
        else:
            c.schedule()
        eval_errors = {} if c.stopping else finish.evaluate(c, eval_opts)
        outputs = _where(c)
        if not c.stopping:
            _results(c, eval_errors, published, repo, outputs)
        text = finish.summary(c, eval_errors, outputs)
        atomic_write_text(c.dir / "summary.md", text)
        print(text, end="", file=out, flush=True)
        failed = bool(c.state.with_status(FAILED) or eval_errors
                      or (finish_only and len(c.state.with_status(COMPLETE)) < len(c.state.queue)))
        c.state.data["finish"] = {"at": utc_now(), "stopped": c.stopping, "failed": failed,
                                  "outputs": outputs}
        c.state.save()
    if c.stopping:
        return EXIT_STOPPED
    return FAILED_EXIT if failed else 0


def _where(c: Campaign) -> dict[str, str]:
    return {
        "state": str(c.state.path),
        "campaign log": str(c.dir / "campaign.log"),
        "launch logs (one per launch: the trainer's console)": f"{c.dir / LAUNCH_LOGS}/<run>.<n>.log",
        "run directories (the trainer's own logs in launches/)":
            f"{rundirs.run_dir(next(iter(c.configs.values()))).parent}/<arm>-s<seed>/",
        "summary": str(c.dir / "summary.md"),
    }


def _results(c: Campaign, eval_errors: dict[str, str], published: bool, repo: Path | None,
             outputs: dict[str, str]) -> None:
    complete = c.state.with_status(COMPLETE)
    if evaluated := [r for r in complete if r not in eval_errors]:
        md, paths = finish.report(c, evaluated, published)
        print(md, file=c.out, flush=True)
        outputs["report"] = f"{paths[0]} ({', '.join(p.name for p in paths[1:])})"
    else:
        outputs["report"] = "not written: no evaluated run"
    if len(complete) >= 2:
        md, md_path, js_path = finish.diff_matrix(c, complete, repo)
        print(md, file=c.out, flush=True)
        outputs["diff matrix"] = f"{md_path} ({js_path.name}; each pair in {c.dir / 'diffs'}/)"
    else:
        outputs["diff matrix"] = "not written: fewer than two complete runs"
