"""Fault injection into what a run resumes from, with real `python -m aleph train` subprocesses:
corrupt resume states fall back (then start fresh, loudly), pruning survives kills, and
changed inputs are refused unless explicitly allowed."""

from __future__ import annotations

import json
import re
import shutil
import signal
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

from aleph._io import sha256_file
from aleph.errors import EXIT_STOPPED
from tests.train.conftest import (
    REPO,
    child_env,
    kill_at_fault,
    run_train,
    smoke_dir,
    start_train,
    train_cmd,
    wait_for_log,
)

ARM, SEED = "a1_anchored", 5
# 32 steps per epoch; states at 20 and 40, then 4 more steps: a resume from the older state
# crosses an epoch boundary (step 32). dropout > 0: the resumed run matches only if every
# RNG state came back from the state it fell back to.
OLDER, NEWEST, LAST = 20, 40, 44
SETS = ("epochs=4", f"max_steps={LAST}", f"ckpt_every_steps={OLDER}", "dropout=0.1")
STATE = "checkpoints/step-{:08d}"
pytestmark = pytest.mark.slow  # a dozen trainer subprocesses (~1.5 min): -m 'not slow' skips


def _final_sha(run_dir: Path) -> str:
    return sha256_file(run_dir / "weights" / "final" / "model.safetensors")


@pytest.fixture(scope="module")
def _module_runs(tmp_path_factory, smoke_data_dir) -> tuple[str, Path]:
    """The launches of both fixtures below, started together (two work roots, nothing
    shared): (sha256 of the final weights of an uninterrupted run of the same config, a
    work root whose run was SIGKILLed right after its step-NEWEST state (states OLDER,
    NEWEST))."""
    ref_work = tmp_path_factory.mktemp(f"{ARM}-s{SEED}") / "work"
    shutil.copytree(smoke_data_dir, smoke_dir(ref_work))
    work = tmp_path_factory.mktemp("killed-at-newest") / "work"
    shutil.copytree(smoke_data_dir, smoke_dir(work))
    with open(ref_work.parent / "console.txt", "w+") as console:  # a file: no pipe to drain
        ref = subprocess.Popen(train_cmd(ARM, SEED, *SETS), cwd=REPO, env=child_env(ref_work),
                               stdout=console, stderr=subprocess.STDOUT, text=True)
        try:
            run_dir = work / "runs" / "smoke" / f"{ARM}-s{SEED}"
            proc = start_train(work, train_cmd(ARM, SEED, *SETS),
                               ALEPH_TRAIN_PAUSE_AFTER_STEP=str(NEWEST))
            wait_for_log(run_dir, f"paused after step {NEWEST}", proc)
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(30) == -signal.SIGKILL
            rc = ref.wait(240)
            console.seek(0)
            assert rc == 0, console.read()
        finally:
            ref.kill()  # a no-op once it has ended
            ref.wait()
    return _final_sha(ref_work / "runs" / "smoke" / f"{ARM}-s{SEED}"), work


@pytest.fixture(scope="module")
def reference_sha(_module_runs) -> str:
    """sha256 of the final weights of an uninterrupted run of the same config."""
    return _module_runs[0]


@pytest.fixture(scope="module")
def killed_at_newest(_module_runs) -> Path:
    """A work root whose run was SIGKILLed right after its step-NEWEST state (states OLDER,
    NEWEST)."""
    return _module_runs[1]


def _copy(work: Path, tmp_path: Path) -> tuple[Path, Path]:
    mine = tmp_path / "work"
    shutil.copytree(work, mine, symlinks=True)
    return mine, mine / "runs" / "smoke" / f"{ARM}-s{SEED}"


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


def _safetensors_data_middle(path: Path) -> int:
    """A byte offset inside the tensor data (past the JSON header) of a safetensors file."""
    with open(path, "rb") as f:
        header = struct.unpack("<Q", f.read(8))[0]
    return (8 + header + path.stat().st_size) // 2


def _zip_record_middle(path: Path) -> int:
    """A byte offset inside the largest tensor record of a torch.save zip (the Adam moments)."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
    return info.header_offset + 30 + name_len + extra_len + info.file_size // 2


@pytest.mark.parametrize("fault", ["truncate model.safetensors", "flip model.safetensors",
                                   "flip trainer.pt"])
def test_corrupt_newest_state_resumes_from_the_previous_one_bitwise(tmp_path, killed_at_newest,
                                                                     reference_sha, fault):
    work, run_dir = _copy(killed_at_newest, tmp_path)
    kind, name = fault.split()
    target = run_dir / STATE.format(NEWEST) / name
    if kind == "truncate":
        with open(target, "r+b") as f:
            f.truncate(target.stat().st_size // 2)
    else:
        offset = (_safetensors_data_middle(target) if name.endswith(".safetensors")
                  else _zip_record_middle(target))
        _flip(target, offset)
    damaged = target.read_bytes()

    proc = run_train(work, train_cmd(ARM, SEED, *SETS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = [line for line in proc.stdout.splitlines() if "set aside as" in line]
    assert len(said) == 1, proc.stdout
    why = (r"[\d,]+ B, the COMPLETE marker records [\d,]+ B \(truncated or overwritten\)"
           if kind == "truncate" else r"sha256 [0-9a-f]{16}\.\.\., the COMPLETE marker records "
           r"[0-9a-f]{16}\.\.\. \(contents changed after the save\)")
    assert re.search(rf"resume: {STATE.format(NEWEST)}/{re.escape(name)}: {why}; set aside as "
                     rf"{STATE.format(NEWEST)}\.corrupt-\d{{8}}T\d{{6}}Z \(kept for inspection, no "
                     r"longer a resume state\); trying the previous state$", said[0]), said[0]
    assert f"resume: step {OLDER}, samples seen {OLDER * 32}, from {STATE.format(OLDER)}" \
        in proc.stdout
    assert "FRESH START" not in proc.stdout
    # bitwise the uninterrupted run's final weights
    assert _final_sha(run_dir) == reference_sha
    # the corrupt state is kept, as it was, and no longer counts
    [aside] = (run_dir / "checkpoints").glob(f"step-{NEWEST:08d}.corrupt-*")
    assert (aside / name).read_bytes() == damaged
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        f"step-{NEWEST:08d}", aside.name, f"step-{LAST:08d}"]


def test_no_intact_state_starts_fresh_with_a_loud_line(tmp_path, killed_at_newest, reference_sha):
    """A deleted file in the newest state and a flipped bit in the one before: both are set
    aside with one line each, and the launch starts over from step 0 saying so."""
    work, run_dir = _copy(killed_at_newest, tmp_path)
    (run_dir / STATE.format(NEWEST) / "trainer.pt").unlink()
    model_older = run_dir / STATE.format(OLDER) / "model.safetensors"
    _flip(model_older, _safetensors_data_middle(model_older))

    proc = run_train(work, train_cmd(ARM, SEED, *SETS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"resume: {STATE.format(NEWEST)}/trainer.pt: missing (the COMPLETE marker lists it); " \
           f"set aside as {STATE.format(NEWEST)}.corrupt-" in out
    assert f"resume: {STATE.format(OLDER)}/model.safetensors: sha256 " in out
    loud = [line for line in out.splitlines() if "FRESH START" in line]
    assert len(loud) == 1 and re.search(
        r"resume: WARNING: FRESH START from step 0: none of the 2 complete resume state\(s\) is "
        rf"intact \(set aside: step-{NEWEST:08d}\.corrupt-\S+, step-{OLDER:08d}\.corrupt-\S+\); the "
        r"run's earlier training is not carried over$", loud[0]), loud[0]
    assert "resume: step" not in out
    assert _final_sha(run_dir) == reference_sha  # a fresh start of a deterministic config
    assert len(list((run_dir / "checkpoints").glob("*.corrupt-*"))) == 2


def test_pruning_leaves_at_most_keep_states_after_kills(train_work):
    """Killed right before and right after a new state's marker: never more than
    keep_checkpoints complete states; a lowered keep_checkpoints is applied at startup."""
    run_dir = train_work / "runs" / "smoke" / "a2_dense-s8"

    def complete():
        return sorted(p.parent.name for p in (run_dir / "checkpoints").glob("*/COMPLETE")
                      if ".corrupt-" not in p.parent.name)

    sets = ("max_steps=8", "ckpt_every_steps=1")
    kill_at_fault(train_work, train_cmd("a2_dense", 8, *sets, "keep_checkpoints=2"), "before-complete:3")
    assert complete() == ["step-00000002"]  # step-1 pruned, step-3 not yet marked
    assert (run_dir / STATE.format(3)).is_dir()

    second = kill_at_fault(train_work, train_cmd("a2_dense", 8, *sets, "keep_checkpoints=3"),
                           "after-complete:6")
    assert "removed incomplete resume state(s) of a killed save: step-00000003" in second
    assert "resume: step 2, samples seen 64" in second
    assert complete() == ["step-00000004", "step-00000005", "step-00000006"]

    third = run_train(train_work, train_cmd("a2_dense", 8, *sets, "keep_checkpoints=2"))
    assert third.returncode == 0, third.stdout + third.stderr
    assert "pruned resume state(s) beyond keep_checkpoints=2 (left by an earlier launch): " \
           "step-00000004" in third.stdout
    assert "resume: step 6, samples seen 192" in third.stdout
    assert complete() == ["step-00000007", "step-00000008"]


def _inputs_copy(work: Path) -> tuple[Path, tuple[str, ...]]:
    """The smoke data as plain paths (smoke_data=false), so a chunk can be edited."""
    src, data = smoke_dir(work), work / "inputs"
    shutil.copytree(src, data)
    return data, ("smoke_data=false", f"captions={data / 'captions.txt'}",
                  f"targets={data / 'targets'}", f"tokenizer={data / 'tokenizer'}",
                  "max_steps=6", "ckpt_every_steps=3")


def test_changed_target_chunk_is_refused_naming_both_hashes_unless_allowed(train_work):
    run_dir = train_work / "runs" / "smoke" / "a2_dense-s9"
    data, sets = _inputs_copy(train_work)
    proc = start_train(train_work, train_cmd("a2_dense", 9, *sets),
                       ALEPH_TRAIN_PAUSE_AFTER_STEP="3")
    wait_for_log(run_dir, "paused after step 3", proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == EXIT_STOPPED
    manifest = json.loads((run_dir / "manifest.json").read_text())
    trained = manifest["launches"][0]["inputs"]["target_store"]["content_sha256"]
    assert manifest["target_store"]["content_sha256"] == trained

    chunk = sorted((data / "targets").glob("*.pt"))[0]
    t = torch.load(chunk, weights_only=True)
    t[0] = -t[0]  # one target row changed between launches (new mtime, same size)
    torch.save(t, chunk)

    refused = run_train(train_work, train_cmd("a2_dense", 9, *sets))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    [err] = refused.stderr.strip().splitlines()
    m = re.fullmatch(
        r"aleph train: error: inputs changed since this run last trained \(launch \S+\): target "
        rf"store content sha256 {trained} \(trained on\) -> ([0-9a-f]{{64}}) \(this launch, "
        r"(\S+)\); refused: resuming would continue the run on other data\. Restore the original "
        r"captions/targets, or relaunch with --set allow_input_change=true to continue on the new "
        r"ones \(recorded in manifest\.json and the launch log\)", err)
    assert m, err
    changed, store_dir = m.groups()
    assert changed != trained
    from aleph.targets import open_store

    assert open_store(store_dir).content_sha256 == changed  # the hash names the new store
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [(x["status"], x["exit_status"]) for x in manifest["launches"]] == [
        ("stopped", EXIT_STOPPED), ("failed", 2)]
    assert "inputs" not in manifest["launches"][1]
    assert manifest["target_store"]["content_sha256"] == trained  # not overwritten

    allowed = run_train(train_work, train_cmd("a2_dense", 9, *sets, "allow_input_change=true"))
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "resume: step 3" in allowed.stdout
    line = next(x for x in allowed.stdout.splitlines() if "ALLOWED by allow_input_change=true" in x)
    assert f"target store content sha256 {trained} (trained on) -> {changed}" in line
    manifest = json.loads((run_dir / "manifest.json").read_text())
    first, _, third = manifest["launches"]
    assert first["inputs"]["target_store"]["content_sha256"] == trained  # still on record
    assert third["inputs"]["target_store"]["content_sha256"] == changed
    assert third["input_change_allowed"]["by"] == "allow_input_change=true"
    assert [(c["store"], c["trained_on"], c["now"]) for c in
            third["input_change_allowed"]["changes"]] == [("target_store", trained, changed)]
    log = (run_dir / third["log"]).read_text()
    assert "ALLOWED by allow_input_change=true" in log
