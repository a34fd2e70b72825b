"""A resume state is data, never code: trainer.pt loads through torch's weights-only
unpickler, so a pulled run whose newest state holds a pickled callable (with its COMPLETE
marker rewritten to match, as whoever writes a shared destination can) is refused in one
line and the payload never runs; a state of the earlier format (a numpy array in the RNG
state) is refused in one line too: no global beyond torch's own is ever allowed."""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil

import numpy as np
import pytest
import torch

from aleph._io import sha256_file
from aleph.errors import StoreError
from aleph.record.layout import RunLayout
from aleph.train import checkpoint as ckpt
from tests.train.conftest import completed_run, run_train, smoke_dir, tiny_trainer, train_cmd


class _Payload:
    """Pickles as a call to os.system: what an attacker puts into trainer.pt."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _rewrite_marker(state):
    """Make COMPLETE match the files again, as the writer of a destination can."""
    marker = json.loads((state / "COMPLETE").read_text())
    for name in marker["files"]:
        marker["files"][name] = {"sha256": sha256_file(state / name),
                                 "size": (state / name).stat().st_size}
    (state / "COMPLETE").write_text(json.dumps(marker))


def _plant(state, marker):
    trainer = torch.load(state / "trainer.pt", weights_only=True)
    trainer["rng"][0]["evil"] = _Payload(marker)
    torch.save(trainer, state / "trainer.pt")
    _rewrite_marker(state)
    assert ckpt.verify_state(state) is None  # every checksum passes


def _save(run_dir, step=3):
    model, opt, sched = tiny_trainer()[1:]
    ckpt.save(run_dir, model, opt, sched, ckpt.Position(step, 0, step, step * 4, 1.0),
              [ckpt.rng_state()], "h", keep=3)
    return RunLayout(run_dir).state_dir(step), (model, opt, sched)


def test_a_state_of_this_trainer_loads_weights_only(tmp_path):
    state, _ = _save(tmp_path)
    torch.load(state / "trainer.pt", weights_only=True)  # no global beyond torch's own
    ckpt.load_trainer_state(state)
    # round trip: the restored numpy stream continues exactly where the saved one stood
    np.random.seed(5)
    random.seed(5)
    saved = ckpt.rng_state()
    want = (np.random.rand(3), random.random(), torch.rand(2))
    ckpt.set_rng_state(saved)
    got = (np.random.rand(3), random.random(), torch.rand(2))
    assert (want[0] == got[0]).all() and want[1] == got[1] and torch.equal(want[2], got[2])


def test_a_pickled_callable_is_refused_in_one_line_and_never_runs(tmp_path):
    state, (model, opt, sched) = _save(tmp_path)
    marker = tmp_path / "PWNED"
    _plant(state, marker)
    with pytest.raises(StoreError) as err:
        ckpt.load(state, model, opt, sched)
    msg = str(err.value)
    assert "\n" not in msg and f"{state}/trainer.pt: refused as a resume state" in msg, msg
    assert "posix.system" in msg or "system" in msg, msg
    assert not marker.exists()


def test_a_state_of_the_earlier_format_is_refused_in_one_line(tmp_path):
    state, (model, opt, sched) = _save(tmp_path)
    trainer = torch.load(state / "trainer.pt", weights_only=True)
    trainer["rng"][0]["numpy"] = np.random.get_state()  # how earlier trainers saved it
    torch.save(trainer, state / "trainer.pt")
    _rewrite_marker(state)
    with pytest.raises(pickle.UnpicklingError):  # it really needs the numpy globals
        torch.load(state / "trainer.pt", weights_only=True)
    with pytest.raises(StoreError) as err:
        ckpt.load(state, model, opt, sched)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{state}/trainer.pt: refused as a resume state: "
                                              "Unsupported global: GLOBAL numpy"), msg


def test_an_earlier_format_state_with_a_payload_is_refused_too(tmp_path):
    state, (model, opt, sched) = _save(tmp_path)
    marker = tmp_path / "PWNED"
    trainer = torch.load(state / "trainer.pt", weights_only=True)
    trainer["rng"][0]["numpy"] = np.random.get_state()
    trainer["rng"][0]["evil"] = _Payload(marker)
    torch.save(trainer, state / "trainer.pt")
    _rewrite_marker(state)
    with pytest.raises(StoreError, match="refused as a resume state"):
        ckpt.load(state, model, opt, sched)
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_trainer_pt_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    state, (model, opt, sched) = _save(tmp_path)
    (state / "trainer.pt").unlink()
    if kind == "fifo":
        os.mkfifo(state / "trainer.pt")
    else:
        (state / "trainer.pt").symlink_to("/dev/zero")
    with pytest.raises(StoreError, match="trainer.pt: refused as a resume state: not a regular file"):
        ckpt.load_trainer_state(state)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, smoke_data_dir):
    """One completed run for both cases below; each plants into its own copy, never here."""
    return completed_run(tmp_path_factory, smoke_data_dir, "a2_dense", 3, "ckpt_every_steps=8")


@pytest.mark.slow
@pytest.mark.parametrize("finished", [False, True], ids=["mid-run", "complete-run"])
def test_a_planted_state_does_not_run_through_aleph_train(tmp_path_factory, trained_run,
                                                           finished):
    """The whole path a pulled run takes: `aleph train` on it resumes from its newest state."""
    work = tmp_path_factory.mktemp("planted") / "work"
    shutil.copytree(trained_run.parents[2], work, symlinks=True)  # data, cache, the run
    run = work / trained_run.relative_to(trained_run.parents[2])
    if not finished:
        shutil.rmtree(run / "weights" / "final")
    [*_, newest] = RunLayout(run).complete_states()
    marker = work.parent / "PWNED"
    _plant(newest, marker)
    proc = run_train(work, train_cmd("a2_dense", 3, "ckpt_every_steps=8"))
    assert not marker.exists(), "the payload ran"
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = [ln for ln in proc.stderr.splitlines() if "refused" in ln]
    assert f"{newest.name}/trainer.pt: refused as a resume state" in line
    assert "Traceback" not in proc.stderr
    assert smoke_dir(work).is_dir()


def test_a_relaunch_removes_only_what_the_trainer_writes(tmp_path):
    """remove_incomplete: killed saves go; user folders, links and their targets stay."""
    state, _ = _save(tmp_path, step=3)
    root = state.parent
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    for name in ("best-by-hand", "step-00000128.bak", "step-00000004.old"):
        (root / name).mkdir()
        (root / name / "model.safetensors").write_bytes(b"user data")
    (root / "notes.txt").write_text("user file")
    (root / "step-00000009").symlink_to(victim)  # a link with a state's name
    (root / "step-00000005").mkdir()  # a killed save: no marker
    (root / "step-00000006.tmp-4242").mkdir()  # a killed save's temporary directory
    lines = []
    removed = ckpt.remove_incomplete(tmp_path, lines.append)
    assert removed == ["step-00000005", "step-00000006.tmp-4242"]
    for name in ("best-by-hand", "step-00000128.bak", "step-00000004.old"):
        assert (root / name / "model.safetensors").read_bytes() == b"user data"
    assert (root / "notes.txt").is_file() and (victim / "keep.txt").read_text() == "mine"
    assert (root / "step-00000009").is_symlink()
    assert lines == ["checkpoints/: left alone (not written by the trainer): best-by-hand, "
                     "notes.txt, step-00000004.old, step-00000009, step-00000128.bak"]
    # a link never counts as a state, so pruning never deletes through it
    (victim / "COMPLETE").write_text("{}")
    assert [p.name for p in RunLayout(tmp_path).complete_states()] == ["step-00000003"]
    assert ckpt.prune(tmp_path, 0) == ["step-00000003"]
    assert (victim / "keep.txt").is_file()


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_planted_run_lock_is_never_written_through(tmp_path, kind):
    from aleph.errors import DataError
    from aleph.train.identity import RunLock

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    if kind == "symlink":
        (run / "run.lock").symlink_to(victim)
    else:
        os.mkfifo(run / "run.lock")
    with pytest.raises(DataError, match="run.lock"):
        RunLock(run).acquire()
    assert victim.read_text() == "precious"
