"""The SBOM half of docker/repro_check.py: what an SPDX document and a Dockerfile's locks say.

Standard library only. The SBOM's Python packages (by purl) are compared with the pins of the
lock files the Dockerfile installs; the image it describes is its CONTAINER package's checksum.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import unquote

REPO = Path(__file__).resolve().parents[1]


class SbomError(Exception):
    """An SBOM that cannot be read: one line, exit 2."""


PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.M)
# pip freeze (and so pip_freeze.txt and `aleph env check`) never lists these: the venv's own
# installer, not part of a lock unless a lock pins it (as aleph/env/pins.py).
INSTALLERS = frozenset({"pip", "setuptools", "wheel", "distribute"})
MAX_SBOM = 256 << 20


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dockerfile_locks(dockerfile: Path, root: Path = REPO) -> list[Path]:
    """The lock files a Dockerfile's pip steps install (`-r lockfiles/NAME.txt`), in order."""
    return [root / rel for rel in re.findall(r"-r (lockfiles/[\w.-]+\.txt)", dockerfile.read_text())]


def lock_pins(locks: list[Path]) -> dict[str, str]:
    """name -> version of every `name==version` line of the locks (names normalised)."""
    pins: dict[str, str] = {}
    for lock in locks:
        for name, version in PIN.findall(lock.read_text()):
            pins[norm(name)] = version
    return pins


def read_sbom(spdx: Path) -> dict:
    if not spdx.is_file() or spdx.stat().st_size > MAX_SBOM:
        raise SbomError(f"{spdx}: expected an SPDX JSON file under {MAX_SBOM} bytes")
    return json.loads(spdx.read_bytes())


def sbom_image_digests(doc: dict) -> list[str]:
    """The SHA256 checksums of the document's CONTAINER package(s): the manifest it describes."""
    return [f"sha256:{c['checksumValue']}" for pkg in doc.get("packages", [])
            if pkg.get("primaryPackagePurpose") == "CONTAINER"
            for c in pkg.get("checksums", []) if c.get("algorithm") == "SHA256"]


MANIFEST = re.compile(r"(/[^,\s]*?)/[^/,\s]+\.(?:dist-info|egg-info)(?:/|$)")
"""Where syft's sourceInfo names a package's metadata: `.../<dir>/<name>.dist-info/METADATA`."""


def vendored_in(pkg: dict) -> str | None:
    """The directory a package's metadata lies in when that is not an install location
    (site-packages, dist-packages): a copy vendored inside another package, e.g.
    `tensorboard/_vendor/bleach/_vendor/html5lib-1.1.dist-info`, never installed by pip.
    None for an installed package (or one whose source syft does not say)."""
    m = MANIFEST.search(pkg.get("sourceInfo") or "")
    if m is None:
        return None
    parent = m.group(1)
    if parent.rsplit("/", 1)[-1] in ("site-packages", "dist-packages"):
        return None
    for marker in ("/site-packages/", "/dist-packages/"):  # shorten to the package's own path
        if marker in parent:
            return parent.split(marker, 1)[1]
    return parent


def sbom_python_packages(doc: dict) -> tuple[dict[str, set[str]], list[str]]:
    """(name -> versions of the SPDX document's installed `pkg:pypi/` packages (by purl),
    "name version (in DIR)" of those vendored inside another package)."""
    found: dict[str, set[str]] = {}
    vendored: list[str] = []
    for pkg in doc.get("packages", []):
        for ref in pkg.get("externalRefs", []):
            m = re.fullmatch(r"pkg:pypi/([^@?#]+)@([^?#]+)(?:[?#].*)?", ref.get("referenceLocator", ""))
            if ref.get("referenceType") == "purl" and m:
                name, version = norm(unquote(m.group(1))), unquote(m.group(2))
                inside = vendored_in(pkg)
                if inside is None:
                    found.setdefault(name, set()).add(version)
                else:
                    vendored.append(f"{name} {version} (in {inside})")
    return found, sorted(vendored)


def sbom_vs_pins(found: dict[str, set[str]], pins: dict[str, str]) -> list[str]:
    """What keeps the SBOM's Python packages from being exactly the pins (installers aside)."""
    problems = []
    for name in sorted(found.keys() | pins.keys()):
        have, want = found.get(name, set()), pins.get(name)
        if want is None and name in INSTALLERS:
            continue
        if want is None:
            problems.append(f"in the SBOM, not pinned: {name} {', '.join(sorted(have))}")
        elif have != {want}:
            problems.append(f"{name}: pinned {want}, SBOM has {', '.join(sorted(have)) or 'nothing'}")
    return problems
