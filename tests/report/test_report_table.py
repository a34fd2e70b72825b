"""`aleph report`: every column, per-arm mean and spread, published reference rows, files."""

import csv
import json
import statistics

import pytest
from fixtures.runs import make_run

from aleph._io import atomic_write_json
from aleph.cli import main
from aleph.report import published, table
from aleph.report.render import markdown

TASKS = ("stsb", "sickr", "sts12", "sts13", "sts14", "sts15", "sts16", "biosses")


def fake_eval(run, arm, seed, cap, off=None, r1=0.99, cos=0.8, er=90.0, fp="f" * 64):
    """An eval.json with chosen figures (the eval path itself is tested in tests/eval)."""
    run.mkdir(parents=True, exist_ok=True)
    tasks = {t: {"spearman": cap + 0.01 * (i - 3.5)} for i, t in enumerate(TASKS)}
    atomic_write_json(run / "eval.json", {
        "run_id": run.name, "arm": arm, "seed": seed, "capability": cap,
        "capability_dispatch_off": off, "toggle": None if off is None else off - cap,
        "tasks": tasks, "eval_data_fingerprint": fp, "weights": {"sha256": "w" * 64},
        "probes": {"r_at_1": r1, "r_at_1_batch_size": 256, "cos_target": cos, "erank": er, "dim": 768},
    })
    return run


def test_rows_means_and_spread(tmp_path):
    a = fake_eval(tmp_path / "a1_anchored-s0", "a1_anchored", 0, 0.60, off=0.55, er=98.0)
    b = fake_eval(tmp_path / "a1_anchored-s1", "a1_anchored", 1, 0.62, off=0.56, er=100.0)
    c = fake_eval(tmp_path / "a2_dense-s0", "a2_dense", 0, 0.61)
    rep = table.build([a, b, c])
    kinds = [r["kind"] for r in rep["rows"]]
    assert kinds == ["run", "run", "run", "mean", "spread"]  # a2 has one seed: no mean row
    mean, sd = rep["rows"][3], rep["rows"][4]
    assert mean["capability"] == pytest.approx(0.61) and sd["capability"] == pytest.approx(statistics.stdev([0.60, 0.62]))
    assert mean["toggle"] == pytest.approx(-0.055) and mean["erank"] == pytest.approx(99.0)
    assert mean["r_at_1_batch_size"] == 256 and mean["tasks"]["sts12"] == pytest.approx(0.61 - 0.015)
    assert rep["task_names"] == list(TASKS) and rep["notes"] == []

    md = markdown(rep)
    lines = md.splitlines()
    assert "| run | mean | dispatch OFF | toggle | R@1 | cos->target | erank/768 |" in lines
    assert "| a1_anchored-s0 | 0.6000 | 0.5500 | -0.0500 | 0.9900 (b=256) | 0.8000 | 98.0 |" in lines
    assert "| a2_dense-s0 | 0.6100 | n/a | n/a | 0.9900 (b=256) | 0.8000 | 90.0 |" in lines
    assert any(line.startswith("| a1_anchored mean (n=2, seeds 0,1) | 0.6100 |") for line in lines)
    assert "| run | STS-B | SICK-R | STS12 | STS13 | STS14 | STS15 | STS16 | BIOSSES |" in lines


def test_replicates_of_one_seed_are_told_apart_and_get_no_seed_spread(tmp_path):
    a = fake_eval(tmp_path / "w1" / "a2_dense-s0", "a2_dense", 0, 0.6)
    b = fake_eval(tmp_path / "w2" / "a2_dense-s0", "a2_dense", 0, 0.6)
    rep = table.build([a, b])
    assert [r["run"] for r in rep["rows"]] == ["a2_dense-s0 (w1/a2_dense-s0)", "a2_dense-s0 (w2/a2_dense-s0)"]


def test_different_eval_data_is_flagged(tmp_path):
    a = fake_eval(tmp_path / "x-s0", "a2_dense", 0, 0.6, fp="a" * 64)
    b = fake_eval(tmp_path / "x-s1", "a2_dense", 1, 0.6, fp="b" * 64)
    assert any("evaluation data differ" in n for n in table.build([a, b])["notes"])


def test_published_rows_are_labelled_and_sourced(tmp_path):
    a = fake_eval(tmp_path / "a1_anchored-s1", "a1_anchored", 1, 0.30, off=0.29)
    rep = table.build([a], with_published=True)
    pub = [r for r in rep["rows"] if r["kind"] == "published"]
    assert [r["capability"] for r in pub] == [0.6031, 0.6007, 0.6026, 0.6040, 0.6033, 0.6047]
    assert all(r["run"].startswith("E1 published ") for r in pub)
    assert pub[1]["tasks"]["sts15"] == 0.7094 and pub[0]["tasks"] == {}
    md = markdown(rep)
    assert "| E1 published a1_anchored-s1 | 0.6007 | — | — | about 0.998 | about 0.839-0.842 | about 98.6-99.2 of 768 |" in md
    assert "| E1 published a1_anchored-s1 | 0.5681 | 0.6512 | 0.4931 |" in md
    assert published.source() in md and "model cards" in published.source()
    # reference rows never enter a replication's mean
    assert not [r for r in rep["rows"] if r["kind"] == "mean"]


def test_cli_writes_markdown_csv_json(tmp_path, capsys):
    a = fake_eval(tmp_path / "a1_anchored-s0", "a1_anchored", 0, 0.6, off=0.5)
    b = fake_eval(tmp_path / "a1_anchored-s1", "a1_anchored", 1, 0.7, off=0.6)
    out = tmp_path / "rep"
    assert main(["report", str(a), str(b), "--published", "--out", str(out)]) == 0
    console = capsys.readouterr().out
    assert console.startswith("## E1 table") and (out / "report.md").read_text() in console
    rows = list(csv.DictReader((out / "runs.csv").open()))
    assert [r["kind"] for r in rows[:4]] == ["run", "run", "mean", "spread"]
    assert float(rows[2]["capability"]) == pytest.approx(0.65) and float(rows[0]["toggle"]) == pytest.approx(-0.1)
    tasks = list(csv.DictReader((out / "tasks.csv").open()))
    # runs, mean, spread, and the one published run with a per-task row
    assert [t["kind"] for t in tasks] == ["run", "run", "mean", "spread", "published"]
    assert json.loads((out / "report.json").read_text())["task_names"] == list(TASKS)


def test_report_on_real_eval_output(tmp_path, work, capsys):
    run = make_run(tmp_path, "a2_dense", seed=3, steps=0, train_scalars=False)
    # no --tasks: a smoke-data run is judged on the offline smoke task set
    assert main(["eval", str(run), "--probe-rows", "128", "--probe-batch", "32"]) == 0
    assert main(["report", str(run)]) == 0
    md = capsys.readouterr().out
    assert "| a2_dense-s3 |" in md and "(b=32)" in md and "| run | smoke |" in md
    assert (work / "reports" / "runs.csv").is_file()


def test_missing_or_broken_eval_json_is_named(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    assert main(["report", str(tmp_path / "r")]) == 2
    assert "eval.json: missing" in capsys.readouterr().err
    atomic_write_json(tmp_path / "r" / "eval.json", {"run_id": "r", "arm": "a2_dense", "tasks": {}})
    assert main(["report", str(tmp_path / "r")]) == 2
    assert "missing field 'capability'" in capsys.readouterr().err


def test_r_at_1_of_different_batch_sizes_is_not_averaged(tmp_path):
    a = fake_eval(tmp_path / "a2_dense-s0", "a2_dense", 0, 0.60, r1=0.99)
    b = fake_eval(tmp_path / "a2_dense-s1", "a2_dense", 1, 0.62, r1=0.90)
    ev = json.loads((b / "eval.json").read_text())
    ev["probes"]["r_at_1_batch_size"] = 1024  # more candidates: a harder, different figure
    atomic_write_json(b / "eval.json", ev)
    rows = table.build([a, b])["rows"]
    mean, sd = rows[2], rows[3]
    assert mean["kind"] == "mean" and mean["r_at_1"] is None and sd["r_at_1"] is None
    assert mean["capability"] == pytest.approx(0.61)  # the other columns are still summarised
    assert "R@1 batch sizes differ" in markdown(table.build([a, b]))
