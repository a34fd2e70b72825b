"""`aleph report`: every column, per-arm mean and spread, published reference rows, files."""

import csv
import json
import statistics

import pytest
from fixtures.runs import make_run

from aleph._io import atomic_write_json
from aleph.cli import main
from aleph.errors import DataError
from aleph.report import published, table
from aleph.report.render import markdown

TASKS = ("stsb", "sickr", "sts12", "sts13", "sts14", "sts15", "sts16", "biosses")


def fake_eval(run, arm, seed, cap, off=None, r1=0.99, cos=0.8, er=90.0, fp="f" * 64, tasks=TASKS,
              weights="weights/final/model.safetensors", probes=True, config=None):
    """An eval.json with chosen figures (the eval path itself is tested in tests/eval)."""
    run.mkdir(parents=True, exist_ok=True)
    tasks = {t: {"spearman": cap + 0.01 * (i - 3.5), "fingerprint": f"fp-{t}"} for i, t in enumerate(tasks)}
    if config is not None:
        atomic_write_json(run / "config.json", {"format_version": 1, "arm": arm, "seed": seed, **config})
    atomic_write_json(run / "eval.json", {
        "run_id": run.name, "arm": arm, "seed": seed, "capability": cap,
        "capability_dispatch_off": off, "toggle": None if off is None else off - cap,
        "tasks": tasks, "eval_data_fingerprint": fp, "weights": {"sha256": "w" * 64, "path": weights},
        "probes": {"r_at_1": r1, "r_at_1_batch_size": 256, "cos_target": cos, "erank": er, "dim": 768}
        if probes else None,
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
    assert "| run | mean | dispatch OFF | toggle | R@1 | cos->target | erank/768 | basis | vs P |" in lines
    assert "| a1_anchored-s0 | 0.6000 | 0.5500 | -0.0500 | 0.9900 (b=256) | 0.8000 | 98.0 | A | not comparable to P (no config, tasks) |" in lines
    assert "| a2_dense-s0 | 0.6100 | n/a | n/a | 0.9900 (b=256) | 0.8000 | 90.0 | A | not comparable to P (no config, tasks) |" in lines
    assert any(line.startswith("| a1_anchored mean (n=2, seeds 0,1) | 0.6100 |") for line in lines)
    assert "| run | STS-B | SICK-R | STS12 | STS13 | STS14 | STS15 | STS16 | BIOSSES |" in lines


def test_replicates_of_one_seed_are_told_apart_and_get_no_seed_spread(tmp_path):
    a = fake_eval(tmp_path / "w1" / "a2_dense-s0", "a2_dense", 0, 0.6)
    b = fake_eval(tmp_path / "w2" / "a2_dense-s0", "a2_dense", 0, 0.6)
    rep = table.build([a, b])
    assert [r["run"] for r in rep["rows"]] == ["a2_dense-s0 (w1/a2_dense-s0)", "a2_dense-s0 (w2/a2_dense-s0)"]


def test_different_task_sets_weights_and_configs_are_marked_and_never_averaged(tmp_path):
    cfg = {"preset": "smoke", "lr": 0.002, "log_every_steps": 5}
    a = fake_eval(tmp_path / "a" / "a2_dense-s0", "a2_dense", 0, 0.60, config=cfg)
    b = fake_eval(tmp_path / "a" / "a2_dense-s1", "a2_dense", 1, 0.62, config={**cfg, "log_every_steps": 50})
    one = fake_eval(tmp_path / "b" / "a2_dense-s2", "a2_dense", 2, 0.90, tasks=("smoke",), config=cfg)
    step = fake_eval(tmp_path / "c" / "a2_dense-s3", "a2_dense", 3, 0.40, config=cfg,
                     weights="weights/step-00000064/model.safetensors")
    other = fake_eval(tmp_path / "d" / "a2_dense-s4", "a2_dense", 4, 0.50, config={**cfg, "lr": 0.01})
    other2 = fake_eval(tmp_path / "d" / "a2_dense-s5", "a2_dense", 5, 0.52, config={**cfg, "lr": 0.01})
    rep = table.build([a, b, one, step, other, other2])
    runs = {r["seed"]: r["basis"] for r in rep["rows"] if r["kind"] == "run"}
    # how often a run logs is not a basis; tasks, weights and lr are
    assert runs == {0: "A", 1: "A", 2: "B", 3: "C", 4: "D", 5: "D"}
    means = [r for r in rep["rows"] if r["kind"] == "mean"]
    assert [(m["basis"], m["capability"]) for m in means] == [("A", pytest.approx(0.61)), ("D", pytest.approx(0.51))]
    assert means[0]["run"] == "a2_dense mean (basis A, n=2, seeds 0,1)"
    legend = "\n".join(rep["legend"])
    assert "basis B: 1 task(s) (smoke); final weights" in legend
    assert "basis C: 8 task(s)" in legend and "; step 64 weights;" in legend
    assert "basis D: 8 task(s)" in legend and "config differs from A: lr=0.01 (A: 0.002)" in legend
    assert any("runs on bases A, B, C, D are not averaged" in n for n in rep["notes"])
    md = markdown(rep)
    assert "| a2_dense-s3 | 0.4000 | n/a | n/a | 0.9900 (b=256) | 0.8000 | 90.0 | C | not comparable to P (model, config, tasks, tokenizer) |" in md


def test_a_run_without_probes_is_not_called_a_batch_size_difference(tmp_path):
    a = fake_eval(tmp_path / "a2_dense-s0", "a2_dense", 0, 0.60)
    b = fake_eval(tmp_path / "a2_dense-s1", "a2_dense", 1, 0.62, probes=False)
    rep = table.build([a, b])
    mean = next(r for r in rep["rows"] if r["kind"] == "mean")
    assert mean["capability"] == pytest.approx(0.61) and mean["r_at_1"] is None
    md = markdown(rep)
    assert "batch sizes differ" not in md
    assert "| a2_dense mean (n=2, seeds 0,1) | 0.6100 | n/a | n/a | — (not probed: 1 of 2 runs) | — | — | A | not comparable to P (no config, tasks) |" in md


def test_the_glossary_is_printed_under_the_table(tmp_path, capsys):
    a = fake_eval(tmp_path / "a1_anchored-s0", "a1_anchored", 0, 0.6, off=0.5)
    assert main(["report", str(a), "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    table_end = out.index("| a1_anchored-s0 |")
    for name in ("mean", "dispatch OFF", "toggle", "R@1 (b=256)", "cos->target", "erank/768", "basis"):
        assert out.index(f"- **{name}**: ") > table_end, name
    assert "tied top scores (a target present twice in a batch) share the hit" in out
    assert "n/a for the dense arm" in out


def test_report_on_a_trained_but_not_evaluated_run_says_to_run_eval(tmp_path, capsys):
    run = make_run(tmp_path, "a2_dense", seed=0, steps=0, train_scalars=False)
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"aleph report: error: {run}: trained but not evaluated (no eval.json): "
                   f"run `aleph eval {run}` first")


def test_published_rows_are_labelled_and_sourced(tmp_path):
    a = fake_eval(tmp_path / "a1_anchored-s1", "a1_anchored", 1, 0.30, off=0.29)
    rep = table.build([a], with_published=True)
    pub = [r for r in rep["rows"] if r["kind"] == "published"]
    assert [r["capability"] for r in pub] == [0.6031, 0.6007, 0.6026, 0.6040, 0.6033, 0.6047]
    assert all(r["run"].startswith("E1 published ") for r in pub)
    assert pub[1]["tasks"]["sts15"] == 0.7094 and pub[0]["tasks"] == {}
    md = markdown(rep)
    assert "| E1 published a1_anchored-s1 | 0.6007 | — | — | about 0.998 | about 0.839-0.842 | about 98.6-99.2 of 768 | P | P |" in md
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


def test_report_writes_the_picture_as_a_png_of_the_stated_size(tmp_path, capsys):
    import struct

    from aleph.report import plot

    run = make_run(tmp_path / "w", "a1_anchored", seed=0, steps=100)  # train/loss at steps 0, 50, 100
    fake_eval(run, "a1_anchored", 0, 0.6, off=0.55)
    assert [s for s, _ in plot.read_scalars(run)["train/loss"]] == [0, 50, 100]
    out = tmp_path / "rep"
    assert main(["report", str(run), "--published", "--out", str(out)]) == 0
    assert f"wrote {out / 'report.png'}" in capsys.readouterr().out
    data = (out / "report.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == plot.SIZE_PX == (1500, 800)


def test_the_picture_title_names_the_preset_the_runs_trained(tmp_path):
    from aleph.report import plot

    smoke = fake_eval(tmp_path / "s", "a2_dense", 0, 0.9, config={"preset": "smoke"})
    e1 = fake_eval(tmp_path / "e", "a2_dense", 1, 0.6, config={"preset": "e1"})
    runs = [r for r in table.build([smoke, e1])["rows"] if r["kind"] == "run"]
    assert plot._title(runs[:1]) == "smoke runs: s (not comparable to P: s)"
    assert plot._title(runs) == "e1 + smoke runs: s, e (not comparable to P: s, e)"


@pytest.mark.parametrize("edit,says", [
    (lambda d: d.update(probes="x"), "field 'probes' has type str"),
    (lambda d: d.update(weights="x"), "field 'weights' has type str"),
    (lambda d: d["probes"].update(r_at_1="x"), "field 'probes.r_at_1' has type str"),
    (lambda d: d["probes"].update(erank=[1]), "field 'probes.erank' has type list"),
    (lambda d: d["probes"].update(r_at_1_batch_size="256"), "field 'probes.r_at_1_batch_size' has type str"),
    (lambda d: d.update(toggle=True), "field 'toggle' has type bool"),
    (lambda d: d.update(capability=float("nan")), "field 'capability' is nan, expected a finite number"),
    (lambda d: d.update(capability_dispatch_off=float("inf")),
     "field 'capability_dispatch_off' is inf, expected a finite number"),
    (lambda d: d["tasks"]["stsb"].update(spearman="x"), "tasks.stsb: field 'spearman' has type str"),
])
def test_a_field_of_eval_json_of_the_wrong_type_is_one_line(tmp_path, capsys, edit, says):
    """A pulled run's eval.json: every field the table formats is checked (no traceback,
    never a bare NaN in report.json)."""
    run = fake_eval(tmp_path / "a2_dense-s0", "a2_dense", 0, 0.6, off=0.5)
    data = json.loads((run / "eval.json").read_text())
    edit(data)
    (run / "eval.json").write_text(json.dumps(data))
    with pytest.raises(DataError) as e:
        table.build([run])
    assert str(e.value).startswith(f"{run / 'eval.json'}") and str(e.value).endswith(says)
    assert main(["report", str(run), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().endswith(says)
    assert not (tmp_path / "out").exists()
