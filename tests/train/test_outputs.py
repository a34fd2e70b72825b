"""A full tiny run: every output present, readable, and telling the truth."""

from __future__ import annotations

import json
import time

import pytest
import torch

from aleph._io import sha256_json
from tests.train.conftest import run_train, tb_scalars, train_cmd


def test_smoke_run_outputs(train_work):
    proc = run_train(train_work, train_cmd("a1_anchored", 0, "weights_every_steps=16",
                                           "log_every_steps=2", "ckpt_every_steps=10",
                                           "ckpt_every_minutes=0.00001"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = train_work / "runs" / "smoke" / "a1_anchored-s0"
    assert "ETA" in proc.stdout

    # TensorBoard, read back with TensorBoard's own reader
    scalars = tb_scalars(run)
    for tag in ("loss", "nce", "mse", "lr", "grad_norm", "samples_per_sec"):
        assert [s for s, _ in scalars[f"train/{tag}"]] == list(range(2, 33, 2)), tag
    loss = [v for _, v in scalars["train/loss"]]
    assert loss[-1] < 0.6 * loss[0], loss  # it learns
    health = {t.split("/")[1] for t in scalars if t.startswith("health/")}
    assert health == {"layer00", "layer01"}  # both blocks' banks report gauges
    lrs = [v for _, v in scalars["train/lr"]]
    assert max(lrs) == pytest.approx(2e-3) and lrs[-1] < 1e-4  # warmup then cosine to ~0

    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["step"], metrics["samples_seen"], metrics["epochs_done"]) == (32, 1024, 1.0)
    assert metrics["final"]["loss"] == loss[-1]
    assert metrics["first_loss"] > metrics["final"]["loss"]
    assert metrics["wall_time_s"] > 0 and metrics["samples_per_sec"] > 0

    manifest = json.loads((run / "manifest.json").read_text())
    assert (manifest["run_id"], manifest["arm"], manifest["seed"]) == ("a1_anchored-s0", "a1_anchored", 0)
    (launch,) = manifest["launches"]
    assert launch["exit_status"] == 0 and launch["log"].startswith("launches/")
    assert (run / launch["log"]).is_file()
    assert manifest["format_version"] == 1 and "code_revision" not in manifest
    assert len(launch["code"]["source_sha256"]) == 64 and launch["code"]["revision"]
    assert "torch" in launch["environment"] or "error" in launch["environment"]
    store = manifest["target_store"]
    store_manifest = json.loads((__import__("pathlib").Path(store["dir"]) / "manifest.json").read_text())
    assert store["manifest_sha256"] == sha256_json(store_manifest)
    assert store["implementation"] == "streaming" and store["byte_length"] == 1024 * 768 * 2

    # weights: loadable by aleph into the same model, equal to the last resume state
    from aleph.data.tokenizer import load_tokenizer
    from aleph.model.io import load_model
    from aleph.train.checkpoint import latest

    model = load_model(run / "weights" / "final")
    assert (run / "weights" / "step-00000016" / "model.safetensors").is_file()
    path, meta = latest(run)
    assert meta["step"] == 32
    # the minute cadence (due after every step here) saved at 31 as well; two are kept
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000031", "step-00000032"]
    import safetensors.torch

    state = safetensors.torch.load_file(str(path / "model.safetensors"))
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    tok = load_tokenizer(run / "tokenizer")
    ids = tok(["a red dog runs"], return_tensors="pt")
    out = model.eval()(ids["input_ids"], ids["attention_mask"].bool())
    assert out.shape == (1, 768) and torch.allclose(out.norm(dim=-1), torch.ones(1), atol=1e-5)
    assert json.loads((run / "config.json").read_text())["arm"] == "a1_anchored"


def test_a_restart_from_step_0_replaces_the_steps_of_a_launch_killed_before_any_checkpoint(tmp_path):
    """The killed launch wrote steps 1-3 but no resume state; the next starts over from step 0."""
    from aleph.train.outputs import Scalars

    killed = Scalars(tmp_path, first_step=1)
    for step in (1, 2, 3):
        killed.write(step, {"train/loss": 10.0 + step})
    killed.close()
    # Event files are read in name order, <unix second>.<host>.<pid>.<counter>: a real
    # restart is another process seconds later; here, step into the next second.
    time.sleep(1.05)
    again = Scalars(tmp_path, first_step=1)
    for step in (1, 2, 3, 4):
        again.write(step, {"train/loss": float(step)})
    again.close()
    assert tb_scalars(tmp_path)["train/loss"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]


def _check(manifest, allow: bool, now: dict, resumed: bool = True, lines=None):
    """trainer.check_inputs_unchanged of a launch resuming from step 3 (or a fresh one)."""
    from aleph.train.config import resolve
    from aleph.train.trainer import check_inputs_unchanged

    cfg = resolve("smoke", arm="a2_dense", overrides=[f"allow_input_change={str(allow).lower()}"])
    return check_inputs_unchanged(cfg, manifest, "checkpoints/step-00000003" if resumed else None,
                                  now, (lines if lines is not None else []).append, "L2")


def _now(target: str, token_key: str, token_sha: str = "t" * 64) -> dict:
    return {"target_store": {"content_sha256": target, "dir": "/cache/targets/x"},
            "token_store": {"content_sha256": token_sha, "key": token_key,
                            "dir": f"/cache/tokens/{token_key}"}}


def test_a_manifest_of_another_format_version_is_refused_in_one_line(tmp_path):
    """A manifest with only the top-level target_store (an earlier trainer's, no
    format_version) is not read: one line naming the file, and the file is left as it was."""
    from aleph.errors import StoreError
    from aleph.train.outputs import Manifest

    text = json.dumps({
        "run_id": "r", "arm": "a2_dense", "seed": 0,
        "launches": [{"launch_id": "L1", "status": "stopped"}],
        "target_store": {"content_sha256": "a" * 64, "token_store": "/old/cache/tokens/k1"}})
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(StoreError) as e:
        Manifest(tmp_path, "r", "a2_dense", 0)
    assert str(e.value) == (f"{tmp_path / 'manifest.json'}: format_version None, expected 1 "
                            "(written by another version of aleph-e1; this one reads only its own)")
    assert (tmp_path / "manifest.json").read_text() == text


@pytest.mark.parametrize("launches", [["x", 5], {"a": 1}, None])
def test_a_manifest_whose_launches_are_not_records_is_one_line(tmp_path, launches):
    """A pulled run's manifest.json is a stranger's JSON: the launch records are checked
    before a launch reads them (they were an AttributeError traceback at resume)."""
    from aleph.errors import StoreError
    from aleph.train.outputs import Manifest

    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"format_version": 1, "launches": launches}))
    with pytest.raises(StoreError) as e:
        Manifest(tmp_path, "r", "a2_dense", 0)
    assert str(e.value).startswith(f"{path}: field 'launches' is ") and str(e.value).endswith(
        "expected a list of launch records (objects)")
