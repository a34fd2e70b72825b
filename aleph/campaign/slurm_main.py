"""`aleph campaign --on slurm`: check everything, write the scripts, and with --submit hand
them to sbatch (job ids recorded in campaign.json); --dry-run prints them instead.

Every check runs before anything is written or submitted: the configs (the trainer's
resolver), the evaluation inputs, the site options (slurm_site), the partition (sinfo when
here), secrets given by value. A second submission is refused while the jobs recorded by
the first are still in squeue.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TextIO

from aleph._io import atomic_write_text, work_root
from aleph.campaign import finish
from aleph.campaign.procs import package_root
from aleph.campaign.slurm import Extraction, Layout, scripts
from aleph.campaign.slurm_site import Site, check_partition
from aleph.campaign.spec import Spec, resolve_configs
from aleph.campaign.state import STATE_FILE, State, campaign_dir
from aleph.campaign.status import recorded_jobs, squeue_lines
from aleph.errors import AlephError, ConfigError, RunLocked
from aleph.train.identity import RunLock, utc_now


def check_runs(spec: Spec, site: Site) -> dict:
    """Every run's config resolved, and its device against the site's GPUs (one line)."""
    if spec.secrets:
        names = ", ".join(f"{k}: export {k.upper()}" for k in spec.secrets)
        raise ConfigError(f"--set {', '.join(spec.secrets)}=...: with --on slurm a secret "
                          f"reaches the jobs by name only ({names} and give --env "
                          f"{' --env '.join(k.upper() for k in spec.secrets)}); its value never "
                          "goes into a script")
    configs = resolve_configs(spec)
    for rid, cfg in configs.items():
        if site.gpus_per_task and cfg.device == "cpu":
            raise ConfigError(f"{rid}: config field 'device' is 'cpu' but --gpus-per-task is "
                              f"{site.gpus_per_task}; add --set device=cuda (the smoke preset "
                              "trains on CPU) or give --gpus-per-task 0")
        if not site.gpus_per_task and cfg.device == "cuda":
            raise ConfigError(f"{rid}: config field 'device' is 'cuda' but --gpus-per-task is 0; "
                              "give --gpus-per-task 1 (or more), or --set device=cpu")
    return configs


def sbatch(script: Path, dependency: str | None = None) -> str:
    """Submit one script; returns its job id (sbatch --parsable: `id` or `id;cluster`)."""
    argv = ["sbatch", "--parsable"] + ([f"--dependency={dependency}"] if dependency else [])
    try:
        got = subprocess.run([*argv, str(script)], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AlephError(f"sbatch {script}: {e}") from None
    if got.returncode != 0:
        first = (got.stderr.strip().splitlines() or ["no message"])[-1]
        raise AlephError(f"sbatch {script}: refused (exit {got.returncode}): {first}")
    return got.stdout.strip().split(";")[0]


def run_slurm(spec: Spec, site: Site, eval_opts: finish.EvalOptions, *, submit: bool = False,
              dry_run: bool = False, published: bool | None = None, repo: str | None = None,
              extraction: Extraction | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up now: a caller may have replaced it
    finish.check_eval_inputs(check_runs(spec, site), eval_opts)
    if submit and shutil.which("sbatch") is None:
        raise ConfigError("--submit: no sbatch on this host; run this on a login node of the "
                          "cluster, or drop --submit and submit the scripts there")
    note = check_partition(site)
    lay = Layout(work_root(), package_root())
    texts = scripts(spec, site, lay, eval_opts, published=published, repo=repo,
                    extraction=extraction)
    sdir = lay.dir(spec)
    if dry_run:
        if note:
            print(f"# {note}", file=out)
        for name, text in texts.items():
            print(f"# ===== {sdir / name} =====", file=out)
            print(text, end="", file=out)
        out.flush()
        return 0
    cdir = campaign_dir(spec.name)
    cdir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(cdir)  # the one-box campaign's lock: one writer of campaign.json
    try:
        lock.acquire()
    except RunLocked as e:
        raise RunLocked(f"campaign {spec.name} is busy in another process: {e}") from None
    try:
        state = State.open(cdir / STATE_FILE, spec)
        slurm = state.data.setdefault("slurm", {"submissions": []})
        if submit:
            _refuse_live(spec, slurm)
        (sdir / "logs").mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            atomic_write_text(sdir / name, text)
        slurm.update(written=utc_now(), dir=str(sdir), files=sorted(texts), site=asdict(site))
        state.save()
        print(f"scripts written to {sdir}: {', '.join(sorted(texts))}", file=out)
        if note:
            print(note, file=out)
        if submit:
            _submit(state, sdir, texts, out)
        else:
            print(f"review them, then submit: the same command with --submit (or sbatch "
                  f"{sdir / 'train.sbatch'}, then sbatch --dependency=afterok:<array id> "
                  f"{sdir / 'finish.sbatch'})", file=out)
    finally:
        lock.release()
    out.flush()
    return 0


def _refuse_live(spec: Spec, slurm: dict) -> None:
    subs = slurm.get("submissions") or []
    if not subs:
        return
    jobs = list(recorded_jobs(subs[-1]).values())
    live = squeue_lines(jobs)
    if live and not any(x.startswith("squeue") for x in live):
        raise ConfigError(f"campaign {spec.name}: jobs {', '.join(jobs)} of the last "
                          f"submission are still queued or running ({len(live)} squeue "
                          f"line(s)); see `aleph campaign status {spec.name}`, scancel them "
                          "or wait, then submit again")


def _submit(state: State, sdir: Path, texts: dict, out: TextIO) -> None:
    jobs: dict[str, str] = {}
    record = {"at": utc_now(), "jobs": jobs}
    state.data["slurm"]["submissions"].append(record)
    try:
        after = None
        if "extract.sbatch" in texts:
            jobs["extract array"] = sbatch(sdir / "extract.sbatch")
            after = f"afterok:{jobs['extract array']}"
            if "consensus.sbatch" in texts:
                jobs["consensus job"] = sbatch(sdir / "consensus.sbatch", after)
                after = f"afterok:{jobs['consensus job']}"
        jobs["training array"] = sbatch(sdir / "train.sbatch", after)
        jobs["finish job"] = sbatch(sdir / "finish.sbatch", f"afterok:{jobs['training array']}")
    finally:
        state.save()  # whatever was submitted is recorded, even when a later sbatch failed
        if jobs:
            print("submitted: " + ", ".join(f"{k} {v}" for k, v in jobs.items()), file=out)
