"""The container path run for real: the CPU image through Compose v2 on a real engine.

The tests run in file order over one compose project (tests/container/conftest.py): the
suite inside the image, a smoke arm trained to completion and compared byte for byte with
the same arm trained on this machine, the seed's envelope read back from a live training
container's cgroup, the trainer's privileges (none) and its read-only root, `docker compose
stop` and `kill -9` mid-run, the work volume's owner and its survival across `down`, and
TensorBoard published on loopback only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from aleph.errors import EXIT_STOPPED
from tests.container.conftest import CPU_IMAGE, REPO, _run

pytestmark = pytest.mark.container

SEED_MEM = 110_999_998_464
FINAL = "weights/final/model.safetensors"
# The longer run of the stop/kill test: 30 smoke epochs (1,920 steps), paused after STOP_AT.
LONG = {"ALEPH_SEED": "2", "ALEPH_SMOKE_EPOCHS": "30"}
STOP_AT = 60


def _bare_run(work: Path, seed: str, epochs: str) -> str:
    """The same arm trained on this machine (the README's bare path); sha256 of its weights."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALEPH_")}
    env.update(ALEPH_WORK=str(work), PYTHONPATH=str(REPO))
    _run([sys.executable, "-m", "aleph", "train", "--arm", "a2_dense", "--seed", seed,
          "--preset", "smoke", "--set", f"epochs={epochs}"], env=env, timeout=900, cwd=REPO)
    final = work / "runs" / "smoke" / f"a2_dense-s{seed}" / FINAL
    return hashlib.sha256(final.read_bytes()).hexdigest()


def _volume_sha(stack, run: str) -> str:
    out = stack.on_volume(f"sha256sum /workspace/runs/{run}/{FINAL}")
    return out.split()[0]


def _wait_for(predicate, what: str, timeout: float = 600, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _logs(cid: str) -> str:
    p = subprocess.run(["docker", "logs", cid], capture_output=True, text=True, timeout=60)
    return p.stdout + p.stderr


# CI's suite inside the image: what the frozen image can change (the pinned stack on Ubuntu's
# libraries and the image's Python, strict env checks, uid 1000, a read-only source tree) in
# every package's fast tests, minus two kinds that tier 1 has just run on the same code and
# pins: the tests marked slow, and the trainer, campaign and sync tests, which drive whole
# `aleph train` subprocesses. In the image that path is proven end to end by the two tests
# below (a smoke arm, and a stop + kill -9 + resume, both bitwise equal to this machine).
# Measured: all non-slow tests in the image took 615 s, a CI over its 45 minutes.
# `docker compose run --rm tests` still runs the whole suite.
IN_IMAGE = ("python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
            *(f"--ignore=/opt/aleph/tests/{d}" for d in ("train", "campaign", "sync")),
            "/opt/aleph/tests")


def test_the_suite_passes_inside_the_cpu_image(stack):
    p = stack.compose("run", "--rm", "tests", *IN_IMAGE, timeout=1800, check=False)
    tail = p.stdout[-3000:] + p.stderr[-2000:]
    assert p.returncode == 0, tail
    summary = p.stdout.strip().splitlines()[-1]
    print(f"in-image suite ({' '.join(IN_IMAGE[6:-1])}): {summary}")
    assert re.search(r"\d+ passed", summary) and "failed" not in summary, summary
    # The strict check inside the CPU image names it as the CPU variant, explicitly.
    c = stack.compose("run", "--rm", "tests", "aleph", "env", "check", "--strict")
    assert "verdict: CPU image variant" in c.stdout and "not the seed's image" in c.stdout


def test_smoke_arm_trains_in_the_container_as_on_this_machine(stack, tmp_path):
    bare = {}
    t = threading.Thread(target=lambda: bare.update(sha=_bare_run(tmp_path / "bare", "1", "2")))
    t.start()
    stack.compose("up", "train-a2", timeout=900)
    t.join()
    cid = stack.container_id("train-a2")
    assert stack.inspect(cid, "{{.State.ExitCode}} {{.RestartCount}}") == "0 0"
    assert "launch ended: complete: 128 steps" in _logs(cid)
    assert _volume_sha(stack, "smoke/a2_dense-s1") == bare["sha"]
    print(f"smoke a2 seed 1: container {FINAL} sha256 {bare['sha']} == bare machine")
    stack.compose("rm", "-f", "train-a2")


def test_stop_and_kill_mid_run_resume_to_the_bare_machine_weights(stack, tmp_path):
    bare = {}
    t = threading.Thread(target=lambda: bare.update(
        sha=_bare_run(tmp_path / "bare", LONG["ALEPH_SEED"], LONG["ALEPH_SMOKE_EPOCHS"])))
    t.start()
    env = {**LONG, "ALEPH_CI_PAUSE_AFTER_STEP": str(STOP_AT)}
    stack.compose("up", "-d", "train-a2", extra_env=env)
    cid = stack.container_id("train-a2")
    _wait_for(lambda: f"paused after step {STOP_AT}" in _logs(cid), f"the pause at {STOP_AT}")

    # The seed's envelope, read back from this training container's live cgroup.
    cap = _run(["docker", "exec", cid, "aleph", "env", "capture", "--out", "/workspace/env"])
    assert "| Container memory quota (cgroup v1) | 110,999,998,464 B (103.38 GiB) |" in cap.stdout \
        or "| Container memory quota (cgroup v2) | 110,999,998,464 B (103.38 GiB) |" in cap.stdout
    assert "17.85 cores (cfs quota 1,785,000 / period 100,000)" in cap.stdout
    (js,) = re.findall(r"and (\S+\.json)", cap.stdout)
    record = json.loads(_run(["docker", "exec", cid, "cat", js]).stdout)
    env_rec = record["hardware"]["envelope"]
    assert env_rec["memory_limit_bytes"] == SEED_MEM
    assert (env_rec["cpu_quota_us"], env_rec["cpu_period_us"]) == (1_785_000, 100_000)
    assert env_rec["cpu_cores"] == 17.85
    print("\n".join(ln for ln in cap.stdout.splitlines() if "quota" in ln or "cpuset" in ln))
    _trainer_is_unprivileged_on_a_read_only_root(cid)

    # docker compose stop: SIGTERM through tini to the trainer, which saves and exits 76
    # (EXIT_STOPPED); a stop by the user is never restarted, whatever the policy.
    stack.compose("stop", "train-a2", extra_env=env)
    state = stack.inspect(cid, "{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}")
    assert state == f"exited {EXIT_STOPPED} 0", state
    logs = _logs(cid)
    assert f"stopped by SIGTERM after step {STOP_AT}; resume state saved" in logs
    assert "launch ended: stopped: SIGTERM" in logs
    print("\n".join(ln for ln in logs.splitlines() if "SIGTERM" in ln))
    time.sleep(3)  # on-failure: a container the user stopped must not be restarted
    assert stack.inspect(cid, "{{.State.Status}} {{.RestartCount}}") == "exited 0"

    # Start again: it resumes; then kill -9 the trainer from the host, mid-run.
    stack.compose("up", "-d", "train-a2", extra_env=env)
    assert stack.container_id("train-a2") == cid  # same container, same config
    _wait_for(lambda: "resume state saved: checkpoints/step-00000150" in _logs(cid),
              "a checkpoint after the resume")
    pid = _trainer_pid(cid)
    os.kill(pid, 9)
    _wait_for(lambda: stack.inspect(cid, "{{.RestartCount}}") == "1", "the on-failure restart")
    _wait_for(lambda: stack.inspect(cid, "{{.State.Status}}") == "exited", "the run to end",
              timeout=900)
    assert stack.inspect(cid, "{{.State.ExitCode}} {{.RestartCount}}") == "0 1"
    print(f"after kill -9 of host pid {pid}: RestartCount 1, final exit 0")
    t.join()
    run = f"smoke/a2_dense-s{LONG['ALEPH_SEED']}"
    launches = stack.on_volume(f"cat /workspace/runs/{run}/launches/*.log")
    assert "launch ended: complete: 1920 steps" in launches
    # Three launches: the first, the start after the stop, the restart after the kill;
    # the last two resume from a checkpoint (the one after the stop from step STOP_AT).
    resumes = re.findall(r"resume: step (\d+), samples seen \d+, from checkpoints/step-", launches)
    assert len(resumes) == 2 and int(resumes[0]) == STOP_AT, launches[-3000:]
    assert int(resumes[1]) >= 150
    assert _volume_sha(stack, run) == bare["sha"]
    print(f"stop + kill -9 + resumes, seed 2, 1920 steps: {FINAL} sha256 {bare['sha']} "
          "== bare machine uninterrupted")


def _trainer_pid(cid: str) -> int:
    """The host pid of the trainer process in container `cid`."""
    top = _run(["docker", "top", cid, "-eo", "pid,args"]).stdout.splitlines()[1:]
    (pid,) = [int(line.split()[0]) for line in top if "-m aleph train" in line]
    return pid


def _trainer_is_unprivileged_on_a_read_only_root(cid: str) -> None:
    """compose.yaml's x-hardened, read back from the live trainer: no capability, no
    privilege gain, an image it cannot write, tmpfs where it must write."""
    status = Path(f"/proc/{_trainer_pid(cid)}/status").read_text()
    caps = dict(re.findall(r"^(Cap\w+|NoNewPrivs):\s+(\S+)$", status, re.M))
    assert caps["CapEff"] == caps["CapPrm"] == "0" * 16, caps
    assert caps["NoNewPrivs"] == "1", caps
    write = _run(["docker", "exec", cid, "sh", "-c", "echo x > /probe"], check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr, write
    mounts = _run(["docker", "exec", cid, "grep", "-E", "^[^ ]+ (/|/tmp|/home/aleph) ",
                   "/proc/mounts"]).stdout
    assert re.search(r"^overlay / overlay ro,", mounts, re.M), mounts
    assert re.search(r"^tmpfs /tmp tmpfs rw,", mounts, re.M), mounts
    print(f"trainer: CapEff {caps['CapEff']} CapPrm {caps['CapPrm']} CapBnd {caps['CapBnd']} "
          f"NoNewPrivs {caps['NoNewPrivs']}; `echo x > /probe`: {write.stderr.strip()}")
    for line in mounts.splitlines():  # mount point, type, options (not overlay's layers)
        _, where, kind, opts = line.split()[:4]
        print(f"mount {where} {kind} {opts.split(',lowerdir=')[0]}")


def test_work_volume_belongs_to_uid_1000_and_survives_down(stack):
    before = stack.on_volume("find /workspace/runs -name model.safetensors | sort | xargs sha256sum")
    assert before.count("model.safetensors") >= 2
    stack.compose("down")  # no -v: the named volume stays
    assert _run(["docker", "volume", "inspect", stack.volume]).returncode == 0
    assert stack.on_volume("find /workspace ! -uid 1000 -print") == ""
    assert stack.on_volume("stat -c %u /workspace").strip() == "1000"
    after = stack.on_volume("find /workspace/runs -name model.safetensors | sort | xargs sha256sum")
    assert after == before


def test_tensorboard_answers_on_loopback_only(stack):
    port = stack.env["ALEPH_TB_PORT"]
    stack.compose("up", "-d", "tensorboard")
    cid = stack.container_id("tensorboard")
    bindings = json.loads(stack.inspect(cid, "{{json .HostConfig.PortBindings}}"))
    assert bindings == {"6006/tcp": [{"HostIp": "127.0.0.1", "HostPort": port}]}

    def page():
        state = stack.inspect(cid, "{{.State.Status}} {{.RestartCount}}")
        assert state == "running 0", f"tensorboard container {state}:\n{_logs(cid)[-2000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5) as r:
                return r.status == 200 and r.read().decode()
        except OSError:
            return False

    runs = json.loads(_wait_for(page, "TensorBoard on 127.0.0.1", timeout=180, every=2))
    assert any("smoke/a2_dense-s1" in r for r in runs), runs
    stack.compose("stop", "tensorboard")
    assert CPU_IMAGE in stack.inspect(cid, "{{.Config.Image}}")
