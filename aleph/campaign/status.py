"""`aleph campaign status NAME`: each run's state read from its run directory, and the Slurm
jobs recorded at submission (their squeue line when squeue is here; sacct is never asked).

`--run RUN` prints one run's line and exits 0 when it is complete, 76 (EXIT_STOPPED) when
its last launch recorded a stop and it is not complete (resumable: what an array element
requeues on), 1 otherwise.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import TextIO

from aleph._io import read_json
from aleph.campaign import procs, rundirs
from aleph.campaign.spec import Spec, resolve_configs
from aleph.campaign.state import STATE_FILE, campaign_dir
from aleph.errors import EXIT_STOPPED, ConfigError, DataError
from aleph.record.launch import STOPPED


def run_state(rd) -> tuple[str, str]:
    """(state, detail) of one run directory: complete, stopped, running, failed, lost, or
    not started."""
    if rundirs.is_complete(rd):
        return "complete", f"final weights {rundirs.weights_sha256(rd)[:16]}"
    if holder := procs.lock_holder(rd):
        return "running", holder
    man = rundirs._manifest(rd)
    launches = [e for e in (man or {}).get("launches") or [] if isinstance(e, dict)]
    if not launches:
        return "not started", f"no launch recorded in {rd}"
    last = launches[-1]
    where = f"launch {len(launches)} on {last.get('host', '?')}"
    status = last.get("status")
    if status == STOPPED:
        return "stopped", f"{where}: stopped, resumable"
    if status == "failed":
        return "failed", f"{where}: failed, exit {last.get('exit_status', '?')}"
    return "lost", f"{where}: recorded {status!r} and no process holds the run lock (killed)"


def _spec(name: str) -> tuple[Spec, dict]:
    path = campaign_dir(name) / STATE_FILE
    if not path.is_file():
        raise ConfigError(f"campaign {name!r}: no state at {path}; expected a campaign written "
                          "by `aleph campaign` (is ALEPH_WORK the same work root?)")
    try:
        data = read_json(path)
        ident = data["spec"]
        spec = Spec(name, ident["preset"], ident["config"], tuple(ident["overrides"]),
                    tuple(ident["arms"]), tuple(ident["seeds"]))
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path}: not a campaign state ({type(e).__name__}: {e})") from None
    return spec, data


def squeue_lines(job_ids: list[str]) -> list[str] | None:
    """squeue's lines for these jobs (array elements expanded), or None without squeue."""
    if not job_ids or shutil.which("squeue") is None:
        return None
    try:
        got = subprocess.run(["squeue", "--noheader", "--array", "--jobs", ",".join(job_ids),
                              "--format=%i %j %T %R %N"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"squeue: {e}"]
    if got.returncode != 0:
        return [f"squeue exit {got.returncode}: {got.stderr.strip()[:200]}"]
    return got.stdout.splitlines()


def _job_order(job: tuple[str, str]) -> tuple[int, str]:
    """Submission order: Slurm's job ids grow (campaign.json keeps its keys sorted)."""
    head = str(job[1]).split("_")[0]
    return (int(head) if head.isdigit() else 0, str(job[1]))


def recorded_jobs(submission: dict) -> dict[str, str]:
    """{what: job id} of one recorded submission, in submission order."""
    return dict(sorted((submission.get("jobs") or {}).items(), key=_job_order))


def run_status(name: str, run: str | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up now: a caller may have replaced it
    spec, data = _spec(name)
    configs = resolve_configs(spec)
    if run is not None:
        if run not in configs:
            raise ConfigError(f"--run {run!r}: not a run of campaign {name}; expected one of "
                              f"{', '.join(configs)}")
        state, detail = run_state(rundirs.run_dir(configs[run]))
        print(f"{run}: {state} ({detail})", file=out, flush=True)
        return 0 if state == "complete" else EXIT_STOPPED if state == "stopped" else 1
    print(f"campaign {name} ({campaign_dir(name)})", file=out)
    for rid, cfg in configs.items():
        state, detail = run_state(rundirs.run_dir(cfg))
        print(f"  {rid:<16} {state:<12} {detail}", file=out)
    subs = (data.get("slurm") or {}).get("submissions") or []
    if not subs:
        print("no Slurm submission recorded (aleph campaign --on slurm --submit)", file=out)
        return 0
    jobs = recorded_jobs(subs[-1])
    print(f"Slurm jobs submitted {subs[-1].get('at')}: "
          + ", ".join(f"{k} {v}" for k, v in jobs.items()), file=out)
    lines = squeue_lines(list(jobs.values()))
    if lines is None:
        print("squeue: not on this host (job states not shown)", file=out)
    elif not lines:
        print("squeue: none of these jobs is queued or running any more", file=out)
    else:
        print("squeue (job, name, state, reason, nodes):", *(f"  {x}" for x in lines), sep="\n",
              file=out)
    out.flush()
    return 0
