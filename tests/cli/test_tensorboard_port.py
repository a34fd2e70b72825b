"""`aleph tensorboard` checks its port before it says it serves: a busy port (held by a real
listening socket) is refused with a free one to pass instead."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from aleph.cli.tensorboard import check_port
from aleph.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_busy_port_is_refused_before_serving_with_a_free_one_named(tmp_path):
    with listening() as held:
        port = held.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "aleph", "tensorboard", "--logdir", str(tmp_path), "--port", str(port)],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "serving" not in proc.stdout
    err = proc.stderr.strip()
    assert f"--port {port}: 127.0.0.1:{port} is already in use" in err
    suggested = int(err.rsplit("--port ", 1)[1])
    assert suggested != port
    check_port("127.0.0.1", suggested)  # it was free when named


def test_a_free_port_passes_and_an_address_not_of_this_machine_is_named():
    with listening() as held:
        port = held.getsockname()[1]
    check_port("127.0.0.1", port)  # released: free again
    with pytest.raises(ConfigError, match=r"--host 192\.0\.2\.1 --port \d+: cannot listen there"):
        check_port("192.0.2.1", port)  # TEST-NET-1: no interface of this machine has it


@pytest.mark.parametrize("port", [-1, 0, 65536])
def test_a_port_out_of_range_is_blamed_on_the_port_not_the_host(port):
    with pytest.raises(ConfigError) as err:
        check_port("127.0.0.1", port)
    assert str(err.value) == f"--port {port}: expected a TCP port from 1 to 65535"
