"""`aleph campaign --on slurm --submit` on the real two-node cluster (CI's cluster tier).

Prints what the closing note quotes: the hostnames the elements ran on, the array and finish
job ids, the trainer's stop and resume lines, and the final weights' sha256 beside those of
an uninterrupted run (trained here, not on the cluster, once per session: a 1-rank and a
2-rank run, the latter serving both two-node layouts).

A time limit hit mid-run, deterministically: the trainer pauses after step 3
(ALEPH_TRAIN_PAUSE_AFTER_STEP; a resumed launch starts after step 3 and never pauses again),
then the test shortens the element's TimeLimit with `scontrol update` so that less than the
signal lead is left: Slurm's own `--signal=TERM@LEAD` then stops it at its next timer tick.
The limit is raised back once the element has requeued itself. The requeue hold is the
harness's `cred_expire` (10 s + 1) instead of 121 s.

The interrupted cases run two at a time so that they share these waits (TOGETHER): both
two-node layouts at once (1 CPU per node each), then the one-node time limit on node2 beside
the preemption on node1 (the high job takes node1 alone). Each case still asserts and prints
only its own element's lines.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aleph._io import sha256_file
from aleph.campaign.rundirs import FINAL_WEIGHTS

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
ROWS = 1024
RUN = ["--set", f"smoke_rows={ROWS}", "--set", "batch_size=32", "--set", "max_steps=8"]
PAUSE = 3
LEAD = 120  # seconds: the element's --signal-lead (its --time is 10 minutes)


@pytest.fixture(scope="session")
def smoke_data(tmp_path_factory) -> Path:
    from aleph.data.smoke import ensure_smoke_data

    root = tmp_path_factory.mktemp("smoke") / f"smoke-{ROWS}"
    ensure_smoke_data(root, rows=ROWS)
    return root


def _work(base: Path, smoke: Path) -> Path:
    """A work root on the filesystem every node sees, with the smoke data in place."""
    work = base / f"w{time.monotonic_ns()}"
    shutil.copytree(smoke, work / "data" / f"smoke-{ROWS}")
    return work


def _env(slurm, work: Path, **extra: str) -> dict[str, str]:
    env = {**slurm.env, "ALEPH_WORK": str(work), "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    for hook in ("ALEPH_TRAIN_PAUSE_AFTER_STEP", "ALEPH_TRAIN_PAUSE_IN_PREFLIGHT",
                 "ALEPH_FAULT"):
        env.pop(hook, None)
    return {**env, **extra}


def _campaign(slurm, work: Path, name: str, *extra: str, submit: bool = True,
              **env: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "aleph", "campaign", "--on", "slurm", "--name", name,
            "--preset", "smoke", *RUN, "--no-probes", "--partition", slurm.partition,
            "--python", sys.executable, *(["--submit"] if submit else []), *extra]
    return subprocess.run(argv, cwd=REPO, env=_env(slurm, work, **env), capture_output=True,
                          text=True, timeout=180)


def _submit(slurm, work: Path, name: str, *extra: str, **env: str) -> tuple[str, str]:
    p = _campaign(slurm, work, name, *extra, **env)
    assert p.returncode == 0, p.stdout + p.stderr
    m = re.search(r"submitted: training array (\d+), finish job (\d+)", p.stdout)
    assert m, p.stdout
    print(f"{name}: training array {m[1]}, finish job {m[2]}")
    return m[1], m[2]


def _log(work: Path, name: str, array: str, task: int) -> Path:
    return work / "campaigns" / name / "slurm" / "logs" / f"train-{array}_{task}.out"


def _wait_text(path: Path, text: str, slurm, job: str, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = path.read_text(errors="replace") if path.is_file() else ""
        if text in got:
            return got
        time.sleep(0.5)
    got = path.read_text(errors="replace") if path.is_file() else "(no log)"
    raise AssertionError(f"{path}: no {text!r} within {timeout:.0f} s; job {job}: "
                         f"{slurm.job(job)}\n{got[-3000:]}\n{slurm.log_tail()}")


def _weights(work: Path, arm: str = "a2_dense", seed: int = 0) -> str:
    return sha256_file(work / "runs" / "smoke" / f"{arm}-s{seed}" / FINAL_WEIGHTS)


def _quote(text: str, *needles: str) -> None:
    """Print each log line holding one of the needles (the lines the note quotes)."""
    for line in text.splitlines():
        if any(n in line for n in needles):
            print(f"  {line.strip()}")


class _References:
    """The uninterrupted runs every resumed run is compared with, trained here (not on the
    cluster) and once per session: the weights do not depend on where a run ran, only on its
    config and its number of ranks. Both start at once in the background; `sha(ranks)` waits
    for one and returns its final weights' sha256."""

    def __init__(self, base: Path, smoke: Path):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        for hook in ("ALEPH_TRAIN_PAUSE_AFTER_STEP", "ALEPH_TRAIN_PAUSE_IN_PREFLIGHT",
                     "ALEPH_FAULT"):
            env.pop(hook, None)
        train = ["-m", "aleph", "train", "--arm", "a2_dense", "--seed", "0", "--preset", "smoke",
                 *RUN]
        with socket.socket() as s:  # a free port for the 2-rank run's c10d store
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        launch = {1: [sys.executable, *train],
                  2: [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                      "--master_addr", "127.0.0.1", "--master_port", str(port), *train]}
        self.runs: dict[int, tuple[Path, subprocess.Popen]] = {}
        for ranks, argv in launch.items():
            work = _work(base, smoke)
            with open(work / "reference.log", "wb") as log:
                proc = subprocess.Popen(
                    argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env={**env, "ALEPH_WORK": str(work),
                                                   "PYTHONPATH": str(REPO),
                                                   "OMP_NUM_THREADS": "1"})
            self.runs[ranks] = (work, proc)

    def sha(self, ranks: int) -> str:
        work, proc = self.runs[ranks]
        rc = proc.wait(timeout=300)
        assert rc == 0, (f"the {ranks}-rank reference run exited {rc}:\n"
                         f"{(work / 'reference.log').read_text(errors='replace')[-3000:]}")
        return _weights(work)

    def close(self) -> None:
        for _, proc in self.runs.values():
            if proc.poll() is None:
                proc.terminate()  # torchrun forwards it to its workers
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=30)


@pytest.fixture(scope="session")
def references(tmp_path_factory, smoke_data):
    refs = _References(tmp_path_factory.mktemp("ref"), smoke_data)
    try:
        yield refs
    finally:
        refs.close()


def test_smoke_campaign_is_an_array_over_both_nodes_then_the_finish_job(slurm, smoke_data):
    work = _work(slurm.work, smoke_data)
    # Three one-CPU elements at once cannot fit on one node (2 CPUs): both nodes run some.
    array, fin = _submit(slurm, work, "smoke", "--seeds", "0", "--time", "10",
                         "--signal-lead", "60")
    slurm.wait_state(fin, "COMPLETED", timeout=420)
    hosts = {}
    for task in range(3):
        assert slurm.state(f"{array}_{task}") == "COMPLETED"
        text = _log(work, "smoke", array, task).read_text()
        hosts[task] = re.search(r"batch host (\S+)\)", text)[1]
        run = re.search(r"run (\S+) ", text)[1]
        print(f"array {array} element {task}: {run} on {hosts[task]}")
    assert set(hosts.values()) == set(slurm.nodes), hosts
    status = subprocess.run([sys.executable, "-m", "aleph", "campaign", "status", "smoke"],
                            cwd=REPO, env=_env(slurm, work), capture_output=True, text=True,
                            timeout=120)
    assert status.returncode == 0 and status.stdout.count(" complete ") == 3, status.stdout
    assert f"training array {array}, finish job {fin}" in status.stdout
    cdir = work / "campaigns" / "smoke"
    assert (cdir / "report").is_dir() and (cdir / "diff-matrix.md").is_file()
    finish_log = (cdir / "slurm" / "logs" / f"finish-{fin}.out").read_text()
    assert "# campaign smoke: complete" in finish_log, finish_log[-3000:]
    print(f"finish job {fin}: {finish_log.splitlines()[0]}; report and diff matrix written")


LAYOUTS = {
    "one node": [],
    "two nodes, srun-native DDP": ["--nodes", "2"],
    "two nodes, srun torchrun": ["--nodes", "2", "--launcher", "torchrun"],
}


def _elapsed_s(fields: dict) -> int:
    d, _, hms = fields["RunTime"].rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return int(d or 0) * 86400 + h * 3600 + m * 60 + s


# Cases whose elements run at once, so that they share the waits (a timer tick, a requeue
# hold): each two-node element takes 1 CPU per node (2 fit); the one-node time-limit element
# is pinned to node2 and the preempted one to node1, whose high job then preempts it alone.
TOGETHER = (("two nodes, srun torchrun", "two nodes, srun-native DDP"), ("one node", "preempt"))
PINNED = {"one node": "node2", "preempt": "node1"}


def _stop(slurm, elements: dict[str, tuple[str, Path]]) -> str | None:
    """Pause each element (case -> (element, log)), then stop the time-limit cases' with a
    time limit under the lead and the "preempt" case's with a high-partition job on its
    node; returns the high job's id once it completed (None without a "preempt" case)."""
    for element, log in elements.values():
        _wait_text(log, f"paused after step {PAUSE}", slurm, element)
    limited = {case: el for case, el in elements.items() if case != "preempt"}
    for element, _ in limited.values():
        minutes = _elapsed_s(slurm.job(element)) // 60 + 2  # 60-120 s left: under the lead
        slurm.run(["scontrol", "update", f"JobId={element}", f"TimeLimit={minutes}"])
    high = None
    if "preempt" in elements:
        node = slurm.job(elements["preempt"][0])["NodeList"]
        high = slurm.submit("#!/bin/sh\nsleep 5\n", f"--partition={slurm.high_partition}",
                            f"--nodelist={node}", "--exclusive",
                            f"--output={slurm.work}/high-%j.out")
    # Each limit is raised back as soon as its element requeued itself, within the 11 s
    # requeue hold: a restart under the short limit would be stopped again.
    waiting, deadline = dict(limited), time.monotonic() + 120
    while waiting:
        for case, (element, log) in list(waiting.items()):
            if "requeueing this element alone" in log.read_text(errors="replace"):
                slurm.run(["scontrol", "update", f"JobId={element}", "TimeLimit=10"])
                del waiting[case]
            elif time.monotonic() > deadline:
                _wait_text(log, "requeueing this element alone", slurm, element, timeout=0)
        time.sleep(0.3)
    if high is not None:
        slurm.wait_state(high, "COMPLETED", timeout=180)
    for element, _ in elements.values():
        slurm.wait_state(element, "COMPLETED", timeout=300)
    return high


class _Interrupted:
    """Each case's element stopped mid-run (a time limit, or "preempt": preemption),
    requeued and resumed; the cases of one TOGETHER group are submitted and driven at once,
    by the first test that asks for one of them (the `slurm` fixture cancels leftovers only
    after that test)."""

    def __init__(self, slurm, smoke: Path):
        self.slurm, self.smoke = slurm, smoke
        self.done: dict[str, dict | BaseException] = {}

    def get(self, case: str) -> dict:
        """{"element", "work", "text", "node", "high"} of `case`'s resumed run."""
        if case not in self.done:
            group = next(g for g in TOGETHER if case in g)
            try:
                self._run(group)
            except BaseException as e:
                self.done.update((c, e) for c in group)
                raise
        got = self.done[case]
        if isinstance(got, BaseException):
            raise AssertionError(f"{case}: its group failed earlier: {got}")
        return got

    def _run(self, group: tuple[str, ...]) -> None:
        submitted = {}
        for case in group:
            work = _work(self.slurm.work, self.smoke)
            extra = ["--arms", "a2_dense", "--seeds", "0", "--time", "10", "--signal-lead",
                     str(LEAD), *LAYOUTS.get(case, [])]
            if case != "preempt":
                extra += ["--max-requeues", "2"]
            if case in PINNED:
                extra.append(f"--sbatch-line=--nodelist={PINNED[case]}")
            name = "preempt" if case == "preempt" else "limit"
            array, _ = _submit(self.slurm, work, name, *extra,
                               ALEPH_TRAIN_PAUSE_AFTER_STEP=str(PAUSE))
            submitted[case] = (f"{array}_0", work, _log(work, name, array, 0))
        high = _stop(self.slurm, {c: (e, log) for c, (e, _, log) in submitted.items()})
        for case, (element, work, log) in submitted.items():
            self.done[case] = {"element": element, "work": work, "text": log.read_text(),
                               "node": self.slurm.job(element)["NodeList"], "high": high}


@pytest.fixture(scope="module")
def interrupted(slurm_cluster, smoke_data):
    return _Interrupted(slurm_cluster, smoke_data)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_time_limit_mid_run_stops_requeues_and_resumes_bitwise(slurm, layout, interrupted,
                                                                references):
    run = interrupted.get(layout)
    text = run["text"]
    print(f"{layout}: element {run['element']} on {run['node']}")
    _quote(text, "aleph-slurm:", "stopped by SIG", "resume: step", "resume state saved",
           "a2_dense-s0: stopped (")
    assert f"stopped by SIGTERM after step {PAUSE}" in text
    assert f"resume: step {PAUSE}," in text
    assert "requeues so far 1 (limit 2)" in text
    # Both two-node layouts are 2 ranks: one uninterrupted 2-rank run serves them both.
    reference = references.sha(1 if layout == "one node" else 2)
    got = _weights(run["work"])
    print(f"{layout}: final weights sha256 {got} (resumed) vs {reference} (uninterrupted): "
          f"{'bitwise equal' if got == reference else 'DIFFERENT'}")
    assert got == reference


def test_preemption_by_the_high_partition_stops_requeues_and_resumes(slurm, interrupted,
                                                                     references):
    run = interrupted.get("preempt")
    text, element = run["text"], run["element"]
    print(f"preemption: job {run['high']} on partition {slurm.high_partition} takes "
          f"{run['node']} from element {element}")
    _quote(text, "aleph-slurm:", "stopped by SIG", "resume: step")
    assert f"stopped by SIGTERM after step {PAUSE}" in text and f"resume: step {PAUSE}," in text
    assert "requeues so far 1 (limit 3)" in text
    reference = references.sha(1)
    assert _weights(run["work"]) == reference
    print(f"preemption: final weights bitwise equal to the uninterrupted run ({reference})")


def test_the_run_lock_excludes_across_nodes(slurm):
    """Two steps on two nodes, one run directory: the second launch's RunLock is refused."""
    rd = slurm.work / "lockrun"
    held = slurm.work / "lock-held"
    hold = ("import sys, time; from pathlib import Path; from aleph.train.identity import RunLock; "
            f"l = RunLock(Path({str(rd)!r})); l.acquire(); Path({str(held)!r}).touch(); "
            "time.sleep(30)")
    probe = ("from pathlib import Path; from aleph.train.identity import RunLock; "
             "from aleph.errors import RunLocked\ntry:\n"
             f"    RunLock(Path({str(rd)!r})).acquire()\nexcept RunLocked as e:\n"
             "    print(e); raise SystemExit(0)\nraise SystemExit('not excluded')")
    env = {**slurm.env, "PYTHONPATH": str(REPO)}
    a, b = slurm.nodes
    holder = subprocess.Popen(["srun", "-N1", "-n1", f"--nodelist={a}", sys.executable, "-c",
                               hold], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not held.exists():
            assert holder.poll() is None and time.monotonic() < deadline, holder.stdout.read()
            time.sleep(0.2)
        out = slurm.run(["srun", "-N1", "-n1", f"--nodelist={b}", sys.executable, "-c", probe],
                        env={"PYTHONPATH": str(REPO)}).stdout.strip()
    finally:
        holder.terminate()
        holder.wait(timeout=30)
    print(f"run lock: held on {a}; on {b}: {out}")
    assert f"on host {a}" in out


@pytest.mark.parametrize("argv,expect", [
    (["--partition", "gpu"], "--partition 'gpu': not a partition of this cluster; sinfo lists "
     "high, normal"),
    (["--time", "2", "--signal-lead", "300"], "--time 2 (120 s) is not longer than "
     "--signal-lead 300 s"),
])
def test_bad_input_is_refused_before_anything_is_submitted(slurm, smoke_data, argv, expect):
    work = _work(slurm.work, smoke_data)
    p = _campaign(slurm, work, "bad", "--arms", "a2_dense", "--seeds", "0", *argv)
    print(f"refused: {p.stderr.strip()}")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and expect in p.stderr, p.stderr
    assert not (work / "campaigns").exists()
    assert slurm.run(["squeue", "--noheader"]).stdout.strip() == ""
