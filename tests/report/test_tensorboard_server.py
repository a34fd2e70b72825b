"""The real TensorBoard server, started by `aleph tensorboard`, serves training + eval scalars."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from fixtures.runs import make_run

from aleph.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read().decode())


def wait_for_tags(base: str, run: str, tags: set, proc, timeout: float = 90.0) -> dict:
    """Poll /data/plugin/scalars/tags until `run` shows `tags` (TensorBoard loads lazily)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"tensorboard exited early: {proc.stdout.read().decode()[-2000:]}")
        try:
            last = get_json(f"{base}/data/plugin/scalars/tags")
            if tags <= set(last.get(run, {})):
                return last
        except OSError:
            pass  # not listening yet
        time.sleep(0.5)
    pytest.fail(f"tags {tags} of run {run} not served within {timeout}s; last answer {last}")


def test_tensorboard_serves_training_and_eval_scalars(tmp_path, work):
    runs = work / "runs"
    run = make_run(runs, "a1_anchored", seed=0, steps=80)
    assert main(["eval", str(run), "--tasks", "tiny", "--tasks-dir", str(FIXTURES), "--no-probes"]) == 0
    evaluated = json.loads((run / "eval.json").read_text())

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "aleph", "tensorboard", "--logdir", str(runs), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        name = "a1_anchored-s0/tb"
        tags = wait_for_tags(base, name, {"train/loss", "eval/capability", "eval/toggle"}, proc)
        assert "eval/sts/tiny" in tags[name]

        def series(tag):
            q = urllib.parse.urlencode({"run": name, "tag": tag})
            return get_json(f"{base}/data/plugin/scalars/scalars?{q}")  # [[wall, step, value]]

        assert [(s, pytest.approx(v)) for _, s, v in series("eval/capability")] == [(80, evaluated["capability"])]
        assert [(s, pytest.approx(v)) for _, s, v in series("eval/toggle")] == [(80, evaluated["toggle"])]
        loss = series("train/loss")
        assert [s for _, s, _ in loss] == [0, 50] and loss[0][2] == pytest.approx(4.0)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode is not None


def test_tensorboard_command_refuses_a_missing_logdir(tmp_path, capsys):
    assert main(["tensorboard", "--logdir", str(tmp_path / "none")]) == 2
    assert "none: no such directory" in capsys.readouterr().err
