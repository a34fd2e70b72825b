"""`aleph campaign` for real: 3 smoke arms x 2 seeds on 2 CPU slots, killed with SIGKILL
mid-way and restarted; one run held by another launch's run lock; SIGTERM stops cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime

import pytest

from aleph._io import sha256_file
from aleph.campaign import procs, rundirs
from aleph.env.hostinfo import format_cpulist
from aleph.errors import EXIT_STOPPED
from aleph.train.identity import RunLock, utc_now
from tests.campaign.conftest import (
    REPO,
    RUN_SETS,
    TRAIN_ARGS,
    campaign_cmd,
    child_env,
    read_state,
    seed_work,
    start,
    wait_for,
)

RUNS = [f"{arm}-s{seed}" for seed in (0, 1) for arm in ("a1_anchored", "a2_dense", "a3_random")]
HELD = "a2_dense-s0"  # held by "another launch" (this test) while the campaign starts
# Compared with the same runs launched one by one (to save time, two of the six): one the
# killed campaign launched and its successor only watched end, and the one that waited
# for another launch's lock and was launched by the restarted campaign.
COMPARED = ("a1_anchored-s1", HELD)


def _launched(state: dict | None) -> list[dict]:
    return [e for r in (state or {}).get("runs", {}).values() for e in r["launches"]
            if e.get("pid")]


def _t(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.slow
def test_campaign_killed_and_restarted_runs_every_run_once(campaign_work, tmp_path_factory,
                                                           smoke_data_dir):
    work, name = campaign_work, "e2e"
    cmd = campaign_cmd(name, "--devices", "cpu:2")
    held = RunLock(work / "runs" / "smoke" / HELD)
    held.acquire()  # another launch holds this run: the campaign must report it, not run it
    paused: list[int] = []
    try:
        first = start(work, cmd)
        # SIGKILL the campaign as soon as its third launch is on record (one of the first two
        # runs ended, the next one just started): its trainers keep running, orphaned.
        wait_for("a third launch", lambda: len(_launched(read_state(work, name))) >= 3, first)
        first.send_signal(signal.SIGKILL)
        out1 = first.communicate(timeout=30)[0]
        assert first.returncode == -signal.SIGKILL
        state = read_state(work, name)
        orphans = {rid: e["pid"] for rid, r in state["runs"].items() for e in r["launches"]
                   if e["outcome"] == "running" and procs.alive(e["pid"], e["pid_start"])}
        assert orphans, "the killed campaign's trainers should still be running"
        # Hold the orphans still (SIGSTOP) until the restarted campaign has found them, so it
        # meets them running however fast this machine is; SIGCONT lets them finish.
        for pid in orphans.values():
            os.kill(pid, signal.SIGSTOP)
            paused.append(pid)
        assert f"{HELD}: not launched: run directory" in out1
        assert f"(pid {os.getpid()} on host" in out1 and state["runs"][HELD]["status"] == "locked"

        second = start(work, cmd)
        seen, waiting, reported = [], set(), False
        for line in second.stdout:  # the restart reports the orphans and the held run
            seen.append(line)
            waiting |= {rid for rid in orphans if f"{rid}: launch 1 (pid {orphans[rid]} on cpu"
                        in line and "still running: waiting for it, not launching it again" in line}
            reported |= f"{HELD}: still waiting for another launch" in line
            if reported and waiting == set(orphans):
                break
        assert waiting == set(orphans), "".join(seen)
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
        paused.clear()
        released = utc_now()
        held.release()
        out2 = "".join(seen) + second.communicate(timeout=300)[0]
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
        held.release()
    assert second.returncode == 0, out2[-4000:]

    # --- the restart waited for the orphans and launched nothing twice -----------------
    for rid in orphans:  # each ended, watched by the restart, as its one launch
        assert f"{rid}: launch 1 on cpu" in out2 and f"{rid}: launch 2" not in out2, rid
    state = read_state(work, name)
    assert [p["status"] for p in state["processes"]] == ["lost", "finished"]
    camp = work / "campaigns" / name
    assert sorted(p.name for p in (camp / "launches").iterdir()) == sorted(f"{r}.1.log" for r in RUNS)
    slots = {}
    for rid in RUNS:
        run, rd = state["runs"][rid], work / "runs" / "smoke" / rid
        assert run["status"] == "complete" and run["failures"] == 0, (rid, run)
        (e,) = run["launches"]  # one launch per run, across both campaign processes
        assert (e["outcome"], e["exit_status"]) == ("complete", 0), (rid, e)
        assert len(rundirs.trainer_logs(rd)) == 1, rid  # the trainer's own launch logs agree
        (launch,) = json.loads((rd / "manifest.json").read_text())["launches"]
        assert launch["status"] == "complete" and launch["pid"] == e["pid"]
        # pinned: the trainer recorded exactly its slot's CPUs as its affinity
        assert launch["envelope"]["cpu_affinity"] == format_cpulist(e["cpus"]), rid
        assert run["weights_sha256"] == sha256_file(rd / rundirs.FINAL_WEIGHTS)
        slots.setdefault(e["device"], []).append((_t(e["start"]), _t(e["end"]), rid))
    assert set(slots) == {"cpu0", "cpu1"}
    for device, spans in slots.items():  # at most one run per device at a time
        spans.sort()
        for (_, end, a), (start_b, _, b) in zip(spans, spans[1:], strict=False):
            assert end <= start_b, (device, a, b)
    held_launch = state["runs"][HELD]["launches"][0]
    assert _t(held_launch["start"]) >= _t(released) and held_launch["campaign_pid"] == second.pid

    # --- evaluation, report, diff matrix, summary ---------------------------------------
    report = (camp / "report" / "report.md").read_text()
    assert all(f"| {rid} |" in report for rid in RUNS)
    from PIL import Image  # matplotlib's own dependency: reads the picture back

    with Image.open(camp / "report" / "report.png") as png:  # as `aleph report` writes it
        assert (png.format, png.size) == ("PNG", (1500, 800))
        png.load()  # decodes every byte: a truncated or corrupt file raises here
        assert len(png.convert("L").getcolors(256)) > 16  # curves and bars, not a blank canvas
    matrix = json.loads((camp / "diff-matrix.json").read_text())
    assert matrix["runs"] == RUNS and len(matrix["pairs"]) == 15
    for p in matrix["pairs"]:
        assert p["verdict"] in ("equivalent", "equivalent with caveats", "not equivalent"), p
        assert (camp / p["file"]).is_file()
    assert "# campaign e2e: complete" in out2 and "## E1 table" in out2
    assert "## runs diff matrix" in out2 and (camp / "summary.md").read_text() in out2
    for rid in RUNS:
        assert json.loads((work / "runs" / "smoke" / rid / "eval.json").read_text())["weights"]["sha256"] \
            == state["runs"][rid]["weights_sha256"]

    # --- the same runs launched one by one (in a work root of their own) ----------------
    # Started now, so they run beside the next campaign (one process: a free core otherwise);
    # their weights are compared below, after that campaign's checks.
    alone = seed_work(tmp_path_factory.mktemp("one-by-one") / "work", smoke_data_dir)
    procs_ = []
    for rid in COMPARED:
        arm, seed = rid.rsplit("-s", 1)
        procs_.append(subprocess.Popen(
            [sys.executable, "-m", "aleph", "train", "--arm", arm, "--seed", seed, *TRAIN_ARGS],
            cwd=REPO, env=child_env(alone), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True))

    try:
        # --- another campaign over complete runs launches nothing --------------------------
        again = subprocess.run(campaign_cmd("again", "--arms", "a1_anchored", "--devices", "cpu:2"),
                               cwd=REPO, env=child_env(work), capture_output=True, text=True,
                               timeout=120)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
        for rid in ("a1_anchored-s0", "a1_anchored-s1"):
            assert f"{rid}: already complete before this launch: skipped" in again.stdout
            assert read_state(work, "again")["runs"][rid]["launches"] == []
            assert len(rundirs.trainer_logs(work / "runs" / "smoke" / rid)) == 1
        from aleph.train.config import resolve

        other = resolve("smoke", None, [*RUN_SETS[1::2], "max_steps=9"], arm="a1_anchored", seed=0)
        assert "is complete with another config" in rundirs.config_conflict(
            work / "runs" / "smoke" / "a1_anchored-s0", other)

        # --- the same runs launched one by one give the same final weights ------------------
        for rid, p in zip(COMPARED, procs_, strict=True):
            out = p.communicate(timeout=300)[0]
            assert p.returncode == 0, out[-3000:]
            assert sha256_file(alone / "runs" / "smoke" / rid / rundirs.FINAL_WEIGHTS) == \
                state["runs"][rid]["weights_sha256"], rid
    finally:  # none left running if a check above failed
        for p in procs_:
            if p.poll() is None:
                p.kill()
                p.communicate()


def test_sigterm_stops_the_trainers_cleanly_and_exits_76(campaign_work):
    work, name = campaign_work, "stop"
    proc = start(work, campaign_cmd(name, "--arms", "a2_dense", "--seeds", "3", "--devices",
                                    "cpu:1"), ALEPH_TRAIN_PAUSE_AFTER_STEP="2")
    log = work / "campaigns" / name / "launches" / "a2_dense-s3.1.log"
    wait_for("the trainer to pause after step 2",
             lambda: log.is_file() and "paused after step 2" in log.read_text(), proc)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)  # a second one is the same stop
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == EXIT_STOPPED, out[-3000:]
    state = read_state(work, name)
    run = state["runs"]["a2_dense-s3"]
    (e,) = run["launches"]
    assert (run["status"], run["failures"]) == ("queued", 0)  # a stop is not a failure
    assert (e["outcome"], e["exit_status"]) == ("stopped", EXIT_STOPPED)
    assert state["processes"][-1]["status"] == "stopped by SIGTERM"
    assert f"a2_dense-s3: SIGTERM sent to pid {e['pid']}" in out
    assert "# campaign stop: stopped (resumable" in out and "## E1 table" not in out
    rd = work / "runs" / "smoke" / "a2_dense-s3"
    (launch,) = json.loads((rd / "manifest.json").read_text())["launches"]
    assert (launch["status"], launch["exit_status"]) == ("stopped", EXIT_STOPPED)
    assert (rd / "checkpoints" / "step-00000002" / "COMPLETE").is_file()  # it saved on SIGTERM
    assert not procs.alive(e["pid"], e["pid_start"])
