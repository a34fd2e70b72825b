"""Resume states in-process: checksummed COMPLETE markers, verification, fallback, set-aside,
markers of another format version, pruning, file modes, and disk-full handling (free-space check and a real
EFBIG under RLIMIT_FSIZE in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from aleph._io import file_mode, sha256_file
from aleph.errors import QuotaError, StoreError
from aleph.record.layout import RunLayout
from aleph.train import checkpoint as ckpt
from tests.train.conftest import REPO, tiny_trainer


def _save(run_dir, steps, keep=3):
    model, opt, sched = tiny_trainer()[1:]
    for step in steps:
        ckpt.save(run_dir, model, opt, sched, ckpt.Position(step, 0, step, step * 4, 1.0),
                  [ckpt.rng_state()], "h", keep=keep)
    return model, opt, sched


def test_marker_records_every_files_sha256_and_size_and_files_are_0644(tmp_path):
    _save(tmp_path, [3])
    state = RunLayout(tmp_path).state_dir(3)
    marker = json.loads((state / "COMPLETE").read_text())
    assert marker["format_version"] == 1 and marker["step"] == 3
    assert set(marker["files"]) == {"model.safetensors", "trainer.pt", "meta.json"}
    for name, rec in marker["files"].items():
        assert rec == {"sha256": sha256_file(state / name), "size": (state / name).stat().st_size}
    for name in ("model.safetensors", "trainer.pt", "meta.json", "COMPLETE"):
        assert (state / name).stat().st_mode & 0o777 == file_mode(), name  # 0644 at umask 022
    assert ckpt.verify_state(state) is None


def test_deleted_file_falls_back_to_the_previous_state_and_is_set_aside(tmp_path):
    _save(tmp_path, [3, 6])
    (RunLayout(tmp_path).state_dir(6) / "trainer.pt").unlink()
    lines = []
    path, meta = ckpt.find_resume(tmp_path, lines.append)
    assert (path.name, meta["step"]) == ("step-00000003", 3)
    [line] = lines
    assert line.startswith("resume: checkpoints/step-00000006/trainer.pt: missing (the COMPLETE "
                           "marker lists it); set aside as checkpoints/step-00000006.corrupt-")
    [aside] = (tmp_path / "checkpoints").glob("step-00000006.corrupt-*")
    assert (aside / "model.safetensors").is_file()  # kept for inspection
    # no longer counted, never removed as incomplete, never pruned
    assert [p.name for p in RunLayout(tmp_path).complete_states()] == ["step-00000003"]
    assert ckpt.remove_incomplete(tmp_path) == []
    assert ckpt.prune(tmp_path, 1) == [] and aside.is_dir()
    # a later save of the same step is a new, complete state beside the corrupt one
    _save(tmp_path, [6])
    assert [p.name for p in RunLayout(tmp_path).complete_states()] == ["step-00000003", "step-00000006"]
    assert aside.is_dir()


@pytest.mark.parametrize("damage", ["flip-meta", "resize-model", "bad-marker", "plain-line",
                                    "wrong-step"])
def test_each_kind_of_damage_is_one_line_naming_the_file(tmp_path, damage):
    _save(tmp_path, [3])
    state = RunLayout(tmp_path).state_dir(3)
    if damage == "flip-meta":
        text = (state / "meta.json").read_text()
        (state / "meta.json").write_text(text.replace('"step": 3', '"step": 4'))
        want = r"meta\.json: sha256 [0-9a-f]{16}\.\.\., the COMPLETE marker records [0-9a-f]{16}"
    elif damage == "resize-model":
        with open(state / "model.safetensors", "ab") as f:
            f.write(b"\0")
        want = r"model\.safetensors: [\d,]+ B, the COMPLETE marker records [\d,]+ B"
    elif damage == "bad-marker":
        (state / "COMPLETE").write_text("{not json")
        want = r"COMPLETE: not a valid marker"
    elif damage == "plain-line":  # the marker of the trainer before checksums: not read
        (state / "COMPLETE").write_text("step 3\n")
        want = r"COMPLETE: not a valid marker \(expected a JSON object with format_version 1"
    else:
        marker = json.loads((state / "COMPLETE").read_text())
        (state / "COMPLETE").write_text(json.dumps({**marker, "step": 9}))
        want = r"COMPLETE: records step 9, the directory is step-00000003"
    problem = ckpt.verify_state(state)
    assert problem is not None and "\n" not in problem
    assert __import__("re").match(want, problem), problem


@pytest.mark.parametrize("marker, found", [
    ('{"marker_version": 2, "step": 6, "files": {}}', "None"),
    ('{"format_version": 2, "step": 6, "files": {}}', "2"),
])
def test_a_state_of_another_format_version_is_refused_in_one_line(tmp_path, marker, found):
    _save(tmp_path, [3, 6])
    state = RunLayout(tmp_path).state_dir(6)
    (state / "COMPLETE").write_text(marker)
    with pytest.raises(StoreError) as e:
        ckpt.find_resume(tmp_path, print)
    assert str(e.value) == (f"{state / 'COMPLETE'}: format_version {found}, expected 1 (written by "
                            "another version of aleph-e1; this one reads only its own)")
    assert e.value.exit_code == 2
    assert sorted(p.name for p in RunLayout(tmp_path).checkpoints.iterdir()) == [
        "step-00000003", "step-00000006"]  # nothing set aside, nothing removed


def test_meta_of_another_format_version_is_refused_in_one_line(tmp_path):
    _save(tmp_path, [3])
    state = RunLayout(tmp_path).state_dir(3)
    meta = json.loads((state / "meta.json").read_text())
    del meta["format_version"]
    (state / "meta.json").write_text(json.dumps(meta))
    model, opt, sched = tiny_trainer()[1:]
    with pytest.raises(StoreError, match=r"^\S+/meta\.json: format_version None, expected 1 \("):
        ckpt.load(state, model, opt, sched)


def test_no_intact_state_is_a_loud_fresh_start(tmp_path):
    _save(tmp_path, [3])
    (RunLayout(tmp_path).state_dir(3) / "meta.json").write_text("{}")
    lines = []
    assert ckpt.find_resume(tmp_path, lines.append) is None
    assert len(lines) == 2 and lines[1].startswith(
        "resume: WARNING: FRESH START from step 0: none of the 1 complete resume state(s) is "
        "intact (set aside: step-00000003.corrupt-")
    assert ckpt.find_resume(tmp_path / "elsewhere", lines.append) is None  # nothing: no line
    assert len(lines) == 2


def test_never_more_than_keep_complete_states(tmp_path, monkeypatch):
    """The oldest states go before the new marker is written, so no instant has keep + 1."""
    seen = []
    from aleph.record import layout

    real = layout.atomic_write_json

    def spy(path, obj):  # called for the marker: count complete states just before it
        seen.append(len(RunLayout(tmp_path).complete_states()))
        real(path, obj)

    monkeypatch.setattr(layout, "atomic_write_json", spy)
    _save(tmp_path, [1, 2, 3, 4], keep=2)
    assert seen == [0, 1, 1, 1]
    assert [p.name for p in RunLayout(tmp_path).complete_states()] == ["step-00000003", "step-00000004"]


def test_too_little_free_space_is_refused_before_writing(tmp_path, monkeypatch):
    model, opt, sched = _save(tmp_path, [3])
    before = sorted(p.name for p in RunLayout(tmp_path).checkpoints.iterdir())
    monkeypatch.setattr("aleph._io.free_bytes", lambda path: 1000)
    with pytest.raises(QuotaError) as e:
        ckpt.save(tmp_path, model, opt, sched, ckpt.Position(6, 0, 6, 24, 1.0),
                  [ckpt.rng_state()], "h", keep=2)
    msg = str(e.value)
    assert msg.startswith(f"{RunLayout(tmp_path).state_dir(6)}: not enough disk space for the resume "
                          "state of step 6 (model.safetensors, trainer.pt, meta.json): needs ")
    assert msg.split("needs ")[1].split(" B,")[0].replace(",", "").isdigit()
    assert ", 1,000 B free" in msg and "\n" not in msg
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before


_ENOSPC_SCRIPT = """
import resource, signal, sys, torch
from aleph.errors import AlephError
from aleph.model import ModelConfig, build_model
from aleph.targets import build_store
from aleph.train import checkpoint as ckpt
from aleph.train.config import resolve
from aleph.train.optim import make_optimizer, make_scheduler

run_dir, chunk = sys.argv[1], sys.argv[2]
model = build_model(ModelConfig(arm="a2_dense", vocab_size=50, max_len=8, d_model=16,
                                n_layers=1, n_heads=2, ffn_dense=32))
opt = make_optimizer(model, resolve("smoke", arm="a2_dense"))
sched = make_scheduler(opt, resolve("smoke", arm="a2_dense"), 10)
torch.save(torch.zeros(64, 768, dtype=torch.float16), chunk)  # 98 KB of targets
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit: EFBIG, not a kill
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
for what, call in (("ckpt", lambda: ckpt.save(run_dir, model, opt, sched,
                                               ckpt.Position(3, 0, 3, 12, 1.0),
                                               [ckpt.rng_state()], "h", keep=2)),
                   ("store", lambda: build_store([chunk], run_dir + "/store"))):
    try:
        call()
        print(what, "no error")
    except AlephError as e:
        print(what, type(e).__name__, e)
"""


def test_running_out_of_room_mid_write_names_the_file(tmp_path):
    """A real EFBIG (file size limit, the errno family of ENOSPC): the checkpoint and the
    store build each fail with one line naming the file, and leave nothing half written."""
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", _ENOSPC_SCRIPT, str(run_dir),
                           str(tmp_path / "chunk.pt")], cwd=REPO, capture_output=True,
                          text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    state = RunLayout(run_dir).state_dir(3)
    assert lines["ckpt"].startswith(f"QuotaError {state}/model.safetensors: disk full while "
                                    "writing (File too large): needs ")
    assert lines["ckpt"].endswith("B free; the previous resume state is intact: free space and "
                                  "relaunch")
    assert list((run_dir / "checkpoints").iterdir()) == []  # the partial state was removed
    assert lines["store"].startswith(f"StoreError {run_dir}/store/targets.bin.partial: disk full "
                                     "while reserving 98,304 bytes (File too large): needs "
                                     "98,304 B, ")
    assert not (run_dir / "store" / "targets.bin.partial").exists()


def test_store_build_checks_free_space_first(make_chunks_dir, tmp_path, monkeypatch):
    from aleph.targets import build_store

    monkeypatch.setattr("aleph._io.free_bytes", lambda path: 10)
    with pytest.raises(QuotaError, match=r"targets\.bin\.partial: not enough disk space for the "
                       r"target store's data file: needs 1,024 B, 10 B free"):
        build_store(make_chunks_dir, tmp_path / "store")
    assert not (tmp_path / "store" / "targets.bin.partial").exists()


@pytest.fixture
def make_chunks_dir(tmp_path):
    paths = []
    for i in range(2):
        paths.append(tmp_path / f"c{i}.pt")
        torch.save(torch.zeros(32, 8, dtype=torch.float16), paths[-1])
    return paths


def _rewrite(state, name: str, data: bytes) -> None:
    """Replace one state file and its marker entry, as whoever writes a destination can."""
    (state / name).write_bytes(data)
    marker = json.loads((state / "COMPLETE").read_text())
    marker["files"][name] = {"sha256": sha256_file(state / name), "size": len(data)}
    (state / "COMPLETE").write_text(json.dumps(marker))


def test_a_marker_naming_anything_but_the_state_files_is_damage_never_read(tmp_path):
    """A pulled marker's extra name (`../x`, `/dev/zero`) would lead the check to any file on
    the machine (an endless read for /dev/zero); the state is damaged, nothing else is read."""
    _save(tmp_path, [3])
    state = RunLayout(tmp_path).state_dir(3)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x" * 10)
    marker = json.loads((state / "COMPLETE").read_text())
    marker["files"]["../../outside.bin"] = {"sha256": sha256_file(outside), "size": 10}
    (state / "COMPLETE").write_text(json.dumps(marker))
    assert ckpt.verify_state(state) == ("COMPLETE: not a valid marker (expected the sha256 and "
                                        "size of model.safetensors, trainer.pt, meta.json and "
                                        "of nothing else)")


def test_a_state_file_that_is_a_link_is_damage_even_when_its_bytes_match(tmp_path):
    _save(tmp_path, [3])
    state = RunLayout(tmp_path).state_dir(3)
    moved = tmp_path / "elsewhere.pt"
    os.rename(state / "trainer.pt", moved)
    os.symlink(moved, state / "trainer.pt")
    assert ckpt.verify_state(state) == "trainer.pt: a symbolic link, expected a regular file"


@pytest.mark.parametrize("edit, want", [
    (lambda m: {**m, "step": "3"}, "meta.json: field 'step' is '3', expected an integer >= 0"),
    (lambda m: [m], "meta.json: format_version None, expected 1"),
    (lambda m: {**m, "samples_seen": -1}, "meta.json: field 'samples_seen' is -1, expected an "
                                          "integer >= 0"),
    (lambda m: {**m, "train_seconds": "NaN"}, "meta.json: field 'train_seconds' is 'NaN', "
                                              "expected seconds >= 0"),
    (lambda m: {**m, "step": 6}, "meta.json: records step 6, the directory is step-00000003"),
    (lambda m: "[" * 100_000 + "]" * 100_000, "meta.json: JSON nested too deeply to parse"),
])
def test_a_meta_of_the_wrong_shape_with_a_matching_marker_is_one_line(tmp_path, edit, want):
    """A destination's writer writes meta.json and its marker entry alike: the checksum proves
    nothing, so the fields are checked; the state is damaged (set aside, the one before used)
    or, for another format version, refused; never a traceback at resume."""
    _save(tmp_path, [2, 3])
    state = RunLayout(tmp_path).state_dir(3)
    new = edit(json.loads((state / "meta.json").read_text()))
    _rewrite(state, "meta.json", (new if isinstance(new, str) else json.dumps(new)).encode())
    lines = []
    if "format_version" in want:
        with pytest.raises(StoreError, match=r"meta\.json: format_version None, expected 1"):
            ckpt.find_resume(tmp_path, lines.append)
        return
    path, meta = ckpt.find_resume(tmp_path, lines.append)
    assert (path.name, meta["step"]) == ("step-00000002", 2)
    assert lines[0].startswith(f"resume: checkpoints/step-00000003/{want}"), lines


def _resave_trainer(state, edit) -> None:
    import io

    trainer = torch.load(state / "trainer.pt", weights_only=True)
    edit(trainer)
    buf = io.BytesIO()
    torch.save(trainer, buf)
    _rewrite(state, "trainer.pt", buf.getvalue())


@pytest.mark.parametrize("edit, want", [
    (lambda t: t["rng"][0].update(python="x"), r"trainer\.pt: refused as a resume state: "
     r"rng\[0\]: not a generator state \("),
    (lambda t: t["optimizer"].update(param_groups="x"), r"trainer\.pt: refused as a resume "
     r"state: optimizer: "),
    (lambda t: t.update(scheduler={"last_epoch": "x", "_step_count": []}), r"trainer\.pt: "
     r"refused as a resume state: scheduler: "),
    (None, r"model\.safetensors: not a readable safetensors file \("),
])
def test_state_contents_of_the_wrong_shape_are_refused_in_one_line(tmp_path, edit, want):
    """Plain values pass the weights-only unpickler and a destination's writer updates the
    marker: the contents are checked before use, one line naming the file, nothing half-set."""
    _save(tmp_path, [3])
    state = RunLayout(tmp_path).state_dir(3)
    if edit is None:
        _rewrite(state, "model.safetensors", b"\x10\0\0\0\0\0\0\0{not json here!}")
    else:
        _resave_trainer(state, edit)
    assert ckpt.verify_state(state) is None  # the marker matches: only the contents are wrong
    import random
    before = random.getstate()
    model, opt, sched = tiny_trainer()[1:]
    with pytest.raises(StoreError) as e:
        ckpt.load(state, model, opt, sched)
    assert __import__("re").search(want, str(e.value)) and "\n" not in str(e.value), e.value
    assert random.getstate() == before  # a refused RNG state left the generators as they were
