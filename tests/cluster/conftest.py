"""Fixtures of the cluster tier: one real Slurm cluster per pytest session.

`slurm_cluster` (session) brings up tests/cluster/slurm_harness.py's Cluster (its module
docstring lists the API) and tears it down at the end whatever happens, checking that no
namespace, link, iptables rule or process of it is left. `slurm` (function) hands the same cluster to a
test and cancels that test's leftover jobs afterwards. When slurm-wlm or munge is missing
and we are root with apt-get, Debian's packages are installed (timed); otherwise the tests
skip with the reason, except under CI (ALEPH_CLUSTER_REQUIRED=1 or CI=true), where a
cluster that cannot come up fails. Inside the image (ALEPH_IN_IMAGE=1) they always skip:
the cluster is made from the host. Bring-up, teardown and install times are printed in
the terminal summary.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.cluster.slurm_harness import Cluster, missing_binaries
from tests.cluster.slurm_net import sh

PACKAGES = ("slurm-wlm", "munge")
_timings: dict[str, float] = {}
_notes: list[str] = []


def _required() -> bool:
    return os.environ.get("ALEPH_IN_IMAGE") != "1" and (
        os.environ.get("ALEPH_CLUSTER_REQUIRED") == "1" or os.environ.get("CI") == "true")


def _cannot(reason: str):
    """Skip with the reason; under CI fail instead (the tier must run there)."""
    if _required():
        pytest.fail(f"cluster tier required but impossible here: {reason}")
    pytest.skip(reason)


def _install_if_missing() -> None:
    missing = missing_binaries()
    if not missing:
        return
    if os.environ.get("ALEPH_IN_IMAGE") == "1":
        pytest.skip("the Slurm cluster is made from the host, not from inside the image")
    if os.geteuid() != 0:
        _cannot(f"{', '.join(missing)} missing and not root: cannot install "
                f"{' '.join(PACKAGES)} (apt-get install {' '.join(PACKAGES)} as root)")
    if shutil.which("apt-get") is None:
        _cannot(f"{', '.join(missing)} missing and no apt-get to install {' '.join(PACKAGES)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    extra = [p for b, p in (("ip", "iproute2"), ("unshare", "util-linux"))
             if shutil.which(b) is None]
    t0 = time.monotonic()
    for args in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES,
                  *extra]):
        p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
        if p.returncode != 0:
            _cannot(f"{' '.join(args)} exited {p.returncode}: {p.stderr.strip()[-500:]}")
    _timings["install_s"] = time.monotonic() - t0
    if missing_binaries():
        _cannot(f"still missing after apt-get install: {', '.join(missing_binaries())}")


def _leftovers(c: Cluster) -> list[str]:
    """What of cluster c is still on this machine (namespaces, links, processes, files)."""
    token = c.net.token
    left = [ns for ns in sh(["ip", "netns", "list"]).stdout.split()
            if ns.startswith(f"aleph-slurm-{token}-")]
    left += [link["ifname"] for link in json.loads(sh(["ip", "-j", "link"]).stdout or "[]")
             if link["ifname"].startswith((f"alsb{token}", f"als{token}h"))]
    rules = sh(["iptables", "-w", "10", "-S", "FORWARD"], check=False).stdout \
        if shutil.which("iptables") else ""
    left += [r for r in rules.splitlines() if f"alsb{token}" in r]
    left += [f"pid {p.pid}" for p in c.procs if p.poll() is None]
    if c.dir.exists():
        left.append(str(c.dir))
    return left


@pytest.fixture(scope="session")
def slurm_cluster():
    """The session's running Cluster; everything of it is removed at the end."""
    if os.environ.get("ALEPH_IN_IMAGE") == "1":
        pytest.skip("the Slurm cluster is made from the host, not from inside the image")
    if os.geteuid() != 0:
        _cannot("not root: a cluster needs network namespaces, a bridge and root daemons")
    _install_if_missing()
    # A SIGTERM (a CI timeout) must still run the teardown below: make it an interrupt.
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    cluster = Cluster(Path(tempfile.gettempdir()))
    try:
        try:
            cluster.start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            _cannot(f"the Slurm cluster did not come up: {e}")
        _timings["bring_up_s"] = cluster.timings["bring_up_s"]
        print(f"cluster: {', '.join(cluster.nodes)} on {cluster.net.subnet} "
              f"(bridge {cluster.net.bridge}), up in {_timings['bring_up_s']:.1f} s")
        yield cluster
    finally:
        problems = cluster.close()
        _timings["teardown_s"] = cluster.timings["teardown_s"]
        left = _leftovers(cluster)
        _notes.append(f"cluster teardown left: {', '.join(left) if left else 'nothing'}")
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if problems or left:
            pytest.fail(f"cluster teardown: problems {problems}, left {left}")


@pytest.fixture
def slurm(slurm_cluster):
    """The session's cluster for one test; its jobs still queued or running are cancelled
    after it, so the next test starts on idle nodes."""
    yield slurm_cluster
    slurm_cluster.scancel_all()


def pytest_terminal_summary(terminalreporter):
    if not _timings:
        return
    parts = [f"{k.removesuffix('_s').replace('_', '-')} {v:.1f} s"
             for k, v in _timings.items()]
    terminalreporter.write_line(f"cluster: {', '.join(parts)}")
    for note in _notes:
        terminalreporter.write_line(note)

