"""The repro gate's `--work` directory (issue 32, item 11), without an engine or a registry:
docker/repro_check.py's `main` runs with stand-ins for skopeo and buildah on PATH (small
scripts that log their arguments; skopeo writes the OCI index a copy would, buildah's build
fails), over real directories, files and symbolic links. A directory the gate did not make
is refused and left as it is, a planted `a/build.log` link leaves its target's bytes alone,
an `inputs/` layout already there is never used, only what the run created is removed, and
syft never writes through a planted `.sbom-*.tmp` link."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from tests.docker.test_repro_check import BASE, CODE, _layer, _layout

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "docker" / "repro_check.py"
MARKER = ".aleph-repro-work"

SKOPEO = """import hashlib, json, os, sys
open(os.environ["STUB_LOG"], "a").write("skopeo " + " ".join(sys.argv[1:]) + "\\n")
dst = sys.argv[-1]
if dst.startswith("oci:"):  # oci:DIR:TAG: the index entry a copy would add
    d, tag = dst[4:].rsplit(":", 1)
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, "index.json")
    idx = json.load(open(p)) if os.path.exists(p) else {"schemaVersion": 2, "manifests": []}
    idx["manifests"].append({"digest": "sha256:" + hashlib.sha256(tag.encode()).hexdigest(),
                             "annotations": {"org.opencontainers.image.ref.name": tag}})
    json.dump(idx, open(p, "w"))
"""
BUILDAH = """import os, sys
open(os.environ["STUB_LOG"], "a").write("buildah " + " ".join(sys.argv[1:]) + "\\n")
if "bud" in sys.argv:
    print("STEP 1/9: FROM base: the stand-in stops here")
    sys.exit(1)
sys.exit(1 if "inspect" in sys.argv else 0)
"""
SYFT = """import sys
out = next(a for a in sys.argv if a.startswith("spdx-json=")).split("=", 1)[1]
with open(out, "w") as f:  # as syft does: open(O_CREAT|O_TRUNC), following links
    f.write('{"spdxVersion": "SPDX-2.3"}')
"""


@pytest.fixture
def rc():
    spec = importlib.util.spec_from_file_location("repro_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["repro_check"] = mod  # dataclasses resolve the module by name
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """skopeo and buildah stand-ins first on PATH; their calls are logged to the returned file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, code in (("skopeo", SKOPEO), ("buildah", BUILDAH), ("syft", SYFT)):
        (bin_dir / name).write_text(f"#!{sys.executable}\n{code}")
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    log.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STUB_LOG", str(log))
    return log


def gate(rc, work: Path, capsys, *extra: str) -> tuple[int, str]:
    code = rc.main(["--base", "oci:/base:x", "--wheels", "oci:/wheels:y", "--revision", "0" * 40,
                    "--context", str(REPO), "--work", str(work), *extra])
    return code, capsys.readouterr().err


def tree(root: Path) -> dict[str, str]:
    """Every path under `root` (links not followed): its kind and bytes or link target."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(dirpath) / n
            rel = str(p.relative_to(root))
            out[rel] = (f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir()
                        else hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def _planted_inputs(work: Path) -> None:
    """A layout whose tags say base and wheels: the old gate built on it as it was."""
    (work / "inputs").mkdir(parents=True)
    (work / "inputs" / "index.json").write_text(json.dumps({"manifests": [
        {"digest": "sha256:" + "e" * 64, "annotations": {"org.opencontainers.image.ref.name": t}}
        for t in ("base", "wheels")]}))


def test_a_work_dir_holding_other_files_is_refused_and_untouched(rc, tools, tmp_path, capsys):
    work = tmp_path / "work"
    _planted_inputs(work)
    (work / "oci").mkdir()
    (work / "notes.txt").write_text("the user's own notes\n")
    before = tree(work)
    code, err = gate(rc, work, capsys)
    print(err.strip())
    assert code == 2 and err.count("\n") == 1
    assert "holds files this gate did not make (inputs, notes.txt, oci)" in err
    assert tree(work) == before  # nothing removed, nothing added
    assert tools.read_text() == ""  # refused before any tool ran


def test_a_symlinked_work_dir_is_refused(rc, tools, tmp_path, capsys):
    (tmp_path / "real").mkdir()
    (tmp_path / "work").symlink_to(tmp_path / "real")
    code, err = gate(rc, tmp_path / "work", capsys)
    assert code == 2 and "is a symbolic link; expected a directory" in err
    assert list((tmp_path / "real").iterdir()) == []


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_planted_build_log_is_refused_its_target_untouched(rc, tools, tmp_path, capsys, kind):
    work, victim = tmp_path / "work", tmp_path / "victim.txt"
    victim.write_bytes(b"root's own file, never a log\n")
    (work / "a").mkdir(parents=True)
    (work / MARKER).write_text("marked by an earlier run\n")
    if kind == "link":
        (work / "a" / "build.log").symlink_to(victim)
    else:
        os.mkfifo(work / "a" / "build.log")
    code, err = gate(rc, work, capsys)
    print(err.strip())
    assert code == 2 and err.count("\n") == 1
    assert f"log {work / 'a' / 'build.log'} is a {'symbolic link' if kind == 'link' else 'FIFO'}" \
        in err
    assert victim.read_bytes() == b"root's own file, never a log\n"  # bytes and size
    assert (work / "a" / "build.log").is_symlink() == (kind == "link")  # left as it is
    assert "bud" not in tools.read_text()


def test_an_inputs_layout_already_there_is_never_used_nor_removed(rc, tools, tmp_path, capsys):
    work = tmp_path / "work"
    _planted_inputs(work)
    (work / MARKER).write_text("marked by an earlier run\n")
    before = tree(work)
    code, err = gate(rc, work, capsys)
    assert code == 2 and "the stand-in stops here" in err, err  # the build failed, its log tail
    calls = tools.read_text().splitlines()
    copies = [c.split()[-1] for c in calls
              if c.startswith(("skopeo copy --quiet oci:/base:", "skopeo copy --quiet oci:/wheels:"))]
    print("\n".join(calls))
    # both inputs copied into a new layout of this run, which the builds then read
    assert [c.rsplit(":", 1)[1] for c in copies] == ["base", "wheels"]
    fresh = copies[0][4:].rsplit(":", 1)[0]
    assert Path(fresh).parent == work and Path(fresh).name.startswith("inputs-")
    assert any(f"oci:{fresh}:base containers-storage:" in c for c in calls)
    assert not any(f"oci:{work / 'inputs'}:" in c for c in calls)
    # only what this run created is gone: its stores, layouts, logs; the rest as it was
    assert tree(work) == before


def test_a_missing_work_dir_is_made_and_removed_with_keep_leaving_stores(rc, tools, tmp_path,
                                                                         capsys):
    work = tmp_path / "new" / "work"
    code, _ = gate(rc, work, capsys)
    assert code == 2 and not work.exists()  # made by this run: removed
    code, _ = gate(rc, work, capsys, "--keep")
    assert code == 2
    names = sorted(p.name for p in work.iterdir())
    assert names[:3] == [MARKER, "a", "b"] and names[3].startswith("oci-"), names
    code, _ = gate(rc, work, capsys)  # marked: used again; its kept stores stay
    assert code == 2 and sorted(p.name for p in work.iterdir()) == names
    rc.remove_marked_work(work)
    assert not work.exists()


def test_syft_never_writes_through_a_planted_tmp_link(rc, tools, tmp_path):
    oci = tmp_path / "work" / "oci"
    digest = _layout(oci, "a", [_layer(BASE), _layer(CODE)])
    out, victim = tmp_path / "sbom", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_bytes(b"root's own file\n")
    final = f"sbom-{digest.replace(':', '-')}.spdx.json"
    (out / f".{final}.tmp").symlink_to(victim)  # the name the old gate wrote through
    path = rc.write_sbom(Path(tools.parent / "bin" / "syft"), oci, digest, out)
    assert path == out / final and not path.is_symlink()
    assert json.loads(path.read_text()) == {"spdxVersion": "SPDX-2.3"}
    assert victim.read_bytes() == b"root's own file\n"
    assert sorted(p.name for p in out.iterdir()) == [f".{final}.tmp", final]  # link untouched
    assert sorted(p.name for p in oci.parent.iterdir()) == ["oci"]  # its view removed


def test_a_store_that_is_a_link_is_refused(rc, tools, tmp_path, capsys):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    (work).mkdir()
    (work / MARKER).write_text("marked by an earlier run\n")
    elsewhere.mkdir()
    (work / "b").symlink_to(elsewhere)  # the second store: root's buildah would write there
    code, err = gate(rc, work, capsys)
    print(err.strip())
    assert code == 2 and err.count("\n") == 1
    assert f"{work / 'b'} is a symbolic link; expected a build store directory" in err
    assert list(elsewhere.iterdir()) == [] and (work / "b").is_symlink()
    assert sorted(p.name for p in work.iterdir()) == [MARKER, "b"]  # this run's a/ removed
