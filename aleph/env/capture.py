"""`aleph env capture`: the seed's kind of environment record, written automatically.

The seed was typed by hand before the container was released; this writes the same
tables (Software; Hardware and container envelope) plus the full freeze, as Markdown
and a JSON twin. Every probe is rooted (proc, sys, etc, cgroup) or injected (the
nvidia-smi runner, affinity) so tests run it against fabricated trees.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
from pathlib import Path

from aleph._io import atomic_write_json, atomic_write_text, work_root
from aleph.env import facts as live
from aleph.env import hostinfo
from aleph.env.cgroup import DEFAULT_ROOT, read_envelope
from aleph.env.pins import comparable, freeze_lines, freeze_sha256, installed_packages
from aleph.env.render import render_markdown
from aleph.errors import ConfigError

SCHEMA = "aleph-env-capture/1"
# Seed-table package rows, by distribution name (the row's label is the import name).
PACKAGE_ROWS = ("transformers", "tokenizers", "huggingface-hub", "datasets", "safetensors",
                "numpy", "tensorboard", "torchvision", "torchaudio")


def gather(*, work: Path | None = None, proc: Path = Path("/proc"), sys_root: Path = Path("/sys"),
           etc: Path = Path("/etc"), cgroup_root: Path = DEFAULT_ROOT,
           runner: live.Runner = live.run_tool, cpu_affinity: set[int] | None = None,
           runtime: dict | None = None, packages: dict[str, str] | None = None,
           now: dt.datetime | None = None) -> dict:
    """The JSON record. Parameters left None are read from the live machine."""
    work = Path(work) if work is not None else work_root()
    runtime = runtime if runtime is not None else live.runtime_facts()
    packages = comparable(packages if packages is not None else installed_packages(), {})
    cpus = cpu_affinity if cpu_affinity is not None else hostinfo.affinity()
    gpu = live.gpu_facts(runner)
    now = now or dt.datetime.now(dt.UTC)
    return {
        "schema": SCHEMA,
        "captured_utc": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "software": {**runtime,
                     "packages": {d.replace("-", "_"): packages.get(d) for d in PACKAGE_ROWS},
                     "driver": gpu["driver"], "os": hostinfo.os_release(etc),
                     "kernel": hostinfo.kernel_release(proc) or platform.release()},
        "freeze": freeze_lines(packages),
        "freeze_sha256": freeze_sha256(packages),
        "hardware": {
            "gpus": gpu["gpus"],
            "gpu_topology": live.gpu_topology(runner) if gpu["gpus"] else None,
            "host_cpu_model": hostinfo.cpu_model(proc),
            "host_vcpus_visible": hostinfo.visible_vcpus(proc),
            "host_ram_bytes_visible": hostinfo.meminfo_bytes("MemTotal", proc),
            "envelope": read_envelope(Path(cgroup_root)).as_dict(),
            "cpu_affinity": hostinfo.format_cpulist(cpus) if cpus else None,
            "numa_nodes": hostinfo.numa_nodes(cpus, sys_root) if cpus else None,
            "container_id": hostinfo.container_id(proc),
            "storage": {"root": hostinfo.storage("/", proc),
                        "work_root": hostinfo.storage(work, proc)},
        },
        "aleph_revision": _revision(),
    }


def _revision() -> str | None:
    """The baked code revision (aleph/REVISION, written by the image build), if any."""
    path = Path(__file__).resolve().parents[1] / "REVISION"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def write_capture(record: dict, out_dir: Path) -> tuple[Path, Path]:
    """Write `environment-<stamp>.md` and its `.json` twin atomically; return both paths."""
    stamp = record["captured_utc"].replace("-", "").replace(":", "")
    md = Path(out_dir) / f"environment-{stamp}.md"
    js = md.with_suffix(".json")
    try:
        atomic_write_json(js, record)
        atomic_write_text(md, render_markdown(record))
    except OSError as e:
        raise ConfigError(f"capture output directory {out_dir}: cannot write "
                          f"{e.filename or md.name} ({e.strerror}); expected a writable directory "
                          "(--out, $ALEPH_CAPTURE_DIR or $ALEPH_WORK/env)") from None
    return md, js


def default_out_dir() -> Path:
    return Path(os.environ.get("ALEPH_CAPTURE_DIR", work_root() / "env"))
