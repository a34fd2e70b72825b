"""The teacher image and the `extract-targets` service, as Compose v2 and hadolint see them.

Not built here (the container tier builds the E1 images only): the Dockerfiles lint clean,
the service runs only in its profile, under the seed's envelope with every GPU and the
hardening options, and its command is one the real CLI parser accepts.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from test_compose import SEED_MEM, _config

from aleph.cli import build_parser

DOCKERFILES = ("docker/Dockerfile.teachers", "docker/Dockerfile.teachers.cpu")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_teacher_dockerfiles_lint_clean_and_install_the_hash_locked_teacher_set(
        hadolint_bin, repo_file, name):
    path = repo_file(name)
    p = subprocess.run([hadolint_bin, str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    text = path.read_text()
    assert not text.startswith("# syntax")  # no frontend fetched from a registry
    assert "--require-hashes --no-deps --only-binary :all: -r /opt/teachers-lock/teachers.txt" in text
    assert "pip check" in text and "USER 1000:1000" in text


def _service(compose_bin, *files):
    return _config(compose_bin, *files, profiles=("targets",))["services"]["extract-targets"]


def test_extract_targets_runs_only_in_its_profile(compose_bin):
    assert "extract-targets" not in _config(compose_bin, profiles=())["services"]


def test_extract_targets_service_is_the_envelope_with_every_gpu_and_no_privileges(compose_bin):
    s = _service(compose_bin, "compose.yaml")
    assert s["mem_limit"] == SEED_MEM and (s["cpu_quota"], s["cpu_period"]) == (1_785_000, 100_000)
    assert s["cap_drop"] == ["ALL"] and s["security_opt"] == ["no-new-privileges:true"]
    (dev,) = s["deploy"]["resources"]["reservations"]["devices"]
    assert dev["count"] == -1 and dev["capabilities"] == ["gpu"]  # count: all
    assert s["build"]["dockerfile"] == "docker/Dockerfile.teachers" and s["restart"] == "no"
    assert s["environment"].get("HF_TOKEN") is None  # passed through, never written here
    args = build_parser("targets").parse_args(s["command"][3:])
    assert (args.targets_command, args.out, args.consensus_out) == (
        "extract", "/workspace/data/e1/teachers", "/workspace/data/e1/targets")
    assert args.teachers.split(",")[0] == "bert-base-uncased" and len(args.teachers.split(",")) == 5


def test_cpu_variant_builds_on_the_cpu_image_without_gpus(compose_bin):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALEPH_")}
    s = _config(compose_bin, "compose.yaml", "compose.cpu.yaml", env=env,
                profiles=("targets",))["services"]["extract-targets"]
    assert s["build"]["dockerfile"] == "docker/Dockerfile.teachers.cpu" and "deploy" not in s
    assert s["build"]["args"]["ALEPH_CPU_IMAGE"] == "aleph-e1:cpu"
    assert s["cap_drop"] == ["ALL"] and s["mem_limit"] == SEED_MEM
