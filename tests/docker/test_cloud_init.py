"""docker/cloud-init.yaml: valid per cloud-init's own schema, and its parts agree."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def path(repo_file) -> Path:
    return repo_file("docker/cloud-init.yaml")


@pytest.fixture(scope="module")
def cfg(path) -> dict:
    return yaml.safe_load(path.read_text())


def _schema(exe: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [exe, "schema", "--config-file", str(path)], capture_output=True, text=True, timeout=120
    )


def test_valid_cloud_config(cloud_init_bin, path):
    assert path.read_text().startswith("#cloud-config\n")
    p = _schema(cloud_init_bin, path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Valid cloud-config" in p.stdout


def test_the_validator_rejects_a_broken_copy(cloud_init_bin, path, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("package_update: true", "package_update: [yes, no]"))
    p = _schema(cloud_init_bin, bad)
    assert p.returncode != 0
    assert "package_update" in p.stdout + p.stderr


def _file(cfg: dict, target: str) -> str:
    (content,) = [f["content"] for f in cfg["write_files"] if f["path"] == target]
    return content


def test_setup_script_is_valid_bash_and_runs_the_host_check(cfg, tmp_path):
    script = _file(cfg, "/usr/local/sbin/aleph-host-setup")
    f = tmp_path / "setup.sh"
    f.write_text(script)
    p = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True, timeout=20)
    assert p.returncode == 0, p.stderr
    assert "python3 docker/host_check.py --work-dir /srv/aleph" in script
    assert "nvidia-ctk runtime configure --runtime=docker" in script
    assert 'ALEPH_REVISION="${revision}" docker compose build' in script
    assert cfg["runcmd"] == [["/usr/local/sbin/aleph-host-setup"]]


def test_docker_data_root_is_on_the_data_disk(cfg):
    daemon = json.loads(_file(cfg, "/etc/docker/daemon.json"))
    (mount,) = cfg["mounts"]
    assert mount[0] == f"LABEL={cfg['fs_setup'][0]['label']}" and mount[1] == "/srv/aleph"
    assert "nofail" in mount[3]
    assert daemon["data-root"].startswith(mount[1] + "/")
    assert cfg["fs_setup"][0]["overwrite"] is False  # never wipe an existing store
    assert {"docker.io", "docker-compose-v2"} <= set(cfg["packages"])


def test_every_later_boot_runs_the_host_check_again(cfg, tmp_path):
    # After the driver reboot the log must describe the running host, not the first boot.
    script = _file(cfg, "/var/lib/cloud/scripts/per-boot/aleph-host-check")
    f = tmp_path / "per-boot.sh"
    f.write_text(script)
    p = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True, timeout=20)
    assert p.returncode == 0, p.stderr
    assert "docker/host_check.py --work-dir /srv/aleph" in script
    assert "/var/log/aleph-host-check.log" in script
