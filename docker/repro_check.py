#!/usr/bin/env python3
"""Build the CPU image twice from independent buildah stores; equal manifest digests or exit 1.

Run on a build host as root (not in the image), with the system python3 (standard library
only) and Debian's buildah, skopeo and diffoscope (diffoscope-minimal):
    python3 docker/repro_check.py --base REF --wheels REF [--sbom DIR] [--work DIR --keep]
REF is any containers-image reference, e.g. `docker-daemon:aleph-ci-base:bookworm-...` (the
container tier's locally made Debian base) and `docker-daemon:aleph-wheels:...` (its image of
the wheels of lockfiles/host.txt). Both are copied once into an OCI directory, so the two
builds start from the same bytes even if a tag moves meanwhile. Then each build gets its own
storage root, run root and TMPDIR (buildah keeps `RUN --mount=type=cache` directories there),
builds docker/Dockerfile.cpu with `buildah bud --pull=never --isolation chroot --timestamp
SOURCE_DATE_EPOCH --identity-label=false` (the date is the Dockerfile's own ARG), and pushes
into one OCI directory (gzip layers), tagged a and b. Nothing is pulled from a registry.
Both builds read one snapshot of the build context: the committed tree of --revision
(`git archive`, default HEAD), so an edit made while they run cannot tell them apart.

Exit 0: the two manifest digests are equal (both printed); with --sbom, syft writes an SPDX
SBOM from the OCI layout, named by that digest. Exit 1: they differ; the first differing
paths of the first differing layer are printed, then diffoscope's report on those layers.
Exit 2: bad usage, a missing tool or a --work the gate will not use, one line. --work must be
missing, empty or marked by an earlier run (docker/repro_work.py); each run copies its inputs
into a new layout of its own and removes only what it created. --keep leaves the stores and
the OCI layout in --work, so a later run with the same --work reuses each store's own cached
layers (the sabotage test does).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "docker"))  # the SBOM half beside this file
from repro_sbom import (  # noqa: E402
    SbomError,
    dockerfile_locks,
    lock_pins,
    read_sbom,
    sbom_image_digests,
    sbom_python_packages,
    sbom_vs_pins,
)
from repro_work import (  # noqa: E402
    WorkDir,
    WorkError,
    log_tail,
    open_log,
    real_dir,
    remove_marked_work,  # noqa: F401 (the container tier's teardown)
    remove_store,
    store_args,
)

DOCKERFILE = REPO / "docker" / "Dockerfile.cpu"
SBOM_LOCK = REPO / "lockfiles" / "sbom.txt"
IMAGE = "localhost/aleph-repro-cpu:build"
BASE_NAME, WHEELS_NAME = "localhost/aleph-repro-base:input", "localhost/aleph-repro-wheels:input"
MAX_JSON = 1 << 20  # manifests and configs are a few KiB; never read more than this
FIRST_PATHS = 20  # differing paths printed per layer
DIFFOSCOPE_LINES = 80


class GateError(Exception):
    """A problem before any comparison (usage, tool, build): one line, exit 2."""


def run(args: list[str], log: Path | None = None, env: dict | None = None,
        timeout: int = 3600) -> str:
    """Run a command, its output appended to `log` (or returned); fail with its tail."""
    if log is None:
        p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
        out = p.stdout + p.stderr
    else:  # appended through our own fd: a link or FIFO planted at the log is refused
        fd = open_log(log)
        try:
            p = subprocess.run(args, stdout=fd, stderr=subprocess.STDOUT, env=env, timeout=timeout)
            out = log_tail(fd) if p.returncode else ""
        finally:
            os.close(fd)
    if p.returncode != 0:
        where = f" (log {log})" if log else ""
        raise GateError(f"{' '.join(args[:2])} exited {p.returncode}{where}:\n{out[-3000:]}")
    return out


def source_date_epoch(dockerfile: Path = DOCKERFILE) -> int:
    """The Dockerfile's own `ARG SOURCE_DATE_EPOCH=N`: one date for layers and .pyc files."""
    found = re.findall(r"^ARG SOURCE_DATE_EPOCH=(\d+)$", dockerfile.read_text(), re.M)
    if len(found) != 1:
        raise GateError(f"{dockerfile}: expected one 'ARG SOURCE_DATE_EPOCH=<seconds>' line, "
                        f"found {len(found)}")
    return int(found[0])


def read_json(path: Path):
    """A manifest, index or config blob: regular file, bounded read."""
    if not path.is_file() or path.stat().st_size > MAX_JSON:
        raise GateError(f"{path}: expected a JSON file under {MAX_JSON} bytes")
    return json.loads(path.read_bytes())


def blob(oci: Path, digest: str) -> Path:
    algo, _, hexd = digest.partition(":")
    if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexd):
        raise GateError(f"{oci}: unexpected digest {digest!r} (expected sha256:<64 hex>)")
    return oci / "blobs" / "sha256" / hexd


def manifest_digest(oci: Path, tag: str) -> str:
    """The manifest digest the layout's index.json names for `tag`."""
    found = [m["digest"] for m in read_json(oci / "index.json").get("manifests", [])
             if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag]
    if len(found) != 1:
        raise GateError(f"{oci}/index.json: expected one manifest tagged {tag!r}, found {len(found)}")
    return found[0]


def members(layer: Path) -> dict[str, tuple]:
    """Path -> (type, mode, uid, gid, mtime, link, sha256 of content) of one layer tar."""
    out = {}
    with tarfile.open(layer, "r:*") as tar:
        for m in tar:
            digest = ""
            if m.isfile():
                h = hashlib.sha256()
                f = tar.extractfile(m)
                for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                    h.update(chunk)
                digest = h.hexdigest()[:16]
            out[m.name] = (m.type.decode(errors="replace"), oct(m.mode), m.uid, m.gid,
                           int(m.mtime), m.linkname, digest)
    return out


FIELDS = ("type", "mode", "uid", "gid", "mtime", "link", "sha256")


def differing_paths(layer_a: Path, layer_b: Path) -> list[str]:
    """One line per path that is only in one layer or differs, sorted, field by field."""
    a, b = members(layer_a), members(layer_b)
    lines = []
    for path in sorted(a.keys() | b.keys()):
        if path not in b:
            lines.append(f"only in a: {path}")
        elif path not in a:
            lines.append(f"only in b: {path}")
        elif a[path] != b[path]:
            what = [f"{n} {x} != {y}" for n, x, y in zip(FIELDS, a[path], b[path], strict=True) if x != y]
            lines.append(f"differs: {path} ({'; '.join(what)})")
    return lines


def explain(oci: Path, digest_a: str, digest_b: str, diffoscope: str | None) -> list[str]:
    """Why two manifests of a layout differ: config keys, then the first differing layer's paths."""
    ma, mb = read_json(blob(oci, digest_a)), read_json(blob(oci, digest_b))
    lines = []
    ca, cb = read_json(blob(oci, ma["config"]["digest"])), read_json(blob(oci, mb["config"]["digest"]))
    for key in sorted(ca.keys() | cb.keys()):
        va, vb = ca.get(key), cb.get(key)
        if key == "rootfs" or va == vb:
            continue
        where = key
        if isinstance(va, list) and isinstance(vb, list) and len(va) == len(vb):
            # history: the first differing entry, not the whole list
            i = next(i for i, (x, y) in enumerate(zip(va, vb, strict=True)) if x != y)
            where, va, vb = f"{key}[{i}]", va[i], vb[i]
        lines.append(f"config {where}: {json.dumps(va)[:300]} != {json.dumps(vb)[:300]}")
    la, lb = ma["layers"], mb["layers"]
    if len(la) != len(lb):
        lines.append(f"layer count: {len(la)} != {len(lb)}")
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x["digest"] == y["digest"]:
            continue
        pa, pb = blob(oci, x["digest"]), blob(oci, y["digest"])
        paths = differing_paths(pa, pb)
        lines.append(f"layer {i + 1} of {len(la)}: {x['digest']} != {y['digest']}; "
                     f"{len(paths)} differing paths, the first {min(len(paths), FIRST_PATHS)}:")
        lines += [f"  {p}" for p in paths[:FIRST_PATHS]]
        if diffoscope:
            lines += run_diffoscope(diffoscope, pa, pb)
        break  # later layers build on this one; its difference is the first cause
    return lines


def run_diffoscope(exe: str, a: Path, b: Path) -> list[str]:
    """diffoscope's text report on two layer tars, its first DIFFOSCOPE_LINES lines."""
    try:
        p = subprocess.run([exe, "--text", "-", "--no-progress", "--exclude-directory-metadata",
                            "no", str(a), str(b)], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return ["diffoscope: no report within 900 s (the paths above name the differences)"]
    report = p.stdout.splitlines()
    head = report[:DIFFOSCOPE_LINES]
    more = [f"diffoscope: ... {len(report) - len(head)} more lines"] if len(report) > len(head) else []
    return ["diffoscope:"] + [f"  {ln}" for ln in head] + more


@dataclass
class Build:
    """One independent build: its own storage root, run root, TMPDIR, log and OCI output."""

    dir: Path

    @property
    def storage(self) -> list[str]:
        return store_args(self.dir)

    def ref(self, name: str) -> str:
        return f"containers-storage:[overlay@{self.dir / 'root'}+{self.dir / 'run'}]{name}"

    @property
    def log(self) -> Path:
        return self.dir / "build.log"


def build_once(b: Build, inputs: Path, oci: Path, args: argparse.Namespace, sde: int) -> str:
    """Seed the store with this run's inputs (every run: a kept store's older copy is
    replaced, never built on), build, push into the shared layout
    `oci` tagged by the build's name; the manifest digest. The layout stores a blob once per
    digest: equal layers take the disk once, differing ones are both there to compare."""
    real_dir(b.dir / "tmp")
    for tag, name in (("base", BASE_NAME), ("wheels", WHEELS_NAME)):
        run(["skopeo", "copy", "--quiet", f"oci:{inputs}:{tag}", b.ref(name)], log=b.log)
    # --format oci: with --layers each history entry names its parent step's image id, and a
    # docker-format id hashes the random build container's id in (seen: every layer equal,
    # the manifests not). OCI ids are content digests. buildah then ignores SHELL and runs
    # RUN under /bin/sh: docker/Dockerfile.cpu's RUN steps are POSIX sh and have no pipes.
    cmd = ["buildah", *b.storage, "bud", "--layers", "--pull=never", "--isolation", "chroot",
           "--format", "oci",
           "--timestamp", str(sde), "--identity-label=false",
           "-f", str(args.dockerfile),
           "--build-arg", f"ALEPH_CPU_BASE_IMAGE={BASE_NAME}",
           "--build-arg", f"ALEPH_WHEELS_IMAGE={WHEELS_NAME}",
           "--build-arg", f"ALEPH_REVISION={args.revision}"]
    for extra in args.build_arg:
        cmd += ["--build-arg", extra]
    env = {**os.environ, "TMPDIR": str(b.dir / "tmp")}
    run([*cmd, "-t", IMAGE, str(args.context)], log=b.log, env=env)
    digestfile = b.dir / "digest"
    digestfile.unlink(missing_ok=True)
    run(["buildah", *b.storage, "push", "--quiet", "--format", "oci", "--digestfile",
         str(digestfile), IMAGE, f"oci:{oci}:{b.dir.name}"], log=b.log)
    digest = digestfile.read_text().strip()
    if digest != manifest_digest(oci, b.dir.name):
        raise GateError(f"{oci}: index.json names {manifest_digest(oci, b.dir.name)} for "
                        f"{b.dir.name}, buildah wrote {digest}")
    return digest


def snapshot_context(ctx: Path, rev: str) -> Path:
    """The committed tree of `rev` as the build context in the new, empty directory `ctx`
    (git archive; files 0644/0755; the directory 0755, as a plain mkdir made it)."""
    os.chmod(ctx, 0o755)  # mkdtemp's 0700 would be the one mode that differs
    archive = subprocess.Popen(["git", "-C", str(REPO), "-c", "tar.umask=0022", "archive",
                                "--format=tar", rev], stdout=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", str(ctx)], stdin=archive.stdout,
                           capture_output=True, timeout=600)
    archive.stdout.close()
    if archive.wait(timeout=600) != 0 or untar.returncode != 0:
        raise GateError(f"git archive {rev} | tar -x failed: {untar.stderr.decode()[-500:]}")
    return ctx


def stage_inputs(work: WorkDir, base: str, wheels: str) -> Path:
    """Copy base and wheels into a new OCI layout of this run, which both builds read; print
    their digests. A layout already in --work is never used (its base image would supply
    the binaries the RUN steps execute as root)."""
    inputs = work.fresh("inputs")

    def tags() -> dict[str, str]:
        return {m.get("annotations", {}).get("org.opencontainers.image.ref.name"): m["digest"]
                for m in read_json(inputs / "index.json")["manifests"]}

    for tag, ref in (("base", base), ("wheels", wheels)):
        run(["skopeo", "copy", "--quiet", ref, f"oci:{inputs}:{tag}"])
    for tag, digest in sorted(tags().items()):
        print(f"repro-check: input {tag}: {digest}", flush=True)
    return inputs


def ensure_syft(venv: Path) -> Path:
    """syft from lockfiles/sbom.txt in its own venv (keyed on the lock), hash-checked."""
    key = hashlib.sha256(SBOM_LOCK.read_bytes()).hexdigest()
    exe, stamp = venv / "bin" / "syft", venv / ".sbom-lock.sha256"
    if exe.is_file() and stamp.is_file() and stamp.read_text() == key:
        return exe
    if venv.exists() and not (venv / "pyvenv.cfg").is_file():
        raise GateError(f"{venv}: exists and is not a venv; name another --sbom-venv")
    shutil.rmtree(venv, ignore_errors=True)
    run([sys.executable, "-m", "venv", str(venv)])
    run([str(venv / "bin" / "python"), "-m", "pip", "--isolated", "--disable-pip-version-check",
         "install", "-q", "--require-hashes", "--no-deps", "--only-binary", ":all:",
         "-r", str(SBOM_LOCK)], env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    stamp.write_text(key)
    return exe


def one_manifest_view(oci: Path, digest: str) -> Path:
    """A new layout beside `oci` holding only `digest` (syft reads one image per layout), its
    blobs hard links; the caller removes it."""
    view = Path(tempfile.mkdtemp(prefix="sbom-view-", dir=oci.parent))
    (view / "blobs" / "sha256").mkdir(parents=True)
    (entry,) = {m["digest"]: m for m in read_json(oci / "index.json")["manifests"]
                if m["digest"] == digest}.values()
    manifest = read_json(blob(oci, digest))
    for d in (digest, manifest["config"]["digest"], *(x["digest"] for x in manifest["layers"])):
        os.link(blob(oci, d), blob(view, d))
    (view / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (view / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    return view


def write_sbom(syft: Path, oci: Path, digest: str, out_dir: Path) -> Path:
    """SPDX JSON of the OCI layout, written atomically as sbom-sha256-<hex>.spdx.json: syft
    writes into a new private directory of this run (mkdtemp, 0700) in `out_dir`, so nothing
    planted in `out_dir` is written through; then fsync, rename, the directory removed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / f"sbom-{digest.replace(':', '-')}.spdx.json"
    tmp_dir = Path(tempfile.mkdtemp(prefix=".sbom-", dir=out_dir))
    tmp = tmp_dir / final.name
    env = {**os.environ, "SYFT_CHECK_FOR_APP_UPDATE": "false"}
    try:
        view = one_manifest_view(oci, digest)
        try:
            run([str(syft), "scan", "--quiet", "--source-name", "aleph-e1-cpu",
                 f"oci-dir:{view}", "-o", f"spdx-json={tmp}"], env=env)
        finally:
            shutil.rmtree(view, ignore_errors=True)
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise GateError(f"{tmp}: syft wrote no regular file")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return final


def revision() -> str:
    p = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                       text=True, timeout=60) if shutil.which("git") else None
    if p is None or p.returncode != 0:
        raise GateError("no git revision here: pass --revision")
    return p.stdout.strip()


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="repro_check.py", description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the Debian base image (containers-image ref)")
    ap.add_argument("--wheels", required=True, help="the image of lockfiles/host.txt's wheels")
    ap.add_argument("--revision", help="ALEPH_REVISION (default: git rev-parse HEAD)")
    ap.add_argument("--build-arg", action="append", default=[], metavar="K=V",
                    help="passed to both builds (ALEPH_REPRO_SABOTAGE=1: the sabotage control)")
    ap.add_argument("--work", type=Path, help="where the stores live (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the stores and OCI layouts")
    ap.add_argument("--sbom", type=Path, metavar="DIR", help="write the SPDX SBOM here")
    ap.add_argument("--sbom-venv", type=Path, default=REPO / "work" / "sbom-venv")
    ap.add_argument("--dockerfile", type=Path, default=DOCKERFILE)
    ap.add_argument("--context", type=Path,
                    help="build from this directory as it is (default: git archive --revision)")
    args = ap.parse_args(argv)
    args.revision = args.revision or revision()
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
        for tool in ("buildah", "skopeo"):
            if shutil.which(tool) is None:
                raise GateError(f"{tool} not found: apt-get install buildah skopeo diffoscope-minimal")
        work = WorkDir(args.work)
        inputs = stage_inputs(work, args.base, args.wheels)
        if args.context is None:  # the snapshot's own Dockerfile, locks and code
            args.context = snapshot_context(work.fresh("context"), args.revision)
            if args.dockerfile.is_relative_to(REPO):
                args.dockerfile = args.context / args.dockerfile.relative_to(REPO)
        sde = source_date_epoch(args.dockerfile)
        builds = [Build(work.store("a")), Build(work.store("b"))]
        for b in builds:
            os.close(open_log(b.log, truncate=True))
        oci, digests = work.fresh("oci"), {}
        # One after the other: a build's store peaks at about three times the image (its
        # container, the commit's temp copy, the new layer); two at once would double that.
        for b in builds:
            digests[b.dir.name] = build_once(b, inputs, oci, args, sde)
        print(f"repro-check: build a manifest {digests['a']}", flush=True)
        print(f"repro-check: build b manifest {digests['b']}", flush=True)
        if digests["a"] != digests["b"]:
            print("repro-check: DIFFERENT: the two builds are not the same image", flush=True)
            for line in explain(oci, digests["a"], digests["b"], shutil.which("diffoscope")):
                print(line, flush=True)
            return 1
        print(f"repro-check: equal: {digests['a']}", flush=True)
        if args.sbom:
            path = write_sbom(ensure_syft(args.sbom_venv), oci, digests["a"], args.sbom)
            print(f"repro-check: SBOM {path}", flush=True)
            locks, doc = dockerfile_locks(args.dockerfile, args.context), read_sbom(path)
            (found, vendored), pins = sbom_python_packages(doc), lock_pins(locks)
            problems = sbom_vs_pins(found, pins)
            if sbom_image_digests(doc) != [digests["a"]]:
                problems.append(f"describes {sbom_image_digests(doc)}, not {digests['a']}")
            for line in problems:
                print(f"repro-check: SBOM: {line}", flush=True)
            if problems:
                return 1
            extra = ", ".join(sorted(f"{n} {v}" for n, vs in found.items() if n not in pins
                                     for v in vs))
            names = ", ".join(str(p.relative_to(args.context)) for p in locks)
            print(f"repro-check: SBOM: its Python packages are the {len(pins)} pins of {names}"
                  + (f" (and the venv's own installer, which pip freeze omits: {extra})"
                     if extra else ""), flush=True)
            if vendored:  # copies inside a pinned package's files: its hash covers them
                print("repro-check: SBOM: vendored inside pinned packages (not installed by "
                      f"pip): {', '.join(vendored)}", flush=True)
        return 0
    except (GateError, SbomError, WorkError) as e:
        print(f"repro-check: error: {e}", file=sys.stderr)
        return 2
    finally:
        if "work" in locals():  # --keep: the stores (for the next run) and the OCI layout
            kept = (work.path / "a", work.path / "b", locals().get("oci")) if args.keep else ()
            work.cleanup(remove_store, tuple(p for p in kept if p is not None))


if __name__ == "__main__":
    sys.exit(main())
