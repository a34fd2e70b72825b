"""Resume: SIGKILL mid-run and SIGTERM both resume to bitwise the same weights as a clean run."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from aleph.errors import EXIT_STOPPED
from tests.train.conftest import (
    REPO,
    child_env,
    final_weights,
    in_background,
    run_train,
    smoke_dir,
    start_train,
    tb_scalars,
    train_cmd,
    wait_for_log,
)

# 12 steps, resume state every 3: a kill after step 5 loses steps 4-5, which are redone.
# dropout > 0: the resumed run matches only if every RNG state (dropout masks) is restored.
SETS = ("max_steps=12", "ckpt_every_steps=3", "dropout=0.1")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, smoke_data_dir):
    """An uninterrupted run of the same config, in its own work root (nothing shared), started
    here and left to train beside the first test's launches; calling the fixture's value waits
    for it and gives (final weights, TensorBoard scalars)."""
    work = tmp_path_factory.mktemp("a1_anchored-s3") / "work"
    shutil.copytree(smoke_data_dir, smoke_dir(work))
    got: list[tuple[dict, dict]] = []
    with in_background(train_cmd("a1_anchored", 3, *SETS), REPO, child_env(work),
                       work.parent / "console.txt", timeout=240) as wait:

        def result() -> tuple[dict, dict]:
            if not got:
                wait()
                run_dir = work / "runs" / "smoke" / "a1_anchored-s3"
                got.append((final_weights(run_dir), tb_scalars(run_dir)))
            return got[0]

        yield result


def _assert_bitwise(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"tensor {k} differs after resume"


def test_sigkill_then_resume_is_bitwise_identical(train_work, reference):
    run_dir = train_work / "runs" / "smoke" / "a1_anchored-s3"
    proc = start_train(train_work, train_cmd("a1_anchored", 3, *SETS), ALEPH_TRAIN_PAUSE_AFTER_STEP="5")
    wait_for_log(run_dir, "paused after step 5", proc)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    assert not (run_dir / "weights" / "final").exists()

    again = run_train(train_work, train_cmd("a1_anchored", 3, *SETS))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resume: step 3, samples seen 96, from checkpoints/step-00000003" in again.stdout
    ref_weights, ref_scalars = reference()
    _assert_bitwise(final_weights(run_dir), ref_weights)

    manifest = json.loads((run_dir / "manifest.json").read_text())
    statuses = [(x["status"], x["exit_status"]) for x in manifest["launches"]]
    assert statuses == [("lost", None), ("complete", 0)]
    assert len(list((run_dir / "launches").glob("*.log"))) == 2
    # TensorBoard drops the killed launch's steps 4-5 (purge_step) and keeps one value per step.
    losses = tb_scalars(run_dir)["train/loss"]
    assert [s for s, _ in losses] == list(range(1, 13))
    ref = dict(ref_scalars["train/loss"])
    assert all(v == ref[s] for s, v in losses)


def test_sigterms_save_at_that_step_exit_76_and_resume(train_work, reference):
    """Slurm's time limit: SIGTERM from slurmstepd, again from srun (CLUSTER-FACTS.md), and
    torchrun forwards more; here twenty, 30 ms apart, so later ones land during the save.
    One stop: the state is saved, the launch recorded stopped, the resume bitwise exact."""
    run_dir = train_work / "runs" / "smoke" / "a1_anchored-s3"
    proc = start_train(train_work, train_cmd("a1_anchored", 3, *SETS), ALEPH_TRAIN_PAUSE_AFTER_STEP="4")
    log = wait_for_log(run_dir, "paused after step 4", proc)
    for _ in range(20):
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.03)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_STOPPED, out
    assert "stopped by SIGTERM after step 4" in out
    # the prefetcher held step 5's batch when the stop came; it is dropped, and the resumed
    # launch below trains on batches 5..12, none twice, none skipped (bitwise final weights)
    assert "after step 4 (ALEPH_TRAIN_PAUSE_AFTER_STEP); batch gathered ahead: epoch 0 batch 4" \
        in log.read_text()
    state = run_dir / "checkpoints" / "step-00000004"
    assert (state / "COMPLETE").is_file()
    meta = json.loads((state / "meta.json").read_text())
    assert (meta["step"], meta["samples_seen"], meta["epoch"], meta["batch_in_epoch"]) == (4, 128, 0, 4)
    launch = json.loads((run_dir / "manifest.json").read_text())["launches"][-1]
    assert (launch["status"], launch["exit_status"]) == ("stopped", EXIT_STOPPED)

    again = run_train(train_work, train_cmd("a1_anchored", 3, *SETS))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resume: step 4, samples seen 128" in again.stdout
    _assert_bitwise(final_weights(run_dir), reference()[0])
    # keep at least two complete states; the newest is the final step
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert kept == ["step-00000009", "step-00000012"]


def test_changed_config_is_refused_without_touching_the_run(train_work):
    run_dir = train_work / "runs" / "smoke" / "a2_dense-s1"
    first = run_train(train_work, train_cmd("a2_dense", 1, "max_steps=2"))
    assert first.returncode == 0, first.stderr
    before = (run_dir / "config.json").read_bytes()
    second = run_train(train_work, train_cmd("a2_dense", 1, "max_steps=2", "lr=0.01"))
    assert second.returncode == 2
    assert "lr: run has 0.002, launch asks 0.01" in second.stderr
    assert (run_dir / "config.json").read_bytes() == before
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [x["status"] for x in manifest["launches"]] == ["complete"]


def test_config_may_change_until_something_was_trained(train_work, tmp_path, smoke_data_dir):
    run_dir = train_work / "runs" / "smoke" / "a2_dense-s4"
    # The refused launch runs in a fresh work root of its own (nothing shared), beside the
    # first launch below: a launch is one busy core, and it must leave no run directory.
    fresh = tmp_path / "fresh"
    shutil.copytree(smoke_data_dir, smoke_dir(fresh))
    bad = subprocess.Popen(train_cmd("a2_dense", 4, "max_steps=2", "batch_size=2048"), cwd=REPO,
                           env=child_env(fresh), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    # a first launch that is on record but trains nothing: stopped before its first step
    first = start_train(train_work, train_cmd("a2_dense", 4, "max_steps=2", "batch_size=64"),
                        ALEPH_TRAIN_PAUSE_IN_PREFLIGHT="model")
    _, err = bad.communicate(timeout=240)
    assert bad.returncode == 2 and "'batch_size': 2048 exceeds the 1024 rows" in err, err
    assert not (fresh / "runs" / "smoke" / "a2_dense-s4").exists()  # refused before the run directory: no trace
    wait_for_log(run_dir, "paused in preflight before model", first)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=120) == EXIT_STOPPED
    launch = json.loads((run_dir / "manifest.json").read_text())["launches"][0]
    assert launch["status"] == "stopped" and not (run_dir / "checkpoints").exists()
    assert json.loads((run_dir / "config.json").read_text())["batch_size"] == 64
    good = run_train(train_work, train_cmd("a2_dense", 4, "max_steps=2"))
    assert good.returncode == 0, good.stderr
    assert "config replaced (no resume state yet, nothing trained)" in good.stdout
    assert json.loads((run_dir / "config.json").read_text())["batch_size"] == 32


OVERRIDES = ("max_steps=6", "lr=0.001")


@pytest.fixture(scope="module")
def stopped_after_2(tmp_path_factory, smoke_data_dir) -> Path:
    """A work root whose run a2_dense-s5, made with OVERRIDES, was stopped (SIGTERM) after
    step 2; the two tests below each relaunch it in a copy of their own, never here."""
    work = tmp_path_factory.mktemp("stopped-after-2") / "work"
    shutil.copytree(smoke_data_dir, smoke_dir(work))
    proc = start_train(work, train_cmd("a2_dense", 5, *OVERRIDES),
                       ALEPH_TRAIN_PAUSE_AFTER_STEP="2")
    wait_for_log(work / "runs" / "smoke" / "a2_dense-s5", "paused after step 2", proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_STOPPED, out[-3000:]
    return work


def _copy_of(work: Path, tmp_path: Path) -> Path:
    mine = tmp_path / "work"
    shutil.copytree(work, mine, symlinks=True)
    return mine


def test_a_relaunch_with_only_arm_seed_preset_resumes_with_the_recorded_config(stopped_after_2,
                                                                               tmp_path):
    """Issue 35: a run made with overrides, relaunched with no field given, continues as it was
    made (not a refusal of the preset's values), its config.json untouched."""
    import sys

    train_work = _copy_of(stopped_after_2, tmp_path)
    run_dir = train_work / "runs" / "smoke" / "a2_dense-s5"
    before = (run_dir / "config.json").read_bytes()
    bare = [sys.executable, "-m", "aleph", "train", "--arm", "a2_dense", "--seed", "5",
            "--preset", "smoke"]
    again = run_train(train_work, bare)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr
    assert "no field given: run smoke/a2_dense-s5 continues with its recorded config" in again.stdout
    assert "resume: step 2" in again.stdout and "complete (step 6 of 6)" in again.stdout
    assert (run_dir / "config.json").read_bytes() == before


def test_a_run_recorded_with_a_retired_field_resumes_and_compares_as_before(stopped_after_2,
                                                                            tmp_path):
    """A config.json written before defer_step_sync was removed (issue 34) still resumes, given
    its fields or none, and `runs diff` calls the field info, not a blocker; naming it on the
    command line is refused like any unknown field."""
    import sys

    from aleph.report.diff import RunDiff, compare_config

    train_work = _copy_of(stopped_after_2, tmp_path)
    run_dir = train_work / "runs" / "smoke" / "a2_dense-s5"
    sets = OVERRIDES
    # refused at the command line, before any run is read: it runs while the config is edited
    refused = subprocess.Popen(train_cmd("a2_dense", 5, *sets, "defer_step_sync=true"), cwd=REPO,
                               env=child_env(train_work), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    config = run_dir / "config.json"
    now = json.loads(config.read_text())
    config.write_text(json.dumps({**now, "defer_step_sync": True}, indent=2, sort_keys=True))
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == 2 and "unknown config field(s) defer_step_sync" in err
    again = run_train(train_work, train_cmd("a2_dense", 5, *sets))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr
    assert "resume: step 2" in again.stdout and "complete (step 6 of 6)" in again.stdout
    bare = run_train(train_work, [sys.executable, "-m", "aleph", "train", "--arm", "a2_dense",
                                  "--seed", "5", "--preset", "smoke"])
    assert bare.returncode == 0, bare.stdout[-3000:] + bare.stderr
    assert "continues with its recorded config" in bare.stdout
    d = RunDiff("A", "B")
    compare_config(d, {**now, "defer_step_sync": True}, now)
    assert [(f.level, f.text) for f in d.findings if f.section == "config"] == [
        ("info", "defer_step_sync: True vs 'absent' (a field since removed; it changed nothing "
                 "computed)")], d.findings
