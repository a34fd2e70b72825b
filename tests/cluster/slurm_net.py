"""The private network of the test cluster: one bridge, one network namespace per host.

Nothing here is routed: the bridge gets an address of a private /24 that no address or
route of this machine overlaps, each namespace gets one veth end on it, its loopback and
no default route, and no NAT rule is written. Where the kernel passes bridged frames
through iptables (br_netfilter loaded, as a Docker engine does, whose FORWARD policy is
DROP), one rule accepts frames from the bridge to the same bridge and nothing else: without
it every packet between the namespaces was dropped and no slurmd reached slurmctld.
`Net.close` removes every namespace, veth, the bridge and the rule it made, and kills the
processes left in its namespaces.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field

# 10.213.X.0/24: inside RFC 1918 but away from the ranges Docker (172.17+/16), libvirt
# (192.168.122) and common Kubernetes CNIs (10.42, 10.244, 10.233) pick by default.
PREFIX = "10.213"
BRIDGE_NF = "/proc/sys/net/bridge/bridge-nf-call-iptables"


def sh(args: list[str], *, timeout: float = 60, check: bool = True,
       **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} exited {p.returncode}: "
                           f"{(p.stderr or p.stdout).strip()[-2000:]}")
    return p


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine has an address in or a route to (default excluded)."""
    nets = []
    for a in json.loads(sh(["ip", "-j", "-4", "addr"]).stdout or "[]"):
        for info in a.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}",
                                             strict=False))
    for table in ("main", "local"):
        for r in json.loads(sh(["ip", "-j", "-4", "route", "show", "table", table]).stdout
                            or "[]"):
            if r.get("dst") not in (None, "default"):
                nets.append(ipaddress.ip_network(r["dst"], strict=False))
    return nets


def _devices_in(subnet: ipaddress.IPv4Network) -> list[str]:
    """The devices holding an IPv4 address inside subnet."""
    return [a["ifname"] for a in json.loads(sh(["ip", "-j", "-4", "addr"]).stdout or "[]")
            for info in a.get("addr_info", [])
            if ipaddress.ip_address(info["local"]) in subnet]


def free_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    """A /24 under PREFIX that overlaps no address or route of this machine."""
    used = _networks_in_use()
    for third in rng.sample(range(1, 255), 254):
        net = ipaddress.ip_network(f"{PREFIX}.{third}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError(f"every {PREFIX}.X.0/24 overlaps an address or route of this machine")


def netns_pids(ns: str) -> list[int]:
    p = sh(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.split()] if p.returncode == 0 else []


def kill_netns_processes(ns: str, grace: float = 3.0) -> None:
    """SIGTERM every process in namespace ns, SIGKILL what is left after grace seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        pids = netns_pids(ns)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while netns_pids(ns) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not netns_pids(ns):
            return
    raise RuntimeError(f"processes left in netns {ns}: {netns_pids(ns)}")


@dataclass
class Net:
    """A bridge with the host at .1 and named namespaces at chosen addresses."""

    token: str
    subnet: ipaddress.IPv4Network
    bridge: str = ""
    namespaces: list[str] = field(default_factory=list)
    host_links: list[str] = field(default_factory=list)
    forward_rule: list[str] = field(default_factory=list)

    @property
    def host_address(self) -> str:
        return str(self.subnet.network_address + 1)

    def address(self, index: int) -> str:
        return str(self.subnet.network_address + index)

    def up(self) -> None:
        """The bridge, with the host's address on it (link scope: it reaches only the bridge).

        Another session may have picked the same /24 at the same moment: when the subnet
        shows up on a second device, ours steps back to a fresh one.
        """
        name = f"alsb{self.token}"
        sh(["ip", "link", "add", name, "type", "bridge"])
        self.bridge = name
        for _ in range(5):
            cidr = f"{self.host_address}/{self.subnet.prefixlen}"
            sh(["ip", "addr", "add", cidr, "dev", name])
            if not [d for d in _devices_in(self.subnet) if d != name]:
                break
            sh(["ip", "addr", "del", cidr, "dev", name])
            time.sleep(random.random())
            self.subnet = free_subnet(random.SystemRandom())
        else:
            raise RuntimeError(f"no {PREFIX}.X.0/24 stayed ours for bridge {name}")
        sh(["ip", "link", "set", name, "up"])
        self._accept_within_bridge()

    def _accept_within_bridge(self) -> None:
        """Let bridged frames between our namespaces past an iptables FORWARD policy."""
        try:
            with open(BRIDGE_NF) as f:
                if f.read().strip() != "1":
                    return
        except FileNotFoundError:  # br_netfilter not loaded: frames never meet iptables
            return
        if shutil.which("iptables") is None:  # no iptables here: nothing set a FORWARD policy
            return
        rule = ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]
        sh(["iptables", "-w", "10", "-I", *rule])
        self.forward_rule = rule

    def add_namespace(self, role: str, index: int) -> str:
        """Namespace aleph-slurm-TOKEN-ROLE with a veth on the bridge at address(index)."""
        ns = f"aleph-slurm-{self.token}-{role}"
        sh(["ip", "netns", "add", ns])
        self.namespaces.append(ns)
        host_end, ns_end = f"als{self.token}h{index}", f"als{self.token}n{index}"
        sh(["ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end])
        self.host_links.append(host_end)
        sh(["ip", "link", "set", ns_end, "netns", ns])
        sh(["ip", "link", "set", host_end, "master", self.bridge])
        sh(["ip", "link", "set", host_end, "up"])
        inside = ["ip", "netns", "exec", ns, "ip"]
        sh([*inside, "link", "set", "lo", "up"])
        sh([*inside, "addr", "add", f"{self.address(index)}/{self.subnet.prefixlen}",
            "dev", ns_end])
        sh([*inside, "link", "set", ns_end, "up"])
        return ns

    def close(self) -> list[str]:
        """Kill what runs in our namespaces, delete them, the veths and the bridge.

        Returns the problems met (empty when everything went); never raises, so one
        failure does not leave the rest behind.
        """
        problems = []
        for ns in reversed(self.namespaces):
            try:
                kill_netns_processes(ns)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                problems.append(str(e))
            p = sh(["ip", "netns", "del", ns], check=False)
            if p.returncode != 0:
                problems.append(f"ip netns del {ns}: {p.stderr.strip()}")
        self.namespaces.clear()
        for link in self.host_links + ([self.bridge] if self.bridge else []):
            # A veth goes with its peer's namespace; delete only what is still there.
            if sh(["ip", "link", "show", link], check=False).returncode == 0:
                p = sh(["ip", "link", "del", link], check=False)
                if p.returncode != 0:
                    problems.append(f"ip link del {link}: {p.stderr.strip()}")
        self.host_links.clear()
        if self.forward_rule:
            p = sh(["iptables", "-w", "10", "-D", *self.forward_rule], check=False)
            if p.returncode != 0:
                problems.append(f"iptables -D {' '.join(self.forward_rule)}: "
                                f"{p.stderr.strip()}")
            self.forward_rule = []
        self.bridge = ""
        return problems
