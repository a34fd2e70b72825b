"""The offline bundle: `aleph data fetch` fills it through the hub loaders; with the hub
gone, the tokenizer and the 8 STS tasks load from it and equal what the hub gave."""

import hashlib
import json
import os
from pathlib import Path

import pytest

from aleph.cli import main
from aleph.data.tokenizer import load_tokenizer, tokenizer_fingerprint
from aleph.errors import DataError
from aleph.eval import tasks

DATASET_TASK = {d: t for t, (d, _) in tasks.HF_TASKS.items()}


def _pairs(dataset, short=0):
    """Distinct pairs per dataset, as many as its pinned test split has (less `short`),
    floats with long expansions, non-ASCII text."""
    n = tasks.E1_PAIRS[DATASET_TASK[dataset]] - short
    return {"sentence1": [f"{dataset} a{i} caf\u00e9" for i in range(n)],
            "sentence2": [f"{dataset} b{i}\u2028x" for i in range(n)],
            "score": [i / 3 for i in range(n)]}


@pytest.fixture
def hub(monkeypatch, smoke):
    """A stand-in hub: bert-base-uncased is the smoke tokenizer, each pinned MTEB dataset a
    small datasets.Dataset; `online` switches it off (as an air-gapped VM sees it)."""
    import datasets
    from transformers import AutoTokenizer

    state = {"online": True, "tok_calls": [], "ds_calls": [], "short": {}}
    orig = AutoTokenizer.from_pretrained

    def from_pretrained(source, **kw):
        if Path(source).is_dir():
            return orig(source, **kw)
        if not state["online"]:
            raise OSError(f"offline: cannot reach the hub for {source}")
        state["tok_calls"].append((source, kw.get("revision")))
        assert source == "bert-base-uncased"
        kw.pop("revision", None)  # a local directory has no revisions
        return orig(str(smoke.tokenizer_dir), **kw)

    def load_dataset(path, split, revision, cache_dir):
        if not state["online"]:
            raise ConnectionError(f"offline: cannot reach the hub for {path}")
        state["ds_calls"].append((path, revision))
        assert (path, revision) in tasks.HF_TASKS.values() and split == "test"
        return datasets.Dataset.from_dict(_pairs(path, state["short"].get(path, 0)))

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


def test_fetch_pins_the_tokenizer_records_its_files_and_checks_every_pair_count(work, hub, capsys):
    assert main(["data", "fetch", "--tasks", "biosses"]) == 0
    pin = "86b5e0934494bd15c9632b12f734a8a67f723594"  # E1-FACTS.md, "Pins for evaluation"
    assert hub["tok_calls"] == [("bert-base-uncased", pin)]
    bundle = work / "data" / "offline"
    man = json.loads((bundle / "bundle.json").read_text())
    tok = man["tokenizers"]["bert-base-uncased"]
    assert tok["revision"] == pin and "tokenizer.json" in tok["files"]
    for name, sha in tok["files"].items():
        assert hashlib.sha256((bundle / tok["dir"] / name).read_bytes()).hexdigest() == sha
    assert man["sts"]["biosses"]["pairs"] == 100
    assert f"tokenizer bert-base-uncased@{pin[:12]}:" in capsys.readouterr().out
    hub["short"]["mteb/sts13-sts"] = 1  # the hub gives one pair fewer than the pinned split
    assert main(["data", "fetch", "--tasks", "sts13"]) == 2
    assert capsys.readouterr().err.strip() == (
        "aleph data: error: STS task 'sts13': mteb/sts13-sts@7e90230a92c1 test gave 1,499 "
        "pairs, its pinned split has 1,500; not written to the bundle (a changed or partial "
        "download)")
    assert "sts13" not in json.loads((bundle / "bundle.json").read_text())["sts"]
    assert not (bundle / "sts" / "sts13.jsonl").exists()


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


def test_a_copied_bundle_names_no_file_outside_it_and_no_entry_of_another_type(work, hub):
    """bundle.json comes with a copied bundle: an STS entry that is not an object is one line,
    and its `file` never leads outside (the file read is sts/<task>.jsonl, no link followed)."""
    assert main(["data", "fetch", "--tasks", "biosses,sickr"]) == 0
    bundle = work / "data" / "offline"
    hub["online"] = False
    man_path = bundle / "bundle.json"
    man = json.loads(man_path.read_text())
    outside = work / "outside.jsonl"
    os.replace(bundle / "sts" / "biosses.jsonl", outside)
    man["sts"]["biosses"]["file"] = str(outside)  # its sha256 still matches the moved file
    man["sts"]["sickr"] = "oops"
    man_path.write_text(json.dumps(man))
    with pytest.raises(DataError, match=r"biosses\.jsonl: missing or its sha256 differs"):
        tasks.load_task("biosses")
    os.symlink(outside, bundle / "sts" / "biosses.jsonl")
    with pytest.raises(DataError, match=r"biosses\.jsonl: missing or its sha256 differs .*not a "
                                        r"regular file"):
        tasks.load_task("biosses")
    with pytest.raises(DataError, match=r"STS task 'sickr': 'oops', expected an object"):
        tasks.load_task("sickr")
