"""`aleph campaign --on slurm` without a cluster: the scripts against reviewed golden files,
the one-line refusals before anything is written or submitted, the submission's job ids
(through sbatch/squeue stand-ins on PATH: the real Slurm runs in tests/cluster), and
`aleph campaign status` read from real run directories.

ALEPH_UPDATE_GOLDEN=1 rewrites tests/campaign/golden/*.txt from the code: review the diff.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aleph.campaign import slurm_main
from aleph.cli import main
from aleph.errors import EXIT_STOPPED
from tests.campaign.conftest import RUN_SETS, child_env, wait_for

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
SHARED = "/shared/aleph-work"  # the work root the golden scripts name (never created)
STS = REPO / "tests" / "fixtures" / "sts"
ONE = ["--arms", "a2_dense", "--seeds", "0"]

GOLDEN_CASES = {
    # The smoke campaign as tests/cluster submits it: CPU, one task per element. The python
    # is not under /opt/aleph, where the image keeps the repository (REPO is replaced below).
    "smoke": ["--preset", "smoke", "--seeds", "0", "1", "--no-probes", "--python",
              "/srv/aleph-e1/.venv/bin/python", "--partition", "normal", "--time", "00:10:00",
              "--signal-lead", "60", "--max-requeues", "2"],
    # E1 on GPUs: two nodes of four ranks per run (srun-native), Apptainer, a secret by name,
    # and the teacher extraction in 8 shards plus the consensus job before training.
    "e1": ["--preset", "e1", "--set", "captions=/shared/data/captions.parquet", "--set",
           "targets=/shared/data/targets", "--set", "device=cuda", "--tasks", "tiny",
           "--tasks-dir", str(STS), "--no-probes", "--gpus-per-task", "1", "--cpus-per-task",
           "8", "--nodes", "2", "--tasks-per-node", "4", "--partition", "gpu", "--account",
           "proj42", "--qos", "normal", "--time", "2-00:00:00", "--array-limit", "3",
           "--sbatch-line=--constraint=a40", "--container-exec",
           "apptainer exec --nv --bind /shared /shared/images/aleph-e1.sif", "--env",
           "HF_TOKEN", "--extract-shards", "8", "--extract-python", "/opt/teachers/bin/python",
           "--extract-args", "--captions /shared/data/captions.parquet --out "
           "/shared/data/teachers", "--consensus-args", "--teachers /shared/data/teachers/"
           "bert-base-uncased /shared/data/teachers/roberta-base --out /shared/data/targets"],
    # The same with `srun torchrun` (one agent per node) and pyxis.
    "e1-torchrun": ["--preset", "e1", "--set", "captions=/shared/data/captions.parquet",
                    "--set", "targets=/shared/data/targets", "--set", "device=cuda",
                    "--tasks", "tiny", "--tasks-dir", str(STS), "--no-probes",
                    "--gpus-per-task", "1", "--nodes", "2", "--tasks-per-node", "4",
                    "--launcher", "torchrun", "--partition", "gpu", "--time", "1-00:00:00",
                    "--container-image", "/shared/images/aleph-e1.sqsh"],
}


@pytest.fixture
def no_sinfo(monkeypatch):
    """The partition check is a separate test: here sinfo is never asked."""
    monkeypatch.setattr(slurm_main, "check_partition", lambda site: None)


def _dry_run(capsys, argv: list[str]) -> str:
    rc = main(["campaign", "--on", "slurm", "--dry-run", "--name", "golden", *argv])
    got = capsys.readouterr()
    assert rc == 0, got.err
    return got.out.replace(str(REPO), "<REPO>")


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_scripts_match_the_reviewed_golden_files(case, capsys, monkeypatch, no_sinfo):
    monkeypatch.setenv("ALEPH_WORK", SHARED)
    text = _dry_run(capsys, GOLDEN_CASES[case])
    path = GOLDEN / f"{case}.txt"
    if os.environ.get("ALEPH_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"{path}: missing; ALEPH_UPDATE_GOLDEN=1 writes it"
    assert text == path.read_text(), f"{case}: scripts differ from {path} (review, then " \
        "ALEPH_UPDATE_GOLDEN=1)"
    assert not Path(SHARED).exists()  # a dry run writes nothing


def test_written_scripts_are_valid_bash_and_recorded(work, capsys, no_sinfo):
    rc = main(["campaign", "--on", "slurm", "--name", "w", "--preset", "smoke", *ONE,
               "--no-probes", "--time", "5", "--signal-lead", "30", "--env", "HF_TOKEN"])
    out = capsys.readouterr().out
    sdir = work / "campaigns" / "w" / "slurm"
    assert rc == 0 and f"scripts written to {sdir}" in out
    for name in ("train.sbatch", "finish.sbatch"):
        subprocess.run(["bash", "-n", str(sdir / name)], check=True)  # parses as bash
    assert (sdir / "train.table").read_text().splitlines()[1] == "0\ta2_dense\t0\ta2_dense-s0"
    state = json.loads((work / "campaigns" / "w" / "campaign.json").read_text())
    assert state["slurm"]["site"]["signal_lead_s"] == 30 and state["slurm"]["submissions"] == []


def test_the_cli_defaults_are_the_site_defaults():
    from aleph.campaign import slurm_site
    from aleph.cli import campaign

    assert (campaign.DEFAULT_LEAD_S, campaign.DEFAULT_MAX_REQUEUES, campaign.LAUNCHERS) == (
        slurm_site.DEFAULT_LEAD_S, slurm_site.DEFAULT_MAX_REQUEUES, slurm_site.LAUNCHERS)


def _fake_bin(tmp_path: Path, **tools: str) -> Path:
    """Executables standing in for Slurm's clients (their argv logged to <name>.argv)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in tools.items():
        exe = bin_dir / name
        exe.write_text(f'#!/bin/sh\necho "$*" >> "{bin_dir}/{name}.argv"\n{body}\n')
        exe.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("argv,expect", [
    (["--partition", "gpu"], "--partition 'gpu': not a partition of this cluster; sinfo lists "
     "high, normal"),
    (["--time", "4", "--signal-lead", "300"], "--time 4 (240 s) is not longer than "
     "--signal-lead 300 s"),
    (["--time", "1:2:3:4"], "--time '1:2:3:4': expected a Slurm time limit"),
    (["--signal-lead", "0"], "--signal-lead 0: expected seconds from 1 to 65535"),
    (["--container-exec", "docker run --gpus all img"], "docker runs the container beside "
     "Slurm, not under it"),
    (["--env", "HF TOKEN"], "--env 'HF TOKEN': expected a variable name"),
    (["--sbatch-line=#SBATCH --mem=1G"], "--sbatch-line '#SBATCH --mem=1G': expected one "
     "sbatch option"),
    (["--nodes", "0"], "--nodes 0: expected an integer >= 1"),
    (["--sbatch-line=--export=ALL,HF_TOKEN=SeCrEt"], "--sbatch-line: holds a Hugging Face "
     "token by value"),
    (["--container-exec", "apptainer exec --env HF_TOKEN=SeCrEt img.sif"], "--container-exec: "
     "holds a Hugging Face token by value"),
    (["--extract-shards", "2", "--extract-args", "--out o --x hf_SeCrEtSeCrEtSeCrEtSeCrEt"],
     "--extract-args: holds a Hugging Face token by value"),
    (["--gpus-per-task", "1"], "a2_dense-s0: config field 'device' is 'cpu' but "
     "--gpus-per-task is 1"),
    (["--set", "hf_token=hf_SeCrEt"], "--set hf_token=...: with --on slurm a secret reaches "
     "the jobs by name only"),
    (["--extract-shards", "3"], "--extract-shards: expected N >= 1 and --extract-args"),
])
def test_bad_input_is_one_line_before_anything_is_submitted(work, tmp_path, capsys, monkeypatch,
                                                            argv, expect):
    bin_dir = _fake_bin(tmp_path, sinfo="printf 'normal\\nhigh\\nnormal\\n'",
                        sbatch="echo 1; exit 0")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    rc = main(["campaign", "--on", "slurm", "--submit", "--preset", "smoke", *ONE, "--no-probes",
               *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("aleph campaign: error: ") and expect in err, err
    assert err.count("\n") == 1 and "SeCrEt" not in err
    assert not (work / "campaigns").exists() and not (bin_dir / "sbatch.argv").exists()


def test_submit_chains_the_finish_job_and_status_shows_the_job_ids(work, tmp_path, capsys,
                                                                   monkeypatch):
    bin_dir = _fake_bin(
        tmp_path, sinfo="echo normal",
        # the training array is job 41, the finish job 42 (sbatch --parsable: id;cluster)
        sbatch='case "$*" in *train.sbatch) echo "41;c1";; *) echo 42;; esac',
        squeue='echo "41_0 aleph-w-train RUNNING None node1"')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    argv = ["campaign", "--on", "slurm", "--submit", "--name", "w", "--preset", "smoke", *ONE,
            "--no-probes", "--partition", "normal", "--time", "5", "--signal-lead", "30"]
    assert main(argv) == 0
    assert "submitted: training array 41, finish job 42" in capsys.readouterr().out
    calls = (bin_dir / "sbatch.argv").read_text().splitlines()
    sdir = work / "campaigns" / "w" / "slurm"
    assert calls == [f"--parsable {sdir}/train.sbatch",
                     f"--parsable --dependency=afterok:41 {sdir}/finish.sbatch"]
    state = json.loads((work / "campaigns" / "w" / "campaign.json").read_text())
    assert state["slurm"]["submissions"][0]["jobs"] == {"training array": "41", "finish job": "42"}
    # a second submission while squeue still lists the first one's jobs: refused
    assert main(argv) == 2
    assert "jobs 41, 42 of the last submission are still queued or running" in \
        capsys.readouterr().err
    assert main(["campaign", "status", "w"]) == 0
    out = capsys.readouterr().out
    assert "a2_dense-s0      not started" in out
    assert "Slurm jobs submitted" in out and "training array 41, finish job 42" in out
    assert "41_0 aleph-w-train RUNNING None node1" in out


@pytest.mark.slow  # two real trainer launches (about 10 s): the states come from the trainer
def test_status_reads_run_directories_and_finish_only_reports(campaign_work, capsys):
    work = campaign_work
    rc = main(["campaign", "--on", "slurm", "--name", "st", "--preset", "smoke", "--arms",
               "a2_dense", "a3_random", "--seeds", "0", *RUN_SETS, "--no-probes", "--time", "5",
               "--signal-lead", "30"])
    assert rc == 0
    capsys.readouterr()
    train = [sys.executable, "-m", "aleph", "train", "--arm", "a2_dense", "--seed", "0",
             "--preset", "smoke", *RUN_SETS]
    proc = subprocess.Popen(train, cwd=REPO, env=child_env(work, ALEPH_TRAIN_PAUSE_AFTER_STEP="2"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for("the trainer to hold its run lock",
             lambda: (work / "runs" / "smoke" / "a2_dense-s0" / "run.lock").is_file()
             and main(["campaign", "status", "st", "--run", "a2_dense-s0"]) == 1
             and "running" in capsys.readouterr().out, proc, timeout=120)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == EXIT_STOPPED
    assert main(["campaign", "status", "st", "--run", "a2_dense-s0"]) == EXIT_STOPPED
    assert capsys.readouterr().out.startswith("a2_dense-s0: stopped (launch 1 on ")
    subprocess.run(train, cwd=REPO, env=child_env(work), check=True, capture_output=True)
    assert main(["campaign", "status", "st", "--run", "a2_dense-s0"]) == 0
    assert main(["campaign", "status", "st", "--run", "a3_random-s0"]) == 1
    out = capsys.readouterr().out
    assert "a2_dense-s0: complete (final weights " in out
    assert "a3_random-s0: not started" in out
    # the finish job's command: nothing launched, the complete run evaluated, exit 1 (one
    # run is not complete), a3_random-s0 never trained
    fin = subprocess.run([sys.executable, "-m", "aleph", "campaign", "--finish-only", "--name",
                          "st", "--preset", "smoke", "--arms", "a2_dense", "a3_random", "--seeds",
                          "0", *RUN_SETS, "--no-probes", "--devices", "cpu:1"], cwd=REPO,
                         env=child_env(work), capture_output=True, text=True, timeout=300)
    out = fin.stdout + fin.stderr
    assert fin.returncode == 1, out
    assert "a3_random-s0: not complete; --finish-only launches nothing" in out
    assert "a2_dense-s0: capability " in out
    assert not (work / "runs" / "smoke" / "a3_random-s0").exists()
    assert (work / "campaigns" / "st" / "report").is_dir()


@pytest.mark.parametrize("name", ["a b", "x$(touch pwned)", "q\"uote", "nl\ntouch pwned #", "p%j",
                                  "mount,split:x"])
def test_a_work_root_the_scripts_cannot_hold_safely_is_refused_before_anything_is_written(
        tmp_path, capsys, monkeypatch, no_sinfo, name):
    """The work root lands in #SBATCH lines (no quoting there: a newline ends the line and the
    rest runs as shell, a space splits it, % is a pattern) and in the scripts' echo strings."""
    work = tmp_path / name
    monkeypatch.setenv("ALEPH_WORK", str(work))
    rc = main(["campaign", "--on", "slurm", "--preset", "smoke", *ONE, "--no-probes"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"aleph campaign: error: work root (ALEPH_WORK) {str(work)!r}: the "
                          "Slurm scripts write it into #SBATCH lines"), err
    assert not work.exists() and not (tmp_path / "pwned").exists()
