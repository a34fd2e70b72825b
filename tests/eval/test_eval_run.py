"""`aleph eval` end to end on fabricated run directories holding real tiny models."""

import shutil
from pathlib import Path

import pytest
from fixtures.runs import make_run, read

from aleph._io import sha256_file
from aleph.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sts"


def _eval(run, *extra):
    rc = main(["eval", str(run), "--tasks", "smoke,tiny", "--tasks-dir", str(FIXTURES),
               "--probe-rows", "512", "--probe-batch", "64", *extra])
    assert rc == 0
    return read(run / "eval.json")


def _tb_scalars(tb_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_trained_beats_untrained_and_every_field_is_recorded(tmp_path, work, capsys):
    trained = _eval(make_run(tmp_path / "t", "a1_anchored", seed=0, steps=80))
    untrained = _eval(make_run(tmp_path / "u", "a1_anchored", seed=0, steps=0))
    out = capsys.readouterr().out
    assert "| run | mean | dispatch OFF | toggle |" in out and "eval.json" in out

    # the smoke-trained model orders the smoke STS pairs far better than its init
    assert trained["tasks"]["smoke"]["spearman"] > untrained["tasks"]["smoke"]["spearman"] + 0.3
    assert trained["capability"] > untrained["capability"] + 0.2
    assert trained["capability"] == pytest.approx(
        (trained["tasks"]["smoke"]["spearman"] + trained["tasks"]["tiny"]["spearman"]) / 2)
    # toggle = off - on; the experts start at zero, so untrained dispatch changes nothing
    assert trained["toggle"] == pytest.approx(trained["capability_dispatch_off"] - trained["capability"])
    assert untrained["toggle"] == pytest.approx(0.0, abs=1e-9)
    assert trained["toggle"] != pytest.approx(0.0, abs=1e-6)

    p, q = trained["probes"], untrained["probes"]
    assert p["r_at_1_batch_size"] == 64 and p["rows"] == 512 and p["rows_scored_r_at_1"] == 512
    assert p["r_at_1"] > q["r_at_1"] and p["cos_target"] > q["cos_target"] + 0.2
    assert 1.0 < p["erank"] <= 768 and p["dim"] == 768
    assert "held-out seed" in p["source"]

    run = tmp_path / "t" / "a1_anchored-s0"
    assert trained["weights"]["sha256"] == sha256_file(run / "weights/final/model.safetensors")
    assert trained["weights"]["step"] == 80
    # same tasks and probe rows -> same evaluation-data fingerprint, different weights
    assert trained["eval_data_fingerprint"] == untrained["eval_data_fingerprint"]
    assert trained["weights"]["sha256"] != untrained["weights"]["sha256"]
    assert trained["tasks"]["tiny"]["pairs"] == 12 and trained["tasks"]["tiny"]["source"] == "file:tiny.tsv"

    scalars = _tb_scalars(run / "tb")
    assert scalars["eval/capability"] == [pytest.approx(trained["capability"])]
    assert scalars["eval/toggle"] == [pytest.approx(trained["toggle"])]
    assert scalars["eval/r_at_1_b64"] == [pytest.approx(p["r_at_1"])]
    assert {"eval/sts/smoke", "eval/sts/tiny", "eval/erank", "eval/cos_target", "train/loss"} <= set(scalars)


def test_dense_arm_has_no_dispatch_column(tmp_path, work):
    run = make_run(tmp_path, "a2_dense", seed=0, steps=0)
    shutil.copytree(run / "weights" / "final", run / "weights" / "step-00000040")
    ev = _eval(run, "--no-probes", "--weights", str(run / "weights" / "step-00000040"))
    assert ev["weights"]["step"] == 40 and ev["weights"]["path"] == "weights/step-00000040/model.safetensors"
    assert set(ev["tasks"]) == {"smoke", "tiny"}
    assert ev["has_bank"] is False and ev["toggle"] is None and ev["capability_dispatch_off"] is None
    assert ev["probes"] is None
    assert ev["tasks"]["smoke"]["spearman_dispatch_off"] is None


def test_eval_errors_name_what_is_wrong(tmp_path, work, capsys):
    assert main(["eval", str(tmp_path / "nope")]) == 2
    assert "nope: not a run directory" in capsys.readouterr().err
    run = make_run(tmp_path, "a2_dense", seed=0, steps=0, train_scalars=False)
    assert main(["eval", str(run), "--tasks", "sts99"]) == 2
    assert "unknown STS task 'sts99'" in capsys.readouterr().err
    (run / "config.json").write_text("{not json")
    assert main(["eval", str(run), "--tasks", "smoke"]) == 2
    assert "config.json: not valid JSON" in capsys.readouterr().err
    assert not (run / "eval.json").exists()


def test_a_collapsed_model_is_an_error_naming_the_task(tmp_path, work, capsys):
    import torch
    from fixtures.runs import tiny_config

    from aleph.model import build_model
    from aleph.model.io import save_weights

    run = make_run(tmp_path, "a2_dense", seed=0, steps=0, train_scalars=False)
    model = build_model(tiny_config("a2_dense", 1024))
    with torch.no_grad():  # every embedding becomes the same vector: all cosines equal
        model.proj.weight.zero_()
        model.proj.bias.fill_(1.0)
    save_weights(model, run / "weights" / "final")
    assert main(["eval", str(run), "--tasks", "tiny", "--tasks-dir", str(FIXTURES)]) == 2
    assert "STS task 'tiny' (file:tiny.tsv): correlation undefined" in capsys.readouterr().err


def _tb_steps(tb_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def test_eval_prints_progress_and_reruns_add_no_duplicate_points(tmp_path, work, capsys):
    run = make_run(tmp_path, "a1_anchored", seed=0, steps=0, train_scalars=False)
    _eval(run, "--no-probes")
    out = capsys.readouterr().out
    assert f"evaluating {run} " in out
    assert "dispatch on: task 1/2 smoke: 256 pairs, Spearman" in out
    assert "dispatch off: task 2/2 tiny: 12 pairs, Spearman" in out
    _eval(run, "--no-probes")  # the same step again: its points are replaced, not added
    assert _tb_steps(run / "tb", "eval/capability") == [0]
    step = run / "weights" / "step-00000040"
    shutil.copytree(run / "weights" / "final", step)
    _eval(run, "--no-probes", "--weights", str(step))  # another step: a second point
    _eval(run, "--no-probes", "--weights", str(step))
    assert sorted(_tb_steps(run / "tb", "eval/capability")) == [0, 40]
    assert len(list((run / "tb").glob("*.aleph-eval-step40"))) == 1
    assert not [p for p in (run / "tb").iterdir() if p.is_dir()]  # no temporary directory left


def test_eval_of_an_incomplete_run_says_how_to_go_on(tmp_path, work, capsys):
    run = make_run(tmp_path, "a2_dense", seed=3, steps=0, train_scalars=False, launches=[
        {"launch_id": "20261130T010000Z-test-9", "start": "2026-11-30T01:00:00Z", "status": "stopped",
         "exit_status": 0, "steps": {"from": 0, "to": 64}}])
    shutil.move(run / "weights" / "final", run / "weights" / "step-00000064")
    assert main(["eval", str(run), "--tasks", "tiny", "--tasks-dir", str(FIXTURES)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "training is incomplete (last launch 20261130T010000Z-test-9 stopped at step 0" in err
    assert "`aleph train --arm a2_dense --seed 3 --preset smoke" in err
    assert f"--weights {run / 'weights' / 'step-00000064'}`" in err
    assert not (run / "eval.json").exists()
    # the command it names works
    rc = main(["eval", str(run), "--tasks", "tiny", "--tasks-dir", str(FIXTURES), "--no-probes",
               "--weights", str(run / "weights" / "step-00000064")])
    assert rc == 0 and read(run / "eval.json")["weights"]["step"] == 64
