"""A real Slurm cluster on this machine for tests/cluster (Debian's slurm-wlm 22.05 + munge).

Layout (tests/cluster/slurm_net.py makes the network): a private bridge with the test
process at .1 of a free 10.213.X.0/24; slurmctld in its own network, UTS and mount
namespace at .2 under the hostname `slurmctl` (= SlurmctldHost); compute nodes node1,
node2 at .11, .12, each `slurmd -D -N nodeK` in its own network, UTS and mount namespace
with a hosts file naming every host bind-mounted on /etc/hosts; a private munged (own key,
socket, `AuthInfo=socket=PATH`) that leaves any system munge alone. Nothing is routed off
the bridge. Mount namespaces share the host's filesystem, so a work root made under the
session's temp dir, the checkout and its .venv are at the same path on every node. Jobs
run as the test's user (root) with the submitting process's environment.

Settings (those measured to work for several slurmds on one kernel): proctrack/linuxproc,
task/none (no shared cgroup tree), no
accounting (no sacct), cons_tres + CR_Core, config_overrides, ReturnToService=2,
KillWait=10, JobRequeue=1, partitions `normal` (PriorityTier 1, Default) and `high`
(PriorityTier 2) with preempt/partition_prio, PreemptMode=REQUEUE, GraceTime=GRACE_TIME,
preempt_send_user_signal. `AuthInfo=cred_expire=CRED_EXPIRE` shortens the requeue hold:
slurm.conf(5): "This also controls how long a requeued job must wait before starting
again. The default value is 120 seconds." Measured here with CRED_EXPIRE=10: `scontrol
requeue` to RUNNING again in 10.9 s (EligibleTime = requeue + 11 s), against 121 s by
default. SchedulerParameters=sched_interval=1,bf_interval=1: without it the main scheduler
(every 60 s) started an eligible requeued job only about 46 s after its EligibleTime.
MinJobAge=3600 keeps finished jobs visible to `scontrol show job` for the whole session.
Constants for tests: GRACE_TIME, KILL_WAIT, CRED_EXPIRE, CPUS_PER_NODE (2 per node).

Fixture API (tests/cluster/conftest.py):
- `slurm_cluster` (session): the one `Cluster` of the pytest session, torn down at its
  end whatever happens. `slurm` (function): the same cluster; after the test every job
  still queued or running is cancelled and the nodes are waited back to idle.
- `Cluster.nodes` -> ("node1", "node2"); `Cluster.partition` -> "normal";
  `Cluster.high_partition` -> "high" (its jobs preempt `normal`'s, which are requeued).
- `Cluster.env` -> os.environ minus inherited SLURM_* plus SLURM_CONF: pass it to any
  subprocess that runs sbatch/squeue/scontrol/srun/sinfo/scancel (e.g. `aleph campaign
  --submit`); `Cluster.conf` is the slurm.conf path. The test process reaches slurmctld
  directly over the bridge: no namespace is needed on the client side.
- `Cluster.work` -> a directory on the shared filesystem for job files (a tmp dir).
- `Cluster.run(argv, timeout=60, check=True, **kw)` -> CompletedProcess: any command
  with `env` (extra `env=` entries are merged over it).
- `Cluster.submit(script, *sbatch_args, cwd=None)` -> job id (str): `script` is a Path
  (any os.PathLike) or, as a str, the script's text (written under `work`); sbatch
  --parsable, run in `cwd` (default `work`); an array's id is "ARRAYJOB".
- `Cluster.job(job_id)` -> dict of `scontrol show -o job ID` fields ({} when unknown);
  for an array element pass "ARRAYJOB_TASK". `Cluster.jobs(job_id)` -> list of dicts
  (an array's elements, each with ArrayJobId/ArrayTaskId).
- `Cluster.state(job_id)` -> JobState ("PENDING", "RUNNING", "COMPLETED", ...).
- `Cluster.wait_state(job_id, states, timeout=120, fail_states=FAIL_STATES)` -> the job's
  fields once its JobState is in `states` (a str or a set); AssertionError naming the last
  state, reason and the slurmctld log tail on timeout or on a state in `fail_states`
  that is not in `states`.
- `Cluster.wait_all_done(timeout=...)`: until squeue lists no job.
- `Cluster.scancel_all()`: cancel every job and wait for the nodes to be idle.
- `Cluster.log_tail(name="slurmctld", lines=40)`: the tail of a daemon log (node logs
  are "slurmd-node1", ...), for assertion messages.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.cluster.slurm_net import Net, free_subnet, sh

NODES = ("node1", "node2")
CTL = "slurmctl"
PARTITION, HIGH_PARTITION = "normal", "high"
CPUS_PER_NODE = 2
GRACE_TIME = 10  # seconds from the preemption's user signal to SIGTERM
KILL_WAIT = 10
CRED_EXPIRE = 10  # the requeue hold is cred_expire + 1 s (slurm.conf(5), AuthInfo)
FAIL_STATES = frozenset({"FAILED", "CANCELLED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
                         "OUT_OF_MEMORY"})
# scontrol -o: KEY=VALUE pairs separated by spaces; a value runs up to the next " KEY=".
_FIELD = re.compile(r"(\S+?)=(.*?)(?= \S+?=|$)")


def missing_binaries() -> list[str]:
    return [b for b in ("slurmctld", "slurmd", "munged", "mungekey", "sbatch", "srun", "ip",
                        "unshare", "nsenter") if shutil.which(b) is None]


def slurm_conf(d: Path, net: Net, munge_socket: Path) -> str:
    nodes = "\n".join(
        f"NodeName={n} NodeAddr={net.address(11 + i)} CPUs={CPUS_PER_NODE} Boards=1 "
        f"SocketsPerBoard=1 CoresPerSocket={CPUS_PER_NODE} ThreadsPerCore=1 State=UNKNOWN"
        for i, n in enumerate(NODES))
    all_nodes = ",".join(NODES)
    return f"""\
ClusterName=alephci
SlurmctldHost={CTL}({net.address(2)})
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket},cred_expire={CRED_EXPIRE}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
ReturnToService=2
KillWait={KILL_WAIT}
JobRequeue=1
MinJobAge=3600
InactiveLimit=0
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
{nodes}
PartitionName={PARTITION} Nodes={all_nodes} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime={GRACE_TIME}
PartitionName={HIGH_PARTITION} Nodes={all_nodes} MaxTime=INFINITE State=UP PriorityTier=2 GraceTime={GRACE_TIME}
"""


def parse_fields(line: str) -> dict[str, str]:
    return {k: v for k, v in _FIELD.findall(line.strip())}


class Cluster:
    """The running cluster; see the module docstring for the API."""

    nodes = NODES
    partition = PARTITION
    high_partition = HIGH_PARTITION

    def __init__(self, base: Path):
        self.net = Net(f"{random.SystemRandom().randrange(16**4):04x}",
                       free_subnet(random.SystemRandom()))
        self.dir = Path(tempfile.mkdtemp(prefix="aleph-slurm-", dir=base))
        self.work = self.dir / "work"
        self.conf = self.dir / "slurm.conf"
        self.procs: list[subprocess.Popen] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.env["SLURM_CONF"] = str(self.conf)
        self.timings: dict[str, float] = {}

    # -- bring-up and teardown -------------------------------------------------------------

    def start(self, timeout: float = 60) -> None:
        """Network, munged, slurmctld, the slurmds; returns once every node is idle."""
        t0 = time.monotonic()
        for sub in ("state", "spool", "run", "log", "munge", "work",
                    *(f"spool/{n}" for n in NODES)):
            (self.dir / sub).mkdir(mode=0o700)
        self.net.up()
        hosts = self.dir / "hosts"
        hosts.write_text("127.0.0.1 localhost\n" + f"{self.net.address(2)} {CTL}\n" + "".join(
            f"{self.net.address(11 + i)} {n}\n" for i, n in enumerate(NODES)))
        munge_socket = self._start_munged()
        self.conf.write_text(slurm_conf(self.dir, self.net, munge_socket))
        ctl_ns = self.net.add_namespace("ctl", 2)
        self._spawn(ctl_ns, CTL, hosts, ["slurmctld", "-D", "-f", str(self.conf)], "slurmctld")
        for i, n in enumerate(NODES):
            ns = self.net.add_namespace(n, 11 + i)
            self._spawn(ns, n, hosts, ["slurmd", "-D", "-N", n, "-f", str(self.conf)],
                        f"slurmd-{n}")
        self._wait_idle(timeout)
        self.timings["bring_up_s"] = time.monotonic() - t0

    def _start_munged(self) -> Path:
        m = self.dir / "munge"
        key = m / "munge.key"
        sh(["mungekey", "--create", "--keyfile", str(key)])
        os.chmod(key, 0o400)
        sock = m / "munge.socket"
        log = open(self.dir / "log" / "munged.out", "ab")  # noqa: SIM115
        # --force: the session dir sits under a world-writable /tmp, which munged distrusts.
        p = subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
             f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}",
             f"--seed-file={m / 'munged.seed'}"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.procs.append(p)
        deadline = time.monotonic() + 20
        while not sock.exists():
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not come up (exit {p.poll()}): "
                                   f"{self._tail(m / 'munged.log')}")
            time.sleep(0.05)
        return sock

    def _spawn(self, ns: str, hostname: str, hosts: Path, argv: list[str], log: str) -> None:
        """argv in namespace ns, in new UTS and mount namespaces: hostname, hosts file."""
        out = open(self.dir / "log" / f"{log}.out", "ab")  # noqa: SIM115
        p = subprocess.Popen(
            # nsenter, not `ip netns exec`: the latter remounts /sys, hiding the cgroup
            # filesystem slurmd's cgroup plugin needs at start.
            ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount",
             "--propagation", "private", "sh", "-c",
             'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"',
             "sh", hostname, str(hosts), *argv],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True,
            env=self.env)
        out.close()
        self.procs.append(p)

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a daemon exited during bring-up: {dead[0][-4:]}\n"
                                   f"{self.log_tail('slurmctld')}")
            p = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, timeout=20)
            last = p.stdout.strip() or p.stderr.strip()
            states = dict(line.split() for line in p.stdout.splitlines() if line.strip())
            if p.returncode == 0 and all(states.get(n) == "idle" for n in NODES):
                return
            time.sleep(0.2)
        reasons = self.run(["sinfo", "-R"], check=False, timeout=20).stdout.strip()
        nodes = "".join(f"\n-- slurmd-{n}:\n{self.log_tail(f'slurmd-{n}', 8)}" for n in NODES)
        raise RuntimeError(f"nodes not idle after {timeout:.0f} s: {last}\n{reasons}\n"
                           f"-- slurmctld:\n{self.log_tail('slurmctld', 12)}{nodes}")

    def close(self) -> list[str]:
        """Stop everything this cluster started and remove its files; returns problems."""
        t0 = time.monotonic()
        problems = self.net.close()  # slurmds, slurmctld and every job step in the netns
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.timings["teardown_s"] = time.monotonic() - t0
        return problems

    # -- client side -----------------------------------------------------------------------

    def run(self, argv: list[str], *, timeout: float = 60, check: bool = True,
            env: dict | None = None, **kw) -> subprocess.CompletedProcess:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           env={**self.env, **(env or {})}, **kw)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(map(str, argv))} exited {p.returncode}: "
                                 f"{(p.stderr or p.stdout).strip()[-2000:]}")
        return p

    def submit(self, script: str | os.PathLike, *sbatch_args: str,
               cwd: str | os.PathLike | None = None) -> str:
        path = Path(script) if isinstance(script, os.PathLike) else None
        if path is None:
            fd, name = tempfile.mkstemp(suffix=".sbatch", dir=self.work)
            with os.fdopen(fd, "w") as f:
                f.write(str(script))
            path = Path(name)
        out = self.run(["sbatch", "--parsable", *sbatch_args, str(path)],
                       cwd=cwd or self.work).stdout.strip()
        return out.split(";")[0]

    def jobs(self, job_id: str) -> list[dict[str, str]]:
        p = self.run(["scontrol", "show", "-o", "job", str(job_id)], check=False)
        return [parse_fields(line) for line in p.stdout.splitlines() if line.strip()]

    def job(self, job_id: str) -> dict[str, str]:
        found = self.jobs(job_id)
        return found[0] if found else {}

    def state(self, job_id: str) -> str:
        return self.job(job_id).get("JobState", "")

    def wait_state(self, job_id: str, states, *, timeout: float = 120,
                   fail_states=FAIL_STATES) -> dict[str, str]:
        want = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            st = fields.get("JobState", "")
            if st in want:
                return fields
            if st in fail_states:
                break
            time.sleep(0.3)
        raise AssertionError(
            f"job {job_id}: JobState={fields.get('JobState')} Reason={fields.get('Reason')} "
            f"after waiting for {sorted(want)} ({timeout:.0f} s at most)\n"
            f"{self.log_tail('slurmctld')}")

    def wait_all_done(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.run(["squeue", "-h", "-o", "%i"]).stdout.strip():
                return
            time.sleep(0.3)
        raise AssertionError(f"jobs still queued after {timeout:.0f} s:\n"
                             f"{self.run(['squeue']).stdout}")

    def scancel_all(self, timeout: float = 60) -> None:
        self.run(["scancel", "--full", "--user", str(os.getuid())], check=False)
        self.wait_all_done(timeout)
        self._wait_idle(timeout)

    def log_tail(self, name: str = "slurmctld", lines: int = 40) -> str:
        return self._tail(self.dir / "log" / f"{name}.log", lines)

    @staticmethod
    def _tail(path: Path, lines: int = 40) -> str:
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 64 * 1024))
                text = f.read().decode(errors="replace")
        except OSError as e:
            return f"({path}: {e.strerror})"
        return "\n".join(text.splitlines()[-lines:])
