"""docker/cloud-init.yaml: valid per cloud-init's own schema, and its parts agree."""

from __future__ import annotations

import json
import shutil
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


SETUP = "/usr/local/sbin/aleph-host-setup"


def _file(cfg: dict, target: str) -> str:
    (content,) = [f["content"] for f in cfg["write_files"] if f["path"] == target]
    return content


def test_setup_script_is_valid_bash_and_runs_the_host_check(cfg, tmp_path):
    script = _file(cfg, "/usr/local/sbin/aleph-host-setup")
    f = tmp_path / "setup.sh"
    f.write_text(script)
    p = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True, timeout=20)
    assert p.returncode == 0, p.stderr
    assert 'python3 docker/host_check.py --work-dir "$work_dir"' in script
    assert 'work_dir="${ALEPH_SETUP_WORK_DIR:-/srv/aleph}"' in script
    assert 'check_log="${ALEPH_SETUP_CHECK_LOG:-/var/log/aleph-host-check.log}"' in script
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
    assert 'docker/host_check.py" --work-dir "${ALEPH_SETUP_WORK_DIR:-/srv/aleph}"' in script
    assert "/var/log/aleph-host-check.log" in script


# ---- the setup script, run for real under bash on a fake host ---------------------------
# The GPU driver, Docker, systemd and the network cannot be used on a test machine: those
# commands are small stubs in a PATH of their own (each records its call), next to the few
# real tools the scripts use. The scripts themselves run unchanged, with their files moved
# under tmp_path by their ALEPH_SETUP_* variables.

REVISION = "0123456789abcdef0123456789abcdef01234567"
REAL_TOOLS = ("date", "tee", "mkdir", "touch", "cat", "seq", "sleep")
HOST_CHECK_OUT = "host check: 2 problem(s)"  # what the stubbed docker/host_check.py prints


class FakeHost:
    def __init__(self, tmp_path: Path, *, build_rc: int = 0, pull_rc: int = 0,
                 clone_rc: int = 0, image: str = "") -> None:
        self.root = tmp_path
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.calls = tmp_path / "calls.log"
        self.setup_log = tmp_path / "log" / "aleph-host-setup.log"
        self.check_log = tmp_path / "log" / "aleph-host-check.log"
        self.setup_log.parent.mkdir()
        self.checkout = tmp_path / "opt" / "aleph-e1"
        self.state = tmp_path / "state"
        host_env = tmp_path / "host.env"
        host_env.write_text("ALEPH_REPO_URL=https://git.example.invalid/aleph-e1.git\n"
                            f"ALEPH_REF=main\nALEPH_IMAGE={image}\nALEPH_DRIVER=nvidia:570-server\n")
        for tool in REAL_TOOLS:
            real = shutil.which(tool)
            assert real, f"{tool} not found on this machine"
            (self.bin / tool).symlink_to(real)
        stubs = {
            "nvidia-smi": "exit 0",
            "nvidia-container-runtime-hook": "exit 0",
            "nvidia-ctk": "exit 0",
            "systemctl": "exit 0",
            "usermod": "exit 0",
            "chown": "exit 0",
            "git": f'''case "$1" in
                clone) [ {clone_rc} -eq 0 ] || {{ echo "fatal: clone failed" >&2; exit {clone_rc}; }}
                       mkdir -p "$3/.git" "$3/docker" && touch "$3/docker/host_check.py" ;;
                rev-parse) echo {REVISION} ;;
            esac''',
            "python3": f'echo "{HOST_CHECK_OUT}"; exit 1',
            "docker": f'''case "$1 ${{2:-}}" in
                "compose build") echo "step 1/20: build output"; exit {build_rc} ;;
                "pull "*) exit {pull_rc} ;;
                "info "*) exit 0 ;;
            esac''',
        }
        for name, body in stubs.items():
            f = self.bin / name
            f.write_text(f'#!/bin/bash\necho "{name} $*" >> "{self.calls}"\n{body}\n')
            f.chmod(0o755)
        self.env = {
            "PATH": str(self.bin),
            "ALEPH_SETUP_LOG": str(self.setup_log),
            "ALEPH_SETUP_CHECK_LOG": str(self.check_log),
            "ALEPH_SETUP_HOST_ENV": str(host_env),
            "ALEPH_SETUP_CHECKOUT": str(self.checkout),
            "ALEPH_SETUP_WORK_DIR": str(tmp_path / "srv"),
            "ALEPH_SETUP_STATE_DIR": str(self.state),
            "ALEPH_SETUP_REBOOT_FLAG": str(tmp_path / "reboot-needed"),
        }

    def run(self, cfg: dict, target: str) -> subprocess.CompletedProcess:
        script = self.root / Path(target).name
        script.write_text(_file(cfg, target))
        return subprocess.run([shutil.which("bash"), str(script)], env=self.env,
                              capture_output=True, text=True, timeout=60)

    def check_lines(self) -> list[str]:
        return self.check_log.read_text().splitlines()

    def call_lines(self) -> list[str]:
        return self.calls.read_text().splitlines()


def _index(lines: list[str], prefix: str) -> int:
    (i,) = [i for i, line in enumerate(lines) if line.startswith(prefix)]
    return i


@pytest.mark.parametrize("image, cmd, word", [("", "docker compose build train-a2", "build"),
                                              ("mirror.example.invalid/aleph-e1:1", "docker pull",
                                               "pull")])
def test_a_failed_image_is_reported_after_the_host_check_and_the_script_completes(
        cfg, tmp_path, image, cmd, word):
    host = FakeHost(tmp_path, build_rc=17, pull_rc=17, image=image)
    p = host.run(cfg, SETUP)
    assert p.returncode == 1, p.stderr  # cloud-init's status says error too
    # The host check ran before the image step, and its report survives the failure.
    calls = host.call_lines()
    assert _index(calls, "python3 docker/host_check.py --work-dir") < _index(calls, cmd)
    assert host.check_lines() == [
        HOST_CHECK_OUT, f"image {word}: FAILED (exit 17), see {host.setup_log}"]
    setup = host.setup_log.read_text()
    assert "== done; reboot needed: no" in setup  # the rest of the script ran
    assert f"image {word}: FAILED (exit 17)" in setup
    assert not (host.checkout / ".env").exists()  # nothing points at an image that is not there


def test_a_built_image_is_reported_and_a_second_run_changes_nothing(cfg, tmp_path):
    host = FakeHost(tmp_path)
    for _ in range(2):
        p = host.run(cfg, SETUP)
        assert p.returncode == 0, host.setup_log.read_text()
        assert host.check_lines() == [HOST_CHECK_OUT, f"image build: OK {REVISION}"]
        assert (host.checkout / ".env").read_text() == \
            f"ALEPH_IMAGE=aleph-e1:local\nALEPH_REVISION={REVISION}\n"
    calls = host.call_lines()
    assert len([c for c in calls if c.startswith("git clone ")]) == 1
    assert len([c for c in calls if c.startswith("docker compose build ")]) == 2
    assert host.setup_log.read_text().count("== done; reboot needed: no") == 2


def test_a_stop_before_the_host_check_still_writes_the_check_log(cfg, tmp_path):
    host = FakeHost(tmp_path, clone_rc=128)
    p = host.run(cfg, SETUP)
    assert p.returncode == 128
    assert host.check_lines() == [
        "host setup: FAILED (exit 128) while checking out "
        f"https://git.example.invalid/aleph-e1.git at main, see {host.setup_log}"]
    assert "fatal: clone failed" in host.setup_log.read_text()
    assert not [c for c in host.call_lines() if c.startswith(("python3", "docker"))]


def test_the_check_of_a_later_boot_repeats_the_image_line(cfg, tmp_path):
    host = FakeHost(tmp_path, build_rc=3)
    host.run(cfg, SETUP)
    failed = f"image build: FAILED (exit 3), see {host.setup_log}"
    host.check_log.write_text("stale\n")
    p = host.run(cfg, "/var/lib/cloud/scripts/per-boot/aleph-host-check")
    assert p.returncode == 0, p.stderr
    assert host.check_lines() == [HOST_CHECK_OUT, failed]
