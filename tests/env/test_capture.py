"""`aleph env capture` against fabricated hosts: cgroup v1/v2 trees, /proc, /sys, nvidia-smi."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aleph.env.capture import gather, write_capture
from aleph.env.hostinfo import format_cpulist, parse_cpulist
from aleph.env.render import cudnn_label, peer_links, render_markdown

REPO = Path(__file__).resolve().parents[2]
CID = "d2d7b1e1e4e4" + "a" * 52
UUIDS = ["GPU-b5d01167-717d-2198-1b7f-7ff14788d65a", "GPU-0b319f75-ee74-46e3-9831-01dc3b8fe681"]
SMI = "".join(f"NVIDIA A40, 46068, {u}, 570.195.03\n" for u in UUIDS)
TOPO = (
    "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tPXB\t0-23,48-71\t0\t\tN/A\n"
    "GPU1\tPXB\t X \t0-23,48-71\t0\t\tN/A\n"
)
RUNTIME = {
    "python": "3.11.10",
    "compiler": "GCC 11.4.0",
    "torch": "2.4.1+cu124",
    "cuda": "12.4",
    "cudnn": 90100,
    "triton": "3.0.0",
}
PACKAGES = {"torch": "2.4.1+cu124", "numpy": "1.26.3", "torchvision": "0.19.1+cu124"}
NOW = dt.datetime(2026, 8, 7, 12, 0, 0, tzinfo=dt.UTC)


def _files(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _seed_host(tmp: Path) -> dict:
    """/proc, /sys and /etc of the seed's host: 96 vCPU, ~503 GiB, 2 NUMA nodes."""
    cpuinfo = "".join(
        f"processor\t: {i}\nmodel name\t: Intel(R) Xeon(R) Gold 6342 CPU @ 2.80GHz\n\n"
        for i in range(96)
    )
    proc = _files(
        tmp / "proc",
        {
            "cpuinfo": cpuinfo,
            "meminfo": "MemTotal:       527972820 kB\nMemFree: 1 kB\n",
            "self/mountinfo": (
                "600 500 0:50 / / rw - overlay overlay rw\n"
                f"610 600 8:1 /var/lib/docker/containers/{CID}/hostname /etc/hostname rw - ext4 /dev/sda1 rw\n"
                f"620 600 0:60 / {tmp}/work rw - nfs4 fs:/vol rw\n"
            ),
            "self/cgroup": "0::/\n",
            "sys/kernel/osrelease": "6.8.0-64-generic\n",
        },
    )
    sys_root = _files(
        tmp / "sys",
        {
            "devices/system/node/node0/cpulist": "0-23,48-71\n",
            "devices/system/node/node1/cpulist": "24-47,72-95\n",
        },
    )
    etc = _files(tmp / "etc", {"os-release": 'NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 22.04.5 LTS"\n'})
    (tmp / "work").mkdir()
    return {"proc": proc, "sys_root": sys_root, "etc": etc, "work": tmp / "work"}


def _smi(args: list[str]) -> str | None:
    return TOPO if args[1:] == ["topo", "-m"] else SMI


def _capture(tmp: Path, cgroup: Path, **over) -> dict:
    kw = {
        **_seed_host(tmp),
        "cgroup_root": cgroup,
        "runner": _smi,
        "cpu_affinity": parse_cpulist("0-23,48-71"),
        "runtime": RUNTIME,
        "packages": PACKAGES,
        "now": NOW,
    }
    kw.update(over)
    return gather(**kw)


V2 = {
    "cgroup.controllers": "cpu memory cpuset\n",
    "cpu.max": "1785000 100000\n",
    "memory.max": "110999998464\n",
    "cpuset.cpus.effective": "0-23,48-71\n",
}
V1 = {
    "memory/memory.limit_in_bytes": "110999998464\n",
    "cpu,cpuacct/cpu.cfs_quota_us": "1785000\n",
    "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    "cpuset/cpuset.effective_cpus": "0-23,48-71\n",
}


@pytest.mark.parametrize("version, tree", [(2, V2), (1, V1)])
def test_seed_envelope_reads_exactly(tmp_path, version, tree):
    rec = _capture(tmp_path, _files(tmp_path / "cg", tree))
    env = rec["hardware"]["envelope"]
    assert env["cgroup_version"] == version
    assert env["memory_limit_bytes"] == 110999998464
    assert env["cpu_cores"] == pytest.approx(17.85)
    md = render_markdown(rec)
    assert f"| Container memory quota (cgroup v{version}) | 110,999,998,464 B (103.38 GiB) |" in md
    assert "| 17.85 cores (cfs quota 1,785,000 / period 100,000) |" in md


def test_seed_host_rows(tmp_path):
    rec = _capture(tmp_path, _files(tmp_path / "cg", V2))
    md = render_markdown(rec)
    assert "| GPUs | 2 × NVIDIA A40, 46,068 MiB each, PXB peer link |" in md
    assert f"| GPU UUIDs | {UUIDS[0]}, {UUIDS[1]} |" in md
    assert "| Host CPU | Intel(R) Xeon(R) Gold 6342 CPU @ 2.80GHz, 96 vCPU visible |" in md
    assert "| Host RAM | 540,644,167,680 B (503.51 GiB) visible |" in md
    assert "| CPU affinity / NUMA | 0-23,48-71 / node 0 |" in md
    assert "| Container id | d2d7b1e1e4e4 |" in md
    assert "| cuDNN | 9.1.0 (90100) |" in md
    assert "| Python | 3.11.10 (GCC 11.4.0) |" in md
    assert "| NVIDIA driver | 570.195.03 |" in md
    assert "| OS / kernel | Ubuntu 22.04.5 LTS / 6.8.0-64-generic |" in md
    assert "| torchvision / torchaudio | 0.19.1+cu124 / absent (not installed) |" in md
    assert "nfs4 at " in md  # the work root's own mount, not the overlay
    assert rec["freeze"] == ["numpy==1.26.3", "torch==2.4.1+cu124", "torchvision==0.19.1+cu124"]


def test_absent_pieces_are_stated_not_guessed(tmp_path):
    host = _seed_host(tmp_path)
    empty = tmp_path / "nothing"
    empty.mkdir()
    runtime = {**RUNTIME, "torch": None, "cuda": None, "cudnn": None}
    rec = _capture(
        tmp_path / "b",
        empty,
        runner=lambda a: None,
        runtime=runtime,
        proc=empty,
        **{k: v for k, v in host.items() if k not in ("proc",)},
    )
    md = render_markdown(rec)
    for text in (
        "| GPUs | absent (nvidia-smi found no GPU) |",
        "| Container memory quota | absent (no cgroup filesystem found) |",
        "| Container CPU quota | absent (no cgroup filesystem found) |",
        "| Container id | absent (not visible: not in a container?) |",
        "| Host RAM | absent (no /proc/meminfo) |",
        "| cuDNN | absent (torch reports no cuDNN) |",
        "| NVIDIA driver | absent (no nvidia-smi or no GPU) |",
    ):
        assert text in md
    assert "None" not in md


def test_unlimited_cgroup_v2_says_no_limit(tmp_path):
    cg = _files(
        tmp_path / "cg",
        {"cgroup.controllers": "", "cpu.max": "max 100000\n", "memory.max": "max\n"},
    )
    md = render_markdown(_capture(tmp_path, cg))
    assert "| Container memory quota (cgroup v2) | absent (no cgroup memory limit) |" in md
    assert "| Container CPU quota (cgroup v2) | absent (no cgroup CPU quota) |" in md


def test_markdown_and_json_twin_are_written(tmp_path):
    rec = _capture(tmp_path, _files(tmp_path / "cg", V2))
    md, js = write_capture(rec, tmp_path / "out")
    assert md.name == "environment-20260807T120000Z.md" and js.suffix == ".json"
    assert json.loads(js.read_text()) == json.loads(json.dumps(rec))
    assert md.read_text() == render_markdown(rec)


def test_small_helpers():
    assert cudnn_label(90100) == "9.1.0 (90100)"
    assert cudnn_label(8907) == "8.9.7 (8907)"
    assert format_cpulist(parse_cpulist("0-23,48-71")) == "0-23,48-71"
    assert format_cpulist({0, 2, 3, 4, 7}) == "0,2-4,7"
    assert peer_links(TOPO) == "PXB"
    assert peer_links(None) is None


def test_cli_capture_runs_on_this_machine(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "ALEPH_WORK": str(tmp_path / "work")}
    p = subprocess.run(
        [sys.executable, "-m", "aleph", "env", "capture", "--out", str(tmp_path / "cap")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "Hardware and container envelope" in p.stdout
    written = sorted(x.suffix for x in (tmp_path / "cap").iterdir())
    assert written == [".json", ".md"]


@pytest.mark.gpu
def test_live_gpu_facts_agree_with_torch():
    import torch

    from aleph.env.facts import gpu_facts, runtime_facts

    facts = gpu_facts()
    assert facts["driver"], "nvidia-smi must report a driver where CUDA works"
    # nvidia-smi lists every GPU of the container; CUDA_VISIBLE_DEVICES may hide some.
    assert len(facts["gpus"]) >= torch.cuda.device_count()
    assert torch.cuda.get_device_name(0) in {g["name"] for g in facts["gpus"]}
    assert runtime_facts()["cudnn"] == torch.backends.cudnn.version()


def test_unwritable_output_is_a_named_config_error(tmp_path):
    from aleph.errors import ConfigError

    rec = _capture(tmp_path, _files(tmp_path / "cg", V2))
    (tmp_path / "a-file").write_text("keep\n")
    with pytest.raises(ConfigError, match="capture output directory .*a-file.*writable"):
        write_capture(rec, tmp_path / "a-file" / "out")  # parent is a file: fails even as root
    assert (tmp_path / "a-file").read_text() == "keep\n"
