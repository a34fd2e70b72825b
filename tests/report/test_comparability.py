"""Every report row says how it differs from the published E1 setup, and a row that is not
comparable to P says so in the table, the legend and the picture, never drawn beside P."""

import json
import random

from fixtures.runs import make_run, read, smoke_root

from aleph._io import atomic_write_json
from aleph.cli import main
from aleph.data import bundle, sts_pairs
from aleph.eval.tasks import E1_PAIRS, E1_TASKS, HF_TASKS
from aleph.record.layout import FORMAT_VERSION
from aleph.report import comparability, plot, table

NOT_P = "not comparable to P"
E1_ROWS = 31_905_616
PAIRS = 60  # pairs per stand-in task file


def e1_shaped_run(root, arm="a1_anchored", seed=0, capability=0.6031):
    """A run directory as an e1 run on E1's inputs leaves it (its eval.json as `aleph eval`
    writes it from the offline bundle's pinned tasks); the figures are chosen."""
    run = root / f"{arm}-s{seed}"
    cfg = {**comparability.e1_preset(), "arm": arm, "seed": seed, "format_version": FORMAT_VERSION,
           "captions": "/data/e1/captions.parquet", "targets": ["/data/e1/targets"]}
    atomic_write_json(run / "config.json", cfg)
    atomic_write_json(run / "manifest.json", {"format_version": FORMAT_VERSION, "run_id": run.name, "launches": [
        {"launch_id": "L0", "status": "complete", "inputs": {"target_store": {"rows": E1_ROWS}}}]})
    tasks = {n: {"spearman": capability, "pairs": E1_PAIRS[n], "expected_pairs": E1_PAIRS[n],
                 "source": f"bundle:{HF_TASKS[n][0]}@{HF_TASKS[n][1][:12]}:test", "e1_task": True,
                 "not_e1_task": None, "fingerprint": f"fp-{n}", "sha256": f"sha-{n}"} for n in E1_TASKS}
    atomic_write_json(run / "eval.json", {
        "run_id": run.name, "arm": arm, "seed": seed, "capability": capability,
        "capability_dispatch_off": capability - 0.01, "toggle": -0.01, "tasks": tasks,
        "weights": {"path": "weights/final/model.safetensors", "sha256": "w" * 64},
        "tokenizer": {"name": "bert-base-uncased", "same_as_bundle": True},
        "probes": {"r_at_1": 0.998, "r_at_1_batch_size": 256, "cos_target": 0.84, "erank": 99.0,
                   "dim": 768, "set": "e1-hash-sample", "seen_in_training": True}})
    return run


def small_run_on_stand_in_tasks(tmp_path, capsys):
    """A real 2-layer x 64-wide a2 run of the e1 preset, evaluated by `aleph eval` on
    PAIRS-pair stand-in files named like the E1 tasks."""
    from aleph.data import load_tokenizer
    from aleph.model import ModelConfig, build_model
    from aleph.model.io import save_weights

    run = make_run(tmp_path / "small", "a2_dense", seed=1, steps=0)  # weights replaced below
    shape = {"n_layers": 2, "d_model": 64, "n_heads": 4, "ffn_dense": 256, "ffn_expert": 64, "max_len": 32}
    tok = load_tokenizer(run / "tokenizer")
    model = build_model(ModelConfig(arm="a2_dense", vocab_size=len(tok), init="normal_0.02", **shape))  # no QR: fast
    save_weights(model, run / "weights" / "final")
    cfg = {**comparability.e1_preset(), **shape, "arm": "a2_dense", "seed": 1, "format_version": FORMAT_VERSION,
           "captions": str(smoke_root() / "captions.txt"), "targets": [str(smoke_root() / "targets")],
           "tokenizer": str(smoke_root() / "tokenizer")}
    atomic_write_json(run / "config.json", cfg)
    manifest = read(run / "manifest.json")
    manifest["launches"][0]["inputs"] = {"target_store": {"rows": 2048}}
    atomic_write_json(run / "manifest.json", manifest)
    rng = random.Random(0)
    for i, name in enumerate(E1_TASKS):
        pairs = [(a, b, g + rng.random()) for a, b, g in sts_pairs(PAIRS, i)]
        (tmp_path / "stand-in").mkdir(exist_ok=True)
        (tmp_path / "stand-in" / f"{name}.jsonl").write_text(bundle.pairs_jsonl(pairs))
    assert main(["eval", str(run), "--tasks-dir", str(tmp_path / "stand-in"), "--no-probes"]) == 0
    capsys.readouterr()
    return run


def test_a_non_e1_run_is_not_comparable_to_p_in_table_legend_and_picture(tmp_path, work, capsys):
    e1 = e1_shaped_run(tmp_path / "e1")
    small = small_run_on_stand_in_tasks(tmp_path, capsys)
    out = tmp_path / "rep"
    assert main(["report", str(e1), str(small), "--published", "--out", str(out)]) == 0
    md = capsys.readouterr().out
    print(md)  # -rP: the table and legend of both rows, side by side
    rows = {}
    for line in md.splitlines():  # the summary table's row of each run (the per-task one follows)
        if line.startswith("| "):
            rows.setdefault(line.split(" | ")[0][2:], line)
    assert rows["a1_anchored-s0"].endswith("| A | E1 setup |")
    assert rows["a2_dense-s1"].endswith(f"| B | {NOT_P} (model 2x64, config, rows, tasks, tokenizer) |")
    assert rows["E1 published a1_anchored-s0"].endswith("| P | P |")
    legend = {line.split(":")[0][2:]: line for line in md.splitlines() if line.startswith("- basis ")}
    assert "; vs E1: E1's setup (model, e1 preset config, training rows, pinned tasks, tokenizer)" in legend["basis A"]
    b = legend["basis B"]
    assert f"; vs E1: {NOT_P}: model 2x64, 4 heads, ffn 256/64x3 (E1: 12x512, 8 heads, ffn 2048/512x3)" in b
    assert "max_len=32 (e1: 128)" in b and "trained on 2,048 target rows (E1: 31,905,616)" in b
    assert (f"stsb: file:stsb.jsonl has {PAIRS} pairs, the E1 test split (mteb/stsbenchmark-sts@"
            "b0fddb56ed78) has 1,379") in b and f"biosses: file:biosses.jsonl has {PAIRS} pairs" in b
    assert f"tokenizer '{smoke_root() / 'tokenizer'}' (E1: bert-base-uncased)" in b
    assert "probes: e1-hash-sample (seen in training)" in legend["basis A"]
    per_task = [line for line in md.splitlines() if line.startswith("| a2_dense-s1 |")][1]
    assert per_task.count(" †") == 8 and " †" not in [ln for ln in md.splitlines()
                                                       if ln.startswith("| a1_anchored-s0 |")][1]
    assert "† not the E1 task of that name" in md

    report = table.build([e1, small], with_published=True)
    fig = plot.figure(report, [e1, small])
    try:
        small_cap = read(small / "eval.json")["capability"]
        texts = {ax: [ax.get_title(), *(t.get_text() for t in ax.texts),
                      *(t.get_text() for t in (ax.get_legend().get_texts() if ax.get_legend() else []))]
                 for ax in fig.axes}
        apart = [ax for ax, t in texts.items() if t[0].startswith(NOT_P)]
        assert len(apart) == 1 and "s1 (B)" in texts[apart[0]] and NOT_P in texts[apart[0]][1:]
        assert [ln.get_ydata()[0] for ln in apart[0].lines if ln.get_marker() == "D"][0] == small_cap
        with_p = [ax for ax in fig.axes if any(ln.get_marker() == "x" for ln in ax.lines)]
        assert len(with_p) == 1 and with_p[0] is not apart[0]
        assert all(small_cap not in ln.get_ydata() for ln in with_p[0].lines)  # never beside P
        assert f"({NOT_P}: a2_dense-s1)" in fig._suptitle.get_text()
        assert any(f"a2_dense-s1 ({NOT_P})" in t for ts in texts.values() for t in ts)  # curves
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    from PIL import Image

    with Image.open(out / "report.png") as png:
        assert png.text["Description"].splitlines() == [
            "a1_anchored-s0: E1 setup",
            f"a2_dense-s1: {NOT_P} (model 2x64, config, rows, tasks, tokenizer)"]
    assert json.loads((out / "report.json").read_text())["rows"][1]["comparable"] is False


def test_rounding_only_differences_keep_a_run_comparable(tmp_path):
    run = e1_shaped_run(tmp_path)
    cfg = read(run / "config.json")
    atomic_write_json(run / "config.json", {**cfg, "num_threads": 8, "device": "cuda"})
    row = table.build([run])["rows"][0]
    assert row["comparable"] and row["vs_e1"]["short"] == "comparable to P (rounding differs)"
    assert "differs only in rounding: device='cuda' (e1: 'auto'), num_threads=8 (e1: 0)" in row["vs_e1"]["text"]
    atomic_write_json(run / "config.json", {**cfg, "epochs": 1})
    row = table.build([run])["rows"][0]
    assert not row["comparable"] and row["vs_e1"]["text"] == f"{NOT_P}: epochs=1 (e1: 4)"
