"""The run directory's resume-state format, read the same way by train and sync: a linked
state never counts, and a marker of another format version is refused by both."""

from __future__ import annotations

import json

import pytest

from aleph.errors import StoreError
from aleph.record.layout import RunLayout, step_name, step_of
from aleph.sync.select import HashCache, resume_state
from aleph.train import checkpoint as ckpt
from tests.train.conftest import tiny_trainer


def _save(run_dir, step):
    model, opt, sched = tiny_trainer()[1:]
    ckpt.save(run_dir, model, opt, sched, ckpt.Position(step, 0, step, step * 4, 1.0),
              [ckpt.rng_state()], "h", keep=3)


def test_step_names():
    assert step_name(7) == "step-00000007" and step_of("step-00000007") == 7
    assert step_of("step-7") is None and step_of("step-00000007.corrupt-x") is None


def test_a_linked_state_counts_for_neither_train_nor_sync(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    _save(run, 3)
    _save(elsewhere, 6)
    RunLayout(run).state_dir(6).symlink_to(RunLayout(elsewhere).state_dir(6),
                                           target_is_directory=True)
    assert [p.name for p in RunLayout(run).complete_states()] == ["step-00000003"]
    step, items = resume_state(run, HashCache(run))
    assert step == 3 and not [i.rel for i in items if "step-00000006" in i.rel]
    assert ckpt.find_resume(run, print)[0].name == "step-00000003"
    # a real directory whose COMPLETE is a link does not count either
    state = RunLayout(run).state_dir(9)
    state.mkdir()
    (state / "COMPLETE").symlink_to(RunLayout(run).state_dir(3) / "COMPLETE")
    assert [p.name for p in RunLayout(run).complete_states()] == ["step-00000003"]


def test_a_marker_of_another_version_is_refused_by_sync_too(tmp_path):
    _save(tmp_path, 3)
    marker = RunLayout(tmp_path).state_dir(3) / "COMPLETE"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "format_version": 2}))
    with pytest.raises(StoreError, match=r"COMPLETE: format_version 2, expected 1 \("):
        resume_state(tmp_path, HashCache(tmp_path))
