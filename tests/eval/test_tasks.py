"""STS task sources: local TSV/JSONL files, the smoke grammar, and the hub path's offline error."""

from pathlib import Path

import pytest

from aleph.errors import DataError
from aleph.eval import tasks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sts"


def test_tsv_and_jsonl_fixtures_load_the_same_pairs():
    tsv = tasks.load_task("tiny", FIXTURES)
    jsonl = tasks.STSTask("tiny", tasks.read_jsonl(FIXTURES / "tiny.jsonl"), "x")
    assert len(tsv.pairs) == 12 and tsv.pairs == jsonl.pairs
    assert tsv.pairs[0] == ("a red dog running on the beach",
                            "a crimson puppy sprinting on the shore", 5.0)
    assert tsv.source == "file:tiny.tsv" and tsv.fingerprint == jsonl.fingerprint
    assert len(tsv.fingerprint) == 64


def test_task_names():
    assert tasks.parse_task_names("e1") == list(tasks.E1_TASKS)
    assert tasks.parse_task_names("smoke, STS12,smoke") == ["smoke", "sts12"]
    with pytest.raises(DataError, match="names no task"):
        tasks.parse_task_names(" , ")
    with pytest.raises(DataError, match="unknown STS task 'nope'"):
        tasks.load_task("nope", FIXTURES)


def test_bad_files_name_file_line_and_field(tmp_path):
    bad = tmp_path / "t.tsv"
    bad.write_text("a\tb\n")
    with pytest.raises(DataError, match=r"t\.tsv: line 1 must be the header"):
        tasks.read_tsv(bad)
    bad.write_text("sentence1\tsentence2\tscore\nx\ty\t1\nx\ty\n")
    with pytest.raises(DataError, match=r"t\.tsv: line 3: expected 3"):
        tasks.read_tsv(bad)
    bad.write_text("sentence1\tsentence2\tscore\nx\ty\thigh\n")
    with pytest.raises(DataError, match=r"line 2: field 'score' is not a number: 'high'"):
        tasks.read_tsv(bad)
    js = tmp_path / "t.jsonl"
    js.write_text('{"sentence1": "x", "sentence2": "y", "score": 1}\n{"sentence1": "x", "score": 2}\n')
    with pytest.raises(DataError, match=r"t\.jsonl: line 2: missing field 'sentence2'"):
        tasks.read_jsonl(js)
    js.write_text('{"sentence1": "x", "sentence2": "y", "score": 1}\n{"sentence1": "z", "sentence2": "y", "score": 1}\n')
    with pytest.raises(DataError, match="all gold scores are equal"):
        tasks.read_jsonl(js)


def test_hub_task_offline_error_names_dataset_and_local_fallback(work, monkeypatch):
    import datasets
    import huggingface_hub.constants

    # Force offline mode so the test never touches the network, wherever it runs.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError) as info:
        tasks.load_task("sts12")
    msg = str(info.value)
    assert "mteb/sts12-sts" in msg and "--tasks-dir" in msg and str(work / "cache" / "hf") in msg


def test_every_e1_task_has_a_hub_source_and_a_display_name():
    assert set(tasks.HF_TASKS) == set(tasks.E1_TASKS) == set(tasks.DISPLAY)


def test_hub_task_reads_the_pinned_test_split_into_pairs(work, monkeypatch):
    import datasets

    calls = []

    def fake_load(path, split, revision, cache_dir):
        # Stands in for the download only: the rows go through a real datasets.Dataset.
        calls.append((path, split, revision, cache_dir))
        return datasets.Dataset.from_dict(
            {"sentence1": ["a", "b", "c"], "sentence2": ["x", "y", "z"], "score": [0.5, 4.0, 2]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    task = tasks.load_task("biosses")
    assert calls == [("mteb/biosses-sts", "test", tasks.HF_TASKS["biosses"][1], str(work / "cache" / "hf"))]
    assert task.pairs == (("a", "x", 0.5), ("b", "y", 4.0), ("c", "z", 2.0))
    assert task.source == "hf:mteb/biosses-sts@d3fb88f8f02e:test"

    monkeypatch.setattr(datasets, "load_dataset",
                        lambda *a, **k: datasets.Dataset.from_dict({"s1": ["a"], "score": [1.0]}))
    with pytest.raises(DataError, match=r"mteb/biosses-sts lacks columns \['sentence1', 'sentence2'\]"):
        tasks.load_task("biosses")
