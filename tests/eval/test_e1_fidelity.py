"""What makes an evaluation E1's: the pinned tasks checked by pair count and content, the
tokenizer recorded, and the e1 probe set computed by default from the run's own inputs."""

import json
import random
import shutil

import pytest
from fixtures.runs import make_run, read, smoke_root

from aleph._io import sha256_file
from aleph.cli import main
from aleph.data import bundle, sts_pairs
from aleph.errors import DataError
from aleph.eval import tasks
from aleph.eval.probe_data import E1_PROBE_WINDOW, hash_sample


def _pairs(n, seed=0):
    """n pairs of smoke-grammar sentences (words the run's tokenizer knows), gold scores varied."""
    rng = random.Random(seed)
    return [(a, b, float(g) + rng.random()) for a, b, g in sts_pairs(n, seed)]


def _write_jsonl(path, pairs):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(bundle.pairs_jsonl(pairs))
    return path


def test_eval_names_a_task_file_with_one_pair_removed(tmp_path, work, capsys):
    run = make_run(tmp_path, "a2_dense", seed=0, steps=0, train_scalars=False)
    full = _pairs(tasks.E1_PAIRS["stsb"])
    _write_jsonl(tmp_path / "tasks" / "stsb.jsonl", full[:-1])  # one pair removed
    assert main(["eval", str(run), "--tasks", "stsb", "--tasks-dir", str(tmp_path / "tasks"),
                 "--no-probes"]) == 0
    out = capsys.readouterr().out
    line = ("task stsb: not the E1 task: file:stsb.jsonl has 1,378 pairs, the E1 test split "
            "(mteb/stsbenchmark-sts@b0fddb56ed78) has 1,379")
    assert line in out.splitlines()
    t = read(run / "eval.json")["tasks"]["stsb"]
    assert (t["pairs"], t["expected_pairs"], t["e1_task"]) == (1378, 1379, False)
    assert t["not_e1_task"] == line.split("not the E1 task: ")[1]
    assert t["sha256"] == sha256_file(tmp_path / "tasks" / "stsb.jsonl")


def test_a_local_task_file_is_the_e1_task_only_when_its_pairs_match_the_pinned_bundle(tmp_path, monkeypatch):
    monkeypatch.setenv("ALEPH_OFFLINE_BUNDLE", str(tmp_path / "bundle"))
    full = _pairs(tasks.E1_PAIRS["biosses"])
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "biosses.tsv").write_text(
        "sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s!r}\n" for a, b, s in full))
    task = tasks.load_task("biosses", tmp_path / "t")
    assert "its pairs not checked against the pin" in tasks.e1_task_check(task)
    dataset, revision = tasks.HF_TASKS["biosses"]
    bundle.add_sts(tmp_path / "bundle", "biosses", dataset, revision, "test", tuple(full), 100)
    assert tasks.e1_task_check(task) is None  # a .tsv of the same pairs hashes as the bundle file
    changed = [*full[:-1], (full[-1][0], full[-1][1], full[-1][2] + 1)]
    other = tasks.STSTask("biosses", tuple(changed), "file:biosses.jsonl")
    assert "differ from the pinned mteb/biosses-sts@d3fb88f8f02e copy's" in tasks.e1_task_check(other)


def test_the_tasks_dir_file_names_are_in_the_error_and_the_help(tmp_path, capsys):
    with pytest.raises(DataError) as info:
        tasks.load_task("stsbenchmark", tmp_path)
    for name in tasks.E1_TASKS:
        assert f"{name}.tsv|.jsonl" in str(info.value)
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert all(f"{n}.tsv|.jsonl" in helptext for n in tasks.E1_TASKS)


def _e1_shaped_inputs(tmp_path, run):
    """The run's config turned into a real-data run's: captions and targets files here."""
    src = smoke_root()
    shutil.copy(src / "captions.txt", tmp_path / "captions.txt")
    shutil.copytree(src / "targets", tmp_path / "chunks")
    cfg = read(run / "config.json")
    cfg.update(smoke_data=False, captions=str(tmp_path / "captions.txt"),
               targets=[str(tmp_path / "chunks")], tokenizer="bert-base-uncased", preset="e1")
    (run / "config.json").write_text(json.dumps(cfg))
    return tmp_path / "captions.txt", tmp_path / "chunks"


def test_e1_probes_are_a_hash_sample_of_the_runs_own_rows_by_default(tmp_path, work, capsys):
    run = make_run(tmp_path, "a2_dense", seed=0, steps=0, train_scalars=False)
    captions, chunks = _e1_shaped_inputs(tmp_path, run)
    args = ["eval", str(run), "--tasks", "smoke", "--probe-rows", "256", "--probe-batch", "64"]
    assert main(args) == 0  # the store is not built yet: probes skipped, naming the command
    out = capsys.readouterr().out
    assert read(run / "eval.json")["probes"] is None
    assert f"run `aleph targets build {chunks}`" in out and "probes skipped" in out

    assert main(["targets", "build", str(chunks)]) == 0
    assert main(args) == 0
    out = capsys.readouterr().out
    p = read(run / "eval.json")["probes"]
    assert (p["set"], p["seen_in_training"], p["rows"]) == ("e1-hash-sample", True, 256)
    texts = captions.read_text().splitlines()
    assert len(texts) < E1_PROBE_WINDOW  # the window holds every row of this small file
    idx = hash_sample(texts, 256)
    assert idx == sorted(idx) and len(set(idx)) == 256 and idx != list(range(256))
    assert "- probes: e1-hash-sample (seen in training): e1 hash sample of the run's rows" in out
    # a default set smaller than one R@1 batch is skipped, saying why (never an error)
    assert main([*args[:-1], "512"]) == 0
    assert read(run / "eval.json")["probes"] is None
    assert "probes skipped: the run's captions give only 256 probe rows, fewer than one R@1 batch (512)" \
        in capsys.readouterr().out
    # explicit files still work, and the run's own captions are called trained on
    assert main([*args, "--probe-captions", str(captions), "--probe-targets", str(chunks)]) == 0
    p = read(run / "eval.json")["probes"]
    assert (p["set"], p["seen_in_training"]) == ("files", True)


def test_eval_records_the_tokenizer_files_and_pin(tmp_path, work):
    run = make_run(tmp_path, "a2_dense", seed=0, steps=0, train_scalars=False)
    _e1_shaped_inputs(tmp_path, run)
    assert main(["eval", str(run), "--tasks", "smoke", "--no-probes"]) == 0
    tok = read(run / "eval.json")["tokenizer"]
    assert tok["name"] == "bert-base-uncased"
    assert tok["pinned_revision"] == "86b5e0934494bd15c9632b12f734a8a67f723594"
    assert tok["files"] == {p.name: sha256_file(p) for p in sorted((run / "tokenizer").iterdir())}
    assert tok["same_as_bundle"] is None and len(tok["fingerprint"]) == 64
