"""`aleph env check`: is this the E1 environment, a known host variant, or drifted?

Expected sets, all read from the source tree the code runs from:
- image: `pip_freeze.txt` plus the seed's software table (`aleph.env.seed`);
- host: `lockfiles/host.txt` + `dev.txt` + `dev-sdist.txt` on any CPython 3.11 (the
  dev/test venv made by ./aleph-dev: PyPI torch 2.4.1, CUDA 12.1 build);
- cpu-image: `lockfiles/host.txt` alone on any CPython 3.11, only inside the CPU image
  (docker/Dockerfile.cpu sets ALEPH_IMAGE_VARIANT=cpu).
Non-strict, a known variant passes and is named; strict compares against the image only
(the image build and `docker compose run tests` fail on any difference), except in the CPU
image, where strict means exactly its own lock. `compare()` takes every live fact as a
parameter so tests doctor an environment without touching the real one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from aleph.env import facts as live
from aleph.env.pins import comparable, diff_packages, freeze_sha256, installed_packages, parse_pins
from aleph.env.seed import SEED_FACTS, SEED_PACKAGES
from aleph.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST_PYTHON = "3.11"  # the host variant accepts any 3.11.x interpreter
DEV_LOCKS = ("dev.txt", "dev-sdist.txt")  # what ./aleph-dev installs beside host.txt
IMAGE_VARIANT_ENV = "ALEPH_IMAGE_VARIANT"  # "cpu" in docker/Dockerfile.cpu; unset elsewhere


@dataclass(frozen=True)
class Drift:
    what: str  # "package" or "fact"
    name: str
    expected: str | None  # None: not expected (an extra package)
    found: str | None  # None: absent


@dataclass(frozen=True)
class Pins:
    image: dict[str, str]  # pip_freeze.txt
    host: dict[str, str] | None  # host.txt | dev.txt; None when the host lock is absent
    cpu: dict[str, str] | None = None  # host.txt alone: the CPU image's set


@dataclass
class CheckResult:
    variant: str  # "image" | "host" | "cpu-image" | "drifted"
    strict: bool
    drifts: list[Drift] = field(default_factory=list)
    image_drift_count: int = 0  # differences from the image, shown only under --strict
    reference: str = "image"  # the variant `drifts` are listed against

    @property
    def ok(self) -> bool:
        return not self.drifts


def load_pins(root: str | Path = REPO_ROOT) -> Pins:
    """Read the freeze (required) and, when lockfiles/host.txt exists, the host variant:
    host.txt plus the dev locks present (dev.txt, dev-sdist.txt: tools built from source)."""
    root = Path(root)
    image = parse_pins(root / "pip_freeze.txt")
    host_path = root / "lockfiles" / "host.txt"
    if not host_path.exists():
        return Pins(image, None)
    host = parse_pins(host_path)
    cpu = dict(host)
    for name in DEV_LOCKS:
        dev_path = root / "lockfiles" / name
        if not dev_path.exists():
            continue
        for pkg, version in parse_pins(dev_path).items():
            if host.get(pkg, version) != version:
                raise ConfigError(f"{dev_path}: {pkg}=={version} contradicts {host.get(pkg)}")
            host[pkg] = version
    return Pins(image, host, cpu)


def _package_drifts(installed: dict[str, str], expected: dict[str, str]) -> list[Drift]:
    return [Drift("package", n, e, f) for n, e, f in diff_packages(installed, expected)]


def image_drifts(installed: dict[str, str], facts: dict, pins: Pins) -> list[Drift]:
    """Every difference from pip_freeze.txt and the seed table, deduplicated, in order."""
    seed_live = {n: installed.get(n) for n in SEED_PACKAGES}
    found = {k: None if facts.get(k) is None else str(facts[k]) for k in SEED_FACTS}
    drifts = [Drift("fact", k, v, found[k]) for k, v in SEED_FACTS.items() if found[k] != v]
    drifts += _package_drifts(installed, pins.image)
    # Seed rows also catch a freeze that was edited to agree with a drifted image.
    drifts += [Drift("package", n, v, seed_live[n])
               for n, v in SEED_PACKAGES.items() if seed_live[n] != v]
    return list(dict.fromkeys(drifts))


def _host_drifts(installed: dict[str, str], facts: dict, host: dict[str, str]) -> list[Drift]:
    py = str(facts.get("python") or "")
    out = []
    if not py.startswith(HOST_PYTHON + "."):
        out.append(Drift("fact", "python", HOST_PYTHON + ".*", py or None))
    return out + _package_drifts(installed, host)


def compare(installed: dict[str, str], facts: dict, pins: Pins, strict: bool,
            image_variant: str = "") -> CheckResult:
    """Classify an environment given its installed set and runtime facts.

    image_variant "cpu" (the CPU image declares it) adds the cpu-image variant, which
    --strict then checks exactly instead of the seed's image."""
    vs_image = image_drifts(installed, facts, pins)
    if not vs_image:
        return CheckResult("image", strict)
    if image_variant == "cpu" and pins.cpu is not None:
        vs_cpu = _host_drifts(installed, facts, pins.cpu)
        if not vs_cpu:
            return CheckResult("cpu-image", strict, [], len(vs_image))
        if strict:
            return CheckResult("drifted", True, vs_cpu, len(vs_image), reference="cpu-image")
    if strict:
        return CheckResult("drifted", True, vs_image, len(vs_image))
    vs_host = _host_drifts(installed, facts, pins.host) if pins.host is not None else None
    if vs_host == []:
        return CheckResult("host", False, [], len(vs_image))
    # Report against the nearer known variant so the table is the useful one.
    if vs_host is not None and len(vs_host) < len(vs_image):
        return CheckResult("drifted", False, vs_host, len(vs_image), reference="host")
    return CheckResult("drifted", False, vs_image, len(vs_image))


def check_environment(strict: bool = False, root: str | Path = REPO_ROOT) -> CheckResult:
    """compare() on the live interpreter (and the image variant the environment declares)."""
    return compare(installed_packages(), live.runtime_facts(), load_pins(root), strict,
                   os.environ.get(IMAGE_VARIANT_ENV, ""))


def environment_summary(root: str | Path = REPO_ROOT, runner: live.Runner = live.run_tool) -> dict:
    """JSON-able facts for run manifests. Never raises on a machine without GPU or pins."""
    installed, facts = installed_packages(), live.runtime_facts()
    summary = {**facts, **live.gpu_facts(runner)}
    try:
        pins = load_pins(root)
        summary["variant"] = compare(installed, facts, pins, strict=False,
                                     image_variant=os.environ.get(IMAGE_VARIANT_ENV, "")).variant
        frozen = comparable(installed, pins.image)
    except ConfigError as e:  # pins missing or malformed: still describe the environment
        summary["variant"] = "drifted"
        summary["pins_error"] = str(e)
        frozen = comparable(installed, {})
    summary["freeze_sha256"] = freeze_sha256(frozen)
    summary["packages"] = frozen
    return summary


def format_report(result: CheckResult) -> str:
    """A table of each difference (expected, found) and a one-line verdict."""
    lines = []
    if result.drifts:
        width = max(len(d.name) for d in result.drifts)
        lines.append(f"{'what':<8} {'name':<{width}}  {'expected':<20} found")
        for d in result.drifts:
            exp = d.expected if d.expected is not None else "(not expected)"
            got = d.found if d.found is not None else "(absent)"
            lines.append(f"{d.what:<8} {d.name:<{width}}  {exp:<20} {got}")
    lines.append(verdict(result))
    return "\n".join(lines)


def verdict(result: CheckResult) -> str:
    if result.variant == "image":
        return "verdict: image: matches pip_freeze.txt and the seed table exactly"
    if result.variant == "host":
        return ("verdict: host variant (lockfiles/host.txt + dev locks); "
                f"{result.image_drift_count} differences from the image not shown (use --strict)")
    if result.variant == "cpu-image":
        return ("verdict: CPU image variant (lockfiles/host.txt on CPython 3.11, no CUDA): matches "
                f"its lock exactly; not the seed's image ({result.image_drift_count} differences "
                "from pip_freeze.txt and the seed table)")
    if result.strict and result.reference == "cpu-image":
        mode = "strict, against the CPU image's lockfiles/host.txt"
    elif result.strict:
        mode = "strict, against the image"
    else:
        mode = f"no known variant matches; listed against the {result.reference}"
    return f"verdict: DRIFTED ({mode}): {len(result.drifts)} differences"
