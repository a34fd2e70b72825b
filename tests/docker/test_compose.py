"""compose.yaml as Docker Compose v2 itself normalises it: the exact seed envelope."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

TRAINING = {
    "train-a1": "a1_anchored",
    "train-a2": "a2_dense",
    "train-a3": "a3_random",
    "train-a2-ddp": "a2_dense",
}
SEED_MEM = "110999998464"  # 110,999,998,464 B, not rounded


def _config(compose_bin: str, *files: str, env: dict | None = None, check: bool = True,
            profiles: tuple[str, ...] = ("*",)):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ALEPH_", "COMPOSE_"))}
    args = [compose_bin, "--project-directory", str(REPO)]
    for f in files or ("compose.yaml",):
        args += ["-f", str(f if os.path.isabs(f) else REPO / f)]
    for profile in profiles:
        args += ["--profile", profile]
    args += ["config", "--format", "json"]
    p = subprocess.run(
        args, capture_output=True, text=True, env={**base, **(env or {})}, timeout=60
    )
    if not check:
        return p
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def cfg(compose_bin):
    return _config(compose_bin)


def test_services(cfg):
    assert set(cfg["services"]) == {*TRAINING, "campaign", "tests", "tensorboard",
                                    "extract-targets"}  # its own file: test_teacher_image.py


@pytest.mark.parametrize("name", sorted([*TRAINING, "campaign"]))
def test_training_envelope_is_exact(cfg, name):
    s = cfg["services"][name]
    assert s["mem_limit"] == SEED_MEM and s["memswap_limit"] == SEED_MEM
    # The seed's cfs figures exactly; `cpus` would be refused on hosts with < 18 CPUs and
    # sent as float32 (quota 1,784,999).
    assert (s["cpu_quota"], s["cpu_period"]) == (1_785_000, 100_000) and "cpus" not in s
    assert s["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert s["shm_size"] == str(16 << 30) and "ipc" not in s
    assert s["restart"] == "on-failure:10"
    assert (s["stop_signal"], s["stop_grace_period"]) == ("SIGTERM", "5m0s")
    assert s["logging"] == {"driver": "json-file", "options": {"max-size": "100m", "max-file": "5"}}
    assert s["volumes"] == [{"type": "volume", "source": "work", "target": "/workspace", "volume": {}}]
    assert s["environment"]["ALEPH_WORK"] == "/workspace"
    assert s["build"]["args"] == {"ALEPH_REVISION": ""}
    assert "cpuset" not in s  # the seed host's CPU numbers are opt-in


@pytest.mark.parametrize("name", ["train-a1", "train-a2", "train-a3"])
def test_one_gpu_per_arm_and_its_command(cfg, name):
    s = cfg["services"][name]
    (dev,) = s["deploy"]["resources"]["reservations"]["devices"]
    assert dev == {"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}
    assert s["command"][:6] == ["aleph", "train", "--arm", TRAINING[name], "--seed", "1"]
    cfg_ = _resolve_train_command(s["command"][1:])
    assert (cfg_.arm, cfg_.seed, cfg_.preset) == (TRAINING[name], 1, "e1")
    assert cfg_.captions == "/workspace/data/e1/captions.parquet"
    assert cfg_.targets == ("/workspace/data/e1/targets",)


def _resolve_train_command(argv: list[str]):
    """The service's `aleph train ...` through the real CLI parser and config resolver."""
    from aleph.cli import build_parser
    from aleph.train.config import resolve

    a = build_parser(only="train").parse_args(argv)
    return resolve(a.preset, a.config, a.overrides, arm=a.arm, seed=a.seed)


def test_ddp_service_spans_all_gpus_with_torchrun(cfg):
    s = cfg["services"]["train-a2-ddp"]
    (dev,) = s["deploy"]["resources"]["reservations"]["devices"]
    assert dev == {"driver": "nvidia", "count": -1, "capabilities": ["gpu"]}  # count: all
    assert s["command"][:5] == ["torchrun", "--standalone", "--nproc_per_node=gpu", "-m", "aleph"]
    assert s["command"][5:11] == ["train", "--arm", "a2_dense", "--seed", "1", "--preset"]
    assert _resolve_train_command(s["command"][5:]).targets == ("/workspace/data/e1/targets",)
    assert s["profiles"] == ["ddp"]


def test_variables_choose_gpus_seed_and_nproc(compose_bin):
    env = {
        "ALEPH_GPU_A1": "0",
        "ALEPH_GPU_A2": "1",
        "ALEPH_GPU_A3": "2",
        "ALEPH_SEED": "0",
        "ALEPH_DDP_NPROC": "4",
        "ALEPH_REVISION": "abc1234",
        "ALEPH_CAPTIONS": "/workspace/data/cc12m.jsonl",
        "ALEPH_CAPTIONS_COLUMN": "caption_llava",
        "ALEPH_TARGETS": "/workspace/data/chunks",
    }
    svc = _config(compose_bin, env=env)["services"]
    for name, gpu in (("train-a1", "0"), ("train-a2", "1"), ("train-a3", "2")):
        assert svc[name]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == [gpu]
        c = _resolve_train_command(svc[name]["command"][1:])
        assert (c.seed, c.captions, c.captions_column, c.targets) == (
            0, "/workspace/data/cc12m.jsonl", "caption_llava", ("/workspace/data/chunks",))
        assert svc[name]["build"]["args"]["ALEPH_REVISION"] == "abc1234"
    assert "--nproc_per_node=4" in svc["train-a2-ddp"]["command"]


def _campaign_runs(command: list[str]):
    """The service's `aleph campaign ...` through the real CLI parser, spec and resolver:
    (parsed arguments, {run id: resolved TrainConfig})."""
    from aleph.campaign.spec import make_spec, resolve_configs
    from aleph.cli import build_parser

    assert command[:2] == ["aleph", "campaign"]
    a = build_parser(only="campaign").parse_args(command[1:])
    spec = make_spec(a.name, a.preset, a.config, a.overrides, a.arms, a.seeds)
    return a, resolve_configs(spec)


def test_campaign_profile_is_one_container_on_all_gpus(compose_bin):
    svc = _config(compose_bin, profiles=("campaign",))["services"]
    assert "campaign" in svc and "campaign" not in _config(compose_bin, profiles=())["services"]
    s = svc["campaign"]
    # The seed's envelope, once, for all six runs (shared quota), with every GPU of the host.
    assert (s["mem_limit"], s["memswap_limit"]) == (SEED_MEM, SEED_MEM)
    assert (s["cpu_quota"], s["cpu_period"]) == (1_785_000, 100_000) and "cpus" not in s
    (dev,) = s["deploy"]["resources"]["reservations"]["devices"]
    assert dev == {"driver": "nvidia", "count": -1, "capabilities": ["gpu"]}  # count: all
    assert s["profiles"] == ["campaign"] and s["stop_grace_period"] == "5m0s"
    a, runs = _campaign_runs(s["command"])
    assert a.devices == "all" and a.preset == "e1"
    assert sorted(runs) == sorted(f"{arm}-s{seed}" for arm in ("a1_anchored", "a2_dense", "a3_random")
                                  for seed in (0, 1))
    for c in runs.values():
        assert (c.preset, c.captions, c.targets) == (
            "e1", "/workspace/data/e1/captions.parquet", ("/workspace/data/e1/targets",))


def test_tests_service_runs_pytest_strictly(cfg):
    s = cfg["services"]["tests"]
    assert s["command"][:3] == ["python3", "-m", "pytest"]
    assert s["environment"]["ALEPH_STRICT_ENV"] == "1"
    assert s["profiles"] == ["tests"] and s["restart"] == "no"


def test_tensorboard_serves_the_runs_read_only(cfg):
    s = cfg["services"]["tensorboard"]
    assert s["ports"][0]["target"] == 6006 and s["ports"][0]["published"] == "6006"
    # No authentication: loopback of the host unless ALEPH_TB_BIND says otherwise.
    assert s["ports"][0]["host_ip"] == "127.0.0.1"
    assert s["volumes"][0]["source"] == "work" and s["volumes"][0]["read_only"] is True
    assert s["environment"] == {"ALEPH_WORK": "/workspace", "ALEPH_WORK_READ_ONLY": "1",
                                "HF_TOKEN_PATH": "/home/aleph/.cache/huggingface/token"}
    assert s["command"][:2] == ["aleph", "tensorboard"] and "/workspace/runs" in s["command"]
    assert s["logging"]["options"]["max-size"] == "20m"
    # One CPU as a cfs quota: no host refuses it (`cpus: 1.0` is range-checked by dockerd).
    assert (s["cpu_quota"], s["cpu_period"]) == (100_000, 100_000) and "cpus" not in s


CI_FILES = ("compose.yaml", "compose.cpu.yaml", "tests/container/compose.ci.yaml")


@pytest.mark.parametrize("files", [("compose.yaml",), ("compose.yaml", "compose.cpu.yaml"),
                                   CI_FILES], ids=["compose", "cpu", "ci"])
def test_every_service_runs_unprivileged_on_a_read_only_root(compose_bin, files):
    svc = _config(compose_bin, *files, env={"ALEPH_CI_MEMLOCK": "8388608"})["services"]
    for name, s in svc.items():
        # No capability at all (uid 1000; the entrypoint chowns nothing), no setuid gain.
        assert s.get("cap_drop") == ["ALL"] and "cap_add" not in s, (files, name)
        assert s.get("security_opt") == ["no-new-privileges:true"], (files, name)
        assert s.get("read_only") is True and "privileged" not in s, (files, name)
        tmpfs = {t.split(":")[0] for t in s.get("tmpfs", [])}
        assert "/home/aleph" in tmpfs, (files, name, s.get("tmpfs"))
        # /tmp writable: a tmpfs, or for the suite a volume of its own (no source: anonymous)
        scratch = [v for v in s["volumes"] if v["target"] == "/tmp"]
        assert ("/tmp" in tmpfs) != bool(scratch), (files, name)
        assert name == "tests" or not scratch, (files, name)
        assert all(v["type"] == "volume" and "source" not in v for v in scratch), scratch
        # A `hf auth login` writes its token file here: a tmpfs, never the work volume.
        token = s["environment"].get("HF_TOKEN_PATH", "")
        assert token.startswith("/home/aleph/"), (files, name, token)


def test_one_shared_work_volume(cfg):
    assert cfg["volumes"] == {"work": {"name": "aleph-work"}}


def test_affinity_override_pins_every_training_service(compose_bin):
    svc = _config(compose_bin, "compose.yaml", "compose.affinity.yaml")["services"]
    for name in TRAINING:
        assert svc[name]["cpuset"] == "0-23,48-71"
        assert (svc[name]["cpu_quota"], svc[name]["cpu_period"]) == (1_785_000, 100_000)
    assert "cpuset" not in svc["tensorboard"]
    other = _config(
        compose_bin, "compose.yaml", "compose.affinity.yaml", env={"ALEPH_CPUSET": "0-17"}
    )
    assert other["services"]["train-a2"]["cpuset"] == "0-17"


def test_compose_rejects_a_broken_file(compose_bin, tmp_path):
    # Proves the validator really validates (the console-script wrapper would exit 0).
    bad = tmp_path / "compose.yaml"
    text = (REPO / "compose.yaml").read_text()
    assert "cpu_quota: 1785000" in text
    bad.write_text(text.replace("cpu_quota: 1785000", "cpu_quota: lots"))
    p = _config(compose_bin, str(bad), check=False)
    assert p.returncode != 0
    assert "cpu_quota" in p.stderr


def test_no_service_of_any_compose_file_uses_cpus(compose_bin):
    # dockerd refuses NanoCPUs above the host's CPU count; every file, every profile.
    for files in (("compose.yaml",), ("compose.yaml", "compose.cpu.yaml"),
                  ("compose.yaml", "compose.affinity.yaml")):
        for name, s in _config(compose_bin, *files)["services"].items():
            assert "cpus" not in s and s["cpu_period"] == 100_000, (files, name)


def test_cpu_override_keeps_the_envelope_and_drops_the_gpus(compose_bin):
    base = _config(compose_bin)["services"]
    cpu = _config(compose_bin, "compose.yaml", "compose.cpu.yaml")["services"]
    assert set(cpu) == set(base)
    keep = ("mem_limit", "memswap_limit", "cpu_quota", "cpu_period", "shm_size", "ulimits",
            "restart", "stop_signal", "stop_grace_period", "volumes", "logging", "environment")
    for name, s in cpu.items():
        assert {k: s.get(k) for k in keep} == {k: base[name].get(k) for k in keep}, name
        if name == "extract-targets":  # the teacher image (tests/docker/test_teacher_image.py)
            continue
        assert s["image"] == "aleph-e1:cpu" and "deploy" not in s, name
        if name != "tensorboard":
            assert s["build"]["dockerfile"] == "docker/Dockerfile.cpu"
            assert s["build"]["secrets"] == [{"source": "pip-ca"}]
    for name, arm in TRAINING.items():
        c = _resolve_train_command(cpu[name]["command"][cpu[name]["command"].index("train"):])
        assert (c.arm, c.seed, c.preset, c.smoke_data, c.epochs) == (arm, 1, "smoke", True, 2)
    assert "--nproc_per_node=2" in cpu["train-a2-ddp"]["command"]
    a, runs = _campaign_runs(cpu["campaign"]["command"])
    assert a.devices == "cpu:2" and len(runs) == 6
    assert all(c.preset == "smoke" and c.smoke_data and c.epochs == 2 for c in runs.values())
    slots = _config(compose_bin, "compose.yaml", "compose.cpu.yaml", env={"ALEPH_CPU_SLOTS": "3"})
    assert _campaign_runs(slots["services"]["campaign"]["command"])[0].devices == "cpu:3"
    env = {"ALEPH_SEED": "3", "ALEPH_SMOKE_EPOCHS": "5", "ALEPH_CPU_BASE_IMAGE": "debian-py311:x",
           "ALEPH_WHEELS_IMAGE": "wheels:x", "ALEPH_CPU_IMAGE": "aleph-e1:cpu-x"}
    s = _config(compose_bin, "compose.yaml", "compose.cpu.yaml", env=env)["services"]["train-a2"]
    c = _resolve_train_command(s["command"][1:])
    assert (c.seed, c.epochs) == (3, 5) and s["image"] == "aleph-e1:cpu-x"
    assert s["build"]["args"] == {"ALEPH_REVISION": "", "ALEPH_CPU_BASE_IMAGE": "debian-py311:x",
                                  "ALEPH_WHEELS_IMAGE": "wheels:x"}


def test_ci_override_only_relaxes_memlock_and_cuts_the_network(compose_bin):
    files = CI_FILES
    assert _config(compose_bin, *files, check=False).returncode != 0  # ALEPH_CI_MEMLOCK required
    svc = _config(compose_bin, *files, env={"ALEPH_CI_MEMLOCK": "8388608"})["services"]
    for name in ("train-a2", "tests"):
        assert svc[name]["ulimits"] == {"memlock": 8388608, "stack": 67108864}
        assert svc[name]["network_mode"] == "none" and svc[name]["build"]["network"] == "none"
        assert (svc[name]["cpu_quota"], svc[name]["mem_limit"]) == (1_785_000, SEED_MEM)
