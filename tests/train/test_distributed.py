"""DDP on torchrun (gloo, CPU): same loss trajectory as one process, rank 0 the only writer,
resume across a world-size change."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys

import pytest

from tests.train.conftest import (
    REPO,
    completed_run,
    run_train,
    start_train,
    tb_scalars,
    train_cmd,
    wait_for_log,
)

SETS = ("max_steps=8", "ckpt_every_steps=100")


def _torchrun(nproc: int, arm: str, seed: int) -> list[str]:
    with socket.socket() as s:  # a free port for the c10d store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = train_cmd(arm, seed, *SETS)
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "aleph", *base[3:]]


def _losses(run_dir):
    return tb_scalars(run_dir)["train/loss"]


@pytest.fixture(scope="module")
def single(tmp_path_factory, smoke_data_dir):
    return _losses(completed_run(tmp_path_factory, smoke_data_dir, "a1_anchored", 4, *SETS))


def test_two_gloo_ranks_follow_the_single_process_trajectory(train_work, single):
    proc = run_train(train_work, _torchrun(2, "a1_anchored", 4), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = train_work / "runs" / "smoke" / "a1_anchored-s4"
    two = _losses(run)
    assert [s for s, _ in two] == [s for s, _ in single] == list(range(1, 9))
    assert [v for _, v in two] == pytest.approx([v for _, v in single], abs=1e-5)
    assert single[-1][1] < single[0][1]

    # --- rank 0 is the only writer -----------------------------------------------------
    logs = sorted(p.name for p in (run / "launches").glob("*.log"))
    assert len(logs) == 2 and logs[1] == logs[0].replace(".log", ".rank1.log")
    # rank 0's launch records beside its log: heartbeat and executed code, none of rank 1
    assert sorted(p.name for p in (run / "launches").iterdir() if p.suffix == ".json") == [
        logs[0].replace(".log", ".code.json"), logs[0].replace(".log", ".heartbeat.json")]
    rank0_text = (run / "launches" / logs[0]).read_text()
    rank1_text = (run / "launches" / logs[1]).read_text()
    pid0 = int(re.search(r"rank 0 of 2, host \S+, pid (\d+)", rank0_text).group(1))
    pid1 = int(re.search(r"rank 1 of 2, host \S+, pid (\d+)", rank1_text).group(1))
    assert all(line.startswith(f"[{logs[0][:-4]}/rank1] ") for line in rank1_text.splitlines())
    assert "resume state saved" not in rank1_text and "final weights" not in rank1_text
    (launch,) = json.loads((run / "manifest.json").read_text())["launches"]
    assert (launch["pid"], launch["world_size"], launch["exit_status"]) == (pid0, 2, 0)
    assert json.loads((run / "run.lock").read_text())["pid"] == pid0
    (events,) = list((run / "tb").iterdir())
    assert events.name.endswith(f".{pid0}.0")  # one event file, rank 0's
    others = [p for p in run.rglob("*") if p.is_file() and p.name != logs[1]]
    assert not any(str(pid1) in p.name for p in others)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-00000008"]


def test_resume_across_world_size_change(train_work, single):
    run = train_work / "runs" / "smoke" / "a1_anchored-s4"
    first = start_train(train_work, _torchrun(2, "a1_anchored", 4), ALEPH_TRAIN_PAUSE_AFTER_STEP="3")
    wait_for_log(run, "paused after step 3", first, timeout=240)
    first.send_signal(signal.SIGTERM)  # torchrun forwards it to both ranks
    first.communicate(timeout=120)
    # (torchrun itself exits 1 after a SIGTERM; the ranks save and exit 76, EXIT_STOPPED)
    meta = json.loads((run / "checkpoints" / "step-00000003" / "meta.json").read_text())
    assert (meta["step"], meta["world_size"]) == (3, 2)

    again = run_train(train_work, train_cmd("a1_anchored", 4, *SETS))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resume across a world size change 2 -> 1" in again.stdout
    resumed = _losses(run)
    assert [s for s, _ in resumed] == list(range(1, 9))
    assert [v for _, v in resumed] == pytest.approx([v for _, v in single], abs=1e-5)


def _srun_tasks(work, job: str, arm: str, seed: int) -> list:
    """Two processes with the environment srun gives the tasks of one two-task step on one
    node (the real cluster runs the same code across nodes: tests/cluster)."""
    from tests.train.conftest import child_env

    procs = []
    for rank in range(2):
        env = child_env(work, SLURM_JOB_ID=job, SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="2",
                        SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank),
                        SLURM_STEP_NODELIST="localhost")
        procs.append(subprocess.Popen(train_cmd(arm, seed, *SETS), cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def test_srun_tasks_form_one_world_and_two_jobs_on_one_node_get_two_ports(train_work, single):
    """srun-native DDP: ranks from SLURM_PROCID/SLURM_LOCALID/SLURM_STEP_NUM_TASKS, the store
    on a port rank 0 got from the kernel and published under the work root. Two such jobs
    at once on one node: both train (no port collision), the same trajectory as one process,
    and the port files are gone afterwards."""
    jobs = {"101": _srun_tasks(train_work, "101", "a1_anchored", 4),
            "102": _srun_tasks(train_work, "102", "a2_dense", 4)}
    for job, procs in jobs.items():
        for p in procs:
            out = p.communicate(timeout=300)[0]
            assert p.returncode == 0, f"job {job}: {out[-3000:]}"
    run = train_work / "runs" / "smoke" / "a1_anchored-s4"
    (launch,) = json.loads((run / "manifest.json").read_text())["launches"]
    assert launch["world_size"] == 2
    assert [v for _, v in _losses(run)] == pytest.approx([v for _, v in single], abs=1e-5)
    assert json.loads((train_work / "runs" / "smoke" / "a2_dense-s4" / "manifest.json")
                      .read_text())["launches"][0]["world_size"] == 2
    assert list((train_work / "cache" / "rendezvous").iterdir()) == []
