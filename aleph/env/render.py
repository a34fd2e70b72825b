"""Markdown rendering of an `aleph env capture` record, in the seed's table layout.

Absent pieces are written as "absent (why)", never left blank or guessed, so a reader
can tell "no limit" from "not captured".
"""

from __future__ import annotations

import re
from collections import Counter

from aleph.env.cgroup import format_bytes


def _v(value, why: str = "not installed") -> str:
    return f"absent ({why})" if value in (None, "", []) else str(value)


def cudnn_label(version: int | None) -> str:
    """90100 -> `9.1.0 (90100)`; cuDNN 8 encodes major*1000 + minor*100 + patch."""
    if version is None:
        return "absent (torch reports no cuDNN)"
    major = 10000 if version >= 90000 else 1000
    return f"{version // major}.{version % major // 100}.{version % 100} ({version})"


def peer_links(topology: str | None) -> str | None:
    """Distinct GPU-to-GPU link types from `nvidia-smi topo -m` (e.g. `PXB`)."""
    if not topology:
        return None
    lines = topology.splitlines()
    header = lines[0].split() if lines else []
    n = sum(1 for h in header if re.fullmatch(r"GPU\d+", h))
    links = set()
    for i, line in enumerate(row for row in lines[1:] if re.match(r"GPU\d+\s", row)):
        cells = line.split()[1 : n + 1]
        links.update(c for j, c in enumerate(cells) if j > i and c != "X")
    return ", ".join(sorted(links)) or None


def _software_rows(sw: dict) -> list[tuple[str, str]]:
    p = sw["packages"]
    compiler = f" ({sw['compiler']})" if sw.get("compiler") else ""
    return [
        ("Python", f"{sw['python']}{compiler}"),
        ("PyTorch", _v(sw["torch"], "not importable")),
        ("CUDA (torch)", _v(sw["cuda"], "CPU-only torch or torch absent")),
        ("cuDNN", cudnn_label(sw["cudnn"])),
        ("Triton", _v(sw["triton"])),
        *[(label, _v(v)) for label, v in p.items() if label not in ("torchvision", "torchaudio")],
        ("torchvision / torchaudio", f"{_v(p['torchvision'])} / {_v(p['torchaudio'])}"),
        ("NVIDIA driver", _v(sw["driver"], "no nvidia-smi or no GPU")),
        ("OS / kernel", f"{_v(sw['os'], 'no /etc/os-release')} / {sw['kernel']}"),
    ]


def _gpu_rows(hw: dict) -> list[tuple[str, str]]:
    gpus = hw["gpus"]
    if not gpus:
        return [("GPUs", "absent (nvidia-smi found no GPU)")]
    kinds = Counter((g["name"], g["memory_mib"]) for g in gpus)
    desc = "; ".join(f"{n} × {name}, {mib:,} MiB each" for (name, mib), n in sorted(kinds.items()))
    link = peer_links(hw["gpu_topology"])
    if len(gpus) > 1:
        desc += (f", {link} peer link" if link
                 else ", peer link absent (nvidia-smi topo unavailable)")
    return [("GPUs", desc), ("GPU UUIDs", ", ".join(g["uuid"] for g in gpus))]


def _storage(s: dict) -> str:
    where = f"{s['fstype']} at {s['mount_point']}" if s.get("fstype") else "filesystem unknown"
    missing = "" if s["exists"] else " (not created yet; figures are of its parent)"
    return (f"{s['total_bytes'] / 1e9:,.1f} GB total, {s['free_bytes'] / 1e9:,.1f} GB free, "
            f"{where}{missing}")


def _envelope_rows(hw: dict) -> list[tuple[str, str]]:
    e = hw["envelope"]
    if e["cgroup_version"] is None:
        none = "absent (no cgroup filesystem found)"
        return [("Container memory quota", none), ("Container CPU quota", none)]
    mem = e["memory_limit_bytes"]
    mem_s = format_bytes(mem) if mem is not None else "absent (no cgroup memory limit)"
    cpu_s = ("absent (no cgroup CPU quota)" if e["cpu_quota_us"] is None else
             f"{e['cpu_cores']:.2f} cores (cfs quota {e['cpu_quota_us']:,} / "
             f"period {e['cpu_period_us']:,})")
    v = e["cgroup_version"]
    return [(f"Container memory quota (cgroup v{v})", mem_s),
            (f"Container CPU quota (cgroup v{v})", cpu_s)]


def _hardware_rows(hw: dict) -> list[tuple[str, str]]:
    nodes = hw["numa_nodes"]
    numa = "node " + ",".join(map(str, nodes)) if nodes else "absent (no NUMA topology exposed)"
    ram, cid, st = hw["host_ram_bytes_visible"], hw["container_id"], hw["storage"]
    cpu = _v(hw["host_cpu_model"], "no model name")
    return [
        *_gpu_rows(hw),
        ("Host CPU", f"{cpu}, {_v(hw['host_vcpus_visible'], 'unknown')} vCPU visible"),
        ("Host RAM", f"{format_bytes(ram)} visible" if ram else "absent (no /proc/meminfo)"),
        *_envelope_rows(hw),
        ("cpuset (cgroup)", _v(hw["envelope"]["cpuset"], "not readable")),
        ("CPU affinity / NUMA", f"{_v(hw['cpu_affinity'], 'not readable')} / {numa}"),
        ("Container id", cid[:12] if cid else "absent (not visible: not in a container?)"),
        ("Storage: container root", _storage(st["root"])),
        (f"Storage: work root {st['work_root']['path']}", _storage(st["work_root"])),
    ]


def _table(rows: list[tuple[str, str]], head: tuple[str, str]) -> list[str]:
    out = [f"| {head[0]} | {head[1]} |", "|---|---|"]
    return out + [f"| {a} | {b.replace('|', '/')} |" for a, b in rows]


def render_markdown(record: dict) -> str:
    rev = record.get("aleph_revision")
    lines = [
        "AlephLM-0 E1 — execution environment",
        f"Captured {record['captured_utc']} by `aleph env capture`"
        + (f" (code revision {rev})." if rev else "."),
        "",
        "Software",
        *_table(_software_rows(record["software"]), ("component", "version")),
        "",
        f"Full package set: {len(record['freeze'])} packages, "
        f"freeze sha256 {record['freeze_sha256']}",
        "",
        "Hardware and container envelope",
        *_table(_hardware_rows(record["hardware"]), ("resource", "value")),
        "",
    ]
    topo = record["hardware"]["gpu_topology"]
    if topo:
        lines += ["GPU topology (nvidia-smi topo -m)", "```", topo, "```", ""]
    lines += ["Full freeze", "```", *record["freeze"], "```", ""]
    return "\n".join(lines)
