"""The image, bit for bit: docker/repro_check.py on the real CPU image (CI's repro tier).

Two buildah builds of docker/Dockerfile.cpu, each from its own storage root, both from the
container tier's locally made Debian base and wheel image (tests/container/conftest.py), no
registry: equal manifest digests, and an SPDX SBOM named by that digest whose Python
packages are exactly lockfiles/host.txt's pins (the venv's own pip and setuptools aside,
which pip freeze omits too). Then the sabotage control on the same two stores: the build arg
that makes the last step write the time must make the gate fail and name the file.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import time

import pytest

from aleph.env.pins import INSTALLER_NAMES, parse_pins
from tests.container.conftest import REPO, _apt_install, _can_install, _cannot, _scratch_dir

pytestmark = [pytest.mark.container, pytest.mark.repro]

SCRIPT = REPO / "docker" / "repro_check.py"
TOOLS = {"buildah": "buildah", "skopeo": "skopeo", "diffoscope": "diffoscope-minimal"}
DIGEST = r"sha256:[0-9a-f]{64}"
GATE_TIMEOUT = 3600


@pytest.fixture(scope="module")
def gate(engine, base_image, wheels_image):
    """Run the gate over one work dir (stores kept between the two tests); removed after."""
    missing = [pkg for exe, pkg in TOOLS.items() if shutil.which(exe) is None]
    if missing:
        reason = _can_install()
        if reason:
            _cannot(f"{', '.join(missing)} missing: {reason}")
        _apt_install(*missing)
    work = _scratch_dir()

    def run(*args: str) -> tuple[subprocess.CompletedProcess, float]:
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, str(SCRIPT), "--base", f"docker-daemon:{base_image}",
                            "--wheels", f"docker-daemon:{wheels_image}", "--work", str(work),
                            *args], capture_output=True, text=True, timeout=GATE_TIMEOUT)
        return p, time.monotonic() - t0

    run.work = work
    yield run
    # The gate's own cleanup (buildah rm/rmi per store, then the dirs it wrote).
    spec = importlib.util.spec_from_file_location("repro_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["repro_check"] = mod  # dataclasses resolve the module by name
    spec.loader.exec_module(mod)
    mod.remove_marked_work(work)


def _digests(out: str) -> tuple[str, str]:
    (a,) = re.findall(rf"^repro-check: build a manifest ({DIGEST})$", out, re.M)
    (b,) = re.findall(rf"^repro-check: build b manifest ({DIGEST})$", out, re.M)
    return a, b


def _pypi(spdx: dict) -> tuple[dict[str, set[str]], list[str]]:
    """Read independently of the gate: the SPDX packages whose purl is pkg:pypi/NAME@VERSION,
    installed (metadata directly in site-packages) apart from copies vendored inside another
    package (syft finds tensorboard's bleach's html5lib-1.1.dist-info too)."""
    out: dict[str, set[str]] = {}
    vendored = []
    for pkg in spdx["packages"]:
        for ref in pkg.get("externalRefs", []):
            loc = ref["referenceLocator"]
            if ref["referenceType"] == "purl" and loc.startswith("pkg:pypi/"):
                name, _, version = loc.removeprefix("pkg:pypi/").partition("@")
                if re.search(r"/site-packages/[^/,]+\.(dist-info|egg-info)/", pkg.get("sourceInfo", "")):
                    out.setdefault(re.sub(r"[-_.]+", "-", name).lower(), set()).add(version)
                else:
                    vendored.append(f"{name} {version}: {pkg.get('sourceInfo', '')[-120:]}")
    return out, vendored


def test_two_independent_builds_give_one_digest_and_its_sbom_is_the_lock(gate):
    sbom_dir = gate.work / "sbom"
    p, seconds = gate("--keep", "--sbom", str(sbom_dir))
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    a, b = _digests(p.stdout)
    assert a == b
    (sbom,) = sbom_dir.glob("*.spdx.json")
    assert sbom.name == f"sbom-{a.replace(':', '-')}.spdx.json"
    doc = json.loads(sbom.read_text())
    assert doc["spdxVersion"].startswith("SPDX-2.")
    # Tied to the digest: the image it describes is that manifest (its CONTAINER package).
    (image,) = [x for x in doc["packages"] if x.get("primaryPackagePurpose") == "CONTAINER"]
    assert {"algorithm": "SHA256", "checksumValue": a.removeprefix("sha256:")} in image["checksums"]
    found, vendored = _pypi(doc)
    assert all("/site-packages/" in v and "_vendor/" in v for v in vendored), vendored
    host = parse_pins(REPO / "lockfiles" / "host.txt")
    assert all(len(v) == 1 for v in found.values()), {n: v for n, v in found.items() if len(v) > 1}
    python = {n: v.pop() for n, v in found.items()}
    assert {n: v for n, v in python.items() if n not in INSTALLER_NAMES} == host
    extra = {n: v for n, v in python.items() if n in INSTALLER_NAMES}
    assert set(extra) <= {"pip", "setuptools"}  # python3 -m venv's own, pinned by no lock
    print(f"repro: two builds in {seconds:.0f} s: build a {a} == build b {b}")
    print(f"repro: SBOM {sbom.name}: {len(host)} Python packages == lockfiles/host.txt "
          f"(+ venv installer {extra}); vendored inside pinned packages: {vendored}")


def test_the_sabotage_control_makes_the_gate_fail_and_say_where(gate):
    if not (gate.work / "a" / "root").is_dir():
        pytest.fail("the equal-digest test left no stores to rebuild on (it failed first)")
    # Both builds get the arg, so they differ only by what the step writes: the time.
    # Each store rebuilds just the last step from its own cache (stores kept by the first run).
    p, seconds = gate("--build-arg", "ALEPH_REPRO_SABOTAGE=1")
    out = p.stdout
    assert p.returncode == 1, out[-4000:] + p.stderr[-4000:]
    a, b = _digests(out)
    assert a != b
    assert "repro-check: DIFFERENT: the two builds are not the same image" in out
    (first,) = re.findall(r"^layer (\d+) of (\d+): .*; (\d+) differing paths", out, re.M)
    assert first[0] == first[1] and first[2] == "1"  # the last layer, that one file
    assert re.search(r"^  differs: opt/aleph/BUILT_AT \(sha256 [0-9a-f]{16} != [0-9a-f]{16}\)$",
                     out, re.M)
    report = out.split("\ndiffoscope:\n", 1)[1]
    assert "BUILT_AT" in report
    print(f"repro: sabotage in {seconds:.0f} s: {a} != {b}")
    print("\n".join(ln for ln in out.splitlines() if "BUILT_AT" in ln or ln.startswith("layer ")))
