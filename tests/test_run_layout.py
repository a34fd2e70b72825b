"""The run directory's layout is defined once (aleph/record/layout.py): no other module of
the readers and the writer spells a run file's name or joins a run directory's folder name."""

from __future__ import annotations

import ast
from pathlib import Path

from aleph.record.layout import RunLayout

PACKAGE = Path(__file__).resolve().parents[1] / "aleph"
READERS = ("train", "eval", "report", "campaign", "sync", "cli", "record")
FILES = {"config.json", "manifest.json", "metrics.json", "eval.json", "run.lock"}
FOLDERS = {"checkpoints", "weights", "final", "launches", "tb", "tokenizer"}


def spelled_outside_the_layout() -> list[str]:
    found = []
    for part in READERS:
        for path in sorted((PACKAGE / part).rglob("*.py")):
            if path.name == "layout.py" and part == "record":
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and node.value in FILES:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}")
                elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                    for side in (node.left, node.right):
                        if isinstance(side, ast.Constant) and (
                                side.value in FOLDERS or str(side.value).startswith("weights/")):
                            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: "
                                         f"/ {side.value!r}")
    return found


def test_no_reader_or_writer_spells_the_run_layout():
    assert spelled_outside_the_layout() == []


def test_the_layout_names_every_path_a_run_has():
    r = RunLayout("/w/runs/a2_dense-s0")
    assert str(r.final_weights_file) == "/w/runs/a2_dense-s0/weights/final/model.safetensors"
    assert str(r.launch_log("L1")) == "/w/runs/a2_dense-s0/launches/L1.log"
    assert str(r.launch_log("L1", 2)) == "/w/runs/a2_dense-s0/launches/L1.rank2.log"
    assert str(r.step_weights(64)) == "/w/runs/a2_dense-s0/weights/step-00000064"
    assert {r.config.name, r.manifest.name, r.metrics.name, r.eval.name, r.lock.name} == FILES
