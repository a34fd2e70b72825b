"""The offline bundle: `aleph data fetch` fills it through the hub loaders; with the hub
gone, the tokenizer and the 8 STS tasks load from it and equal what the hub gave."""

import json
from pathlib import Path

import pytest

from aleph.cli import main
from aleph.data.tokenizer import load_tokenizer, tokenizer_fingerprint
from aleph.errors import DataError
from aleph.eval import tasks


def _pairs(dataset):
    """Distinct pairs per dataset, floats with long expansions, non-ASCII text."""
    n = 3 + len(dataset) % 4
    return {"sentence1": [f"{dataset} a{i} caf\u00e9" for i in range(n)],
            "sentence2": [f"{dataset} b{i}\u2028x" for i in range(n)],
            "score": [i / 3 for i in range(n)]}


@pytest.fixture
def hub(monkeypatch, smoke):
    """A stand-in hub: bert-base-uncased is the smoke tokenizer, each pinned MTEB dataset a
    small datasets.Dataset; `online` switches it off (as an air-gapped VM sees it)."""
    import datasets
    from transformers import AutoTokenizer

    state = {"online": True, "tok_calls": [], "ds_calls": []}
    orig = AutoTokenizer.from_pretrained

    def from_pretrained(source, **kw):
        if Path(source).is_dir():
            return orig(source, **kw)
        if not state["online"]:
            raise OSError(f"offline: cannot reach the hub for {source}")
        state["tok_calls"].append(source)
        assert source == "bert-base-uncased"
        return orig(str(smoke.tokenizer_dir))

    def load_dataset(path, split, revision, cache_dir):
        if not state["online"]:
            raise ConnectionError(f"offline: cannot reach the hub for {path}")
        state["ds_calls"].append((path, revision))
        assert (path, revision) in tasks.HF_TASKS.values() and split == "test"
        return datasets.Dataset.from_dict(_pairs(path))

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", from_pretrained)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return state


def test_fetch_then_load_offline_equals_the_hub(work, hub, smoke, capsys, monkeypatch):
    online = {n: tasks.load_task(n) for n in tasks.E1_TASKS}  # straight from the (stand-in) hub
    online_fp = tokenizer_fingerprint(load_tokenizer("bert-base-uncased"))
    hub["ds_calls"].clear()
    assert main(["data", "fetch"]) == 0
    bundle = work / "data" / "offline"  # the default: where the loaders look
    out = capsys.readouterr().out
    assert f"bundle {bundle}:" in out and "STS sickr: " in out
    assert sorted(p for p, _ in hub["ds_calls"]) == sorted(d for d, _ in tasks.HF_TASKS.values())
    man = json.loads((bundle / "bundle.json").read_text())
    assert man["sts"]["sickr"]["revision"] == "20a6d6f312dd54037fe07a32d58e5e168867909d"

    hub["online"] = False  # air-gapped from here on
    with pytest.raises(DataError, match="network"):
        load_tokenizer("bert-base-uncased", use_bundle=False)
    tok = load_tokenizer("bert-base-uncased")
    assert tokenizer_fingerprint(tok) == online_fp == man["tokenizers"]["bert-base-uncased"]["fingerprint"]
    for name in tasks.E1_TASKS:
        task = tasks.load_task(name)
        assert task.pairs == online[name].pairs and task.fingerprint == online[name].fingerprint
        assert task.source == f"bundle:{tasks.HF_TASKS[name][0]}@{tasks.HF_TASKS[name][1][:12]}:test"

    # the bundle can live elsewhere: ALEPH_OFFLINE_BUNDLE names it
    moved = work.parent / "copied-bundle"
    bundle.rename(moved)
    with pytest.raises(DataError, match="cannot load STS task 'stsb'.*aleph data fetch"):
        tasks.load_task("stsb")
    monkeypatch.setenv("ALEPH_OFFLINE_BUNDLE", str(moved))
    assert tasks.load_task("stsb").pairs == online["stsb"].pairs


def test_a_bundle_of_another_revision_or_damaged_is_refused(work, hub, capsys):
    assert main(["data", "fetch", "--tasks", "sickr,biosses"]) == 0
    bundle = work / "data" / "offline"
    hub["online"] = False
    man_path = bundle / "bundle.json"
    man = json.loads(man_path.read_text())
    man["sts"]["sickr"]["revision"] = "a6ea5a8cab320b040a23452cc28066d9beae2cee"  # the old pin
    man_path.write_text(json.dumps(man))
    with pytest.raises(DataError, match=r"sickr.*mteb/sickr-sts@a6ea5a8cab32, this code pins "
                                        r"mteb/sickr-sts@20a6d6f312dd"):
        tasks.load_task("sickr")
    with (bundle / "sts" / "biosses.jsonl").open("a") as f:
        f.write('{"sentence1": "x", "sentence2": "y", "score": 1}\n')
    with pytest.raises(DataError, match=r"biosses\.jsonl: missing or its sha256 differs"):
        tasks.load_task("biosses")
    with pytest.raises(DataError, match="cannot load STS task 'sts12'"):
        tasks.load_task("sts12")  # not in this bundle, hub offline
    man_path.write_text("{not json")
    with pytest.raises(DataError, match=r"bundle\.json: invalid JSON"):
        tasks.load_task("sts12")
    assert main(["data", "fetch", "--tasks", "smoke"]) == 2
    assert "not hub tasks" in capsys.readouterr().err


def test_a_hostile_manifest_is_one_line(tmp_path):
    """A bundle copied from elsewhere (issue 32): nested 100k deep or a link, one line."""
    from aleph.data.bundle import MANIFEST, read_manifest

    (tmp_path / MANIFEST).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataError, match=r"bundle.json: invalid JSON \(JSON nested too deeply"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST).unlink()
    (tmp_path / "elsewhere.json").write_text("{}")
    (tmp_path / MANIFEST).symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(DataError, match=r"bundle.json: not a regular file \(a symbolic link\)"):
        read_manifest(tmp_path)
