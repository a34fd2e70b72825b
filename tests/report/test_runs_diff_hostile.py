"""`aleph runs diff` over hostile records of a pulled run (issue 32, item 10): a launch's
executed-code record (`launches/<id>.code.json`) and a target store's manifest nested 100k
deep are reported as unreadable, never a RecursionError traceback."""

import subprocess
import sys
from pathlib import Path

from fixtures.runs import make_run

from aleph._io import atomic_write_json, read_json
from aleph.record.executed import read_executed
from aleph.report.store_diff import _store_manifest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEEP = "[" * 100_000 + "]" * 100_000


def _run_with_deep_code_record(root: Path, arm: str, rev: str) -> Path:
    run = make_run(root, arm, steps=0, train_scalars=False, revision=rev * 40, source=rev * 64)
    m = read_json(run / "manifest.json")
    m["code"] = {"revision": rev * 40, "source_sha256": rev * 64,
                 "executed": {"file": "launches/deep.code.json"}}
    for launch in m["launches"]:
        launch["code"] = m["code"]
    atomic_write_json(run / "manifest.json", m)
    (run / "launches" / "deep.code.json").write_text(DEEP)
    return run


def test_a_deeply_nested_code_record_is_unreadable_not_a_traceback(tmp_path):
    a = _run_with_deep_code_record(tmp_path / "x", "a1_anchored", "1")
    b = _run_with_deep_code_record(tmp_path / "y", "a2_dense", "2")
    record, why = read_executed(a, read_json(a / "manifest.json")["code"])
    print(why)
    assert record is None and why == ("executed-code record launches/deep.code.json unreadable "
                                      "(JSON nested too deeply to parse; expected a shallow "
                                      "document)")
    p = subprocess.run([sys.executable, "-m", "aleph", "runs", "diff", str(a), str(b)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin",
                            "HOME": str(tmp_path)})
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "code differs: A executed 1111" in p.stdout


def test_a_deeply_nested_store_manifest_is_not_read(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text(DEEP)
    assert _store_manifest({"dir": str(store)}) is None
    (store / "manifest.json").unlink()
    (store / "manifest.json").symlink_to(tmp_path / "elsewhere.json")  # never followed
    (tmp_path / "elsewhere.json").write_text('{"built_by": "someone else"}')
    assert _store_manifest({"dir": str(store)}) is None
