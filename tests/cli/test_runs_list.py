"""`aleph runs list [WORK]` on fabricated run directories (manifest.json, run.lock, metrics, eval)."""

import fcntl
import os

from aleph._io import atomic_write_json
from aleph.cli import main


def _run(root, name, statuses, final=False, step=64, evaluated=None):
    d = root / "runs" / name
    launches = [{"launch_id": f"L{i}", "start": f"2026-11-30T0{i}:00:00Z", "status": s, "action": "trained",
                 **({"end": f"2026-11-30T0{i}:30:00Z"} if s != "running" else {})}
                for i, s in enumerate(statuses)]
    atomic_write_json(d / "manifest.json", {"format_version": 1, "run_id": name, "launches": launches})
    atomic_write_json(d / "config.json", {"format_version": 1, "arm": "a2_dense", "seed": 0, "preset": "smoke"})
    atomic_write_json(d / "metrics.json", {"step": step, "total_steps": 128})
    (d / "run.lock").write_text('{"pid": 1, "host": "gone", "start": "2026-11-30T00:00:00Z"}\n')
    if final:
        (d / "weights" / "final").mkdir(parents=True)
        (d / "weights" / "final" / "model.safetensors").write_bytes(b"x")
    if evaluated:
        atomic_write_json(d / "eval.json", {"weights": {"path": evaluated, "step": step}})
    return d


def _table(capsys):
    lines = capsys.readouterr().out.splitlines()
    return {line.split()[0]: line.split(None, 2)[1:] for line in lines[2:]}, lines


def test_runs_list_status_steps_launch_and_evaluation(tmp_path, capsys, monkeypatch):
    _run(tmp_path, "a1_anchored-s0", ["complete"], final=True, step=128, evaluated="weights/final/model.safetensors")
    _run(tmp_path, "a2_dense-s0", ["stopped"], evaluated="weights/step-00000064/model.safetensors")
    _run(tmp_path, "a3_random-s0", ["stopped", "running"])  # marked running, nobody holds the lock
    live = _run(tmp_path, "a3_random-s1", ["running"], step=10)
    _run(tmp_path, "a2_dense-s1", ["complete"], final=True, step=128)
    _run(tmp_path, "smoke/a2_dense-s0", ["complete"], final=True, step=128)  # a smoke preset run
    fd = os.open(live / "run.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a live launch holds it
        assert main(["runs", "list", str(tmp_path)]) == 0
    finally:
        os.close(fd)
    rows, lines = _table(capsys)
    assert lines[0] == f"runs under {tmp_path / 'runs'}:" and lines[1].split() == [
        "run", "status", "steps", "last", "launch", "evaluated"]
    assert rows["a1_anchored-s0"][0] == "complete" and rows["a1_anchored-s0"][1].startswith("128/128  L0 (trained, complete")
    assert rows["a1_anchored-s0"][1].endswith("yes (final weights)")
    assert rows["a2_dense-s0"][0] == "stopped" and rows["a2_dense-s0"][1].endswith("yes (step 64)")
    # marked running in the manifest, its process gone: lost in both columns, never "running"
    assert rows["a3_random-s0"][0] == "lost" and "L1 (trained, lost, started 2026-11-30T01:00:00Z)" in rows["a3_random-s0"][1]
    assert "L0 (trained, running, started" in rows["a3_random-s1"][1]  # a live launch is running
    assert rows["a3_random-s1"][0] == "running" and rows["a3_random-s1"][1].startswith("10/128")
    assert rows["a2_dense-s1"][1].endswith(f"no: `aleph eval {tmp_path / 'runs' / 'a2_dense-s1'}`")
    assert rows["smoke/a2_dense-s0"][0] == "complete"  # found one level down, runs/<preset>/
    monkeypatch.setenv("ALEPH_WORK", str(tmp_path))  # the same runs, now under the work root:
    assert main(["runs", "list"]) == 0  # the hint names the run as every command takes it
    assert _table(capsys)[0]["a2_dense-s1"][1].endswith("no: `aleph eval a2_dense-s1`")
    # the lock is released: the same run now reads as lost; nothing was written by listing
    assert main(["runs", "list", str(tmp_path)]) == 0
    after = _table(capsys)[0]["a3_random-s1"]
    assert after[0] == "lost" and "L0 (trained, lost, started" in after[1]
    assert (live / "run.lock").read_text().startswith('{"pid": 1, "host": "gone"')


def test_runs_list_names_a_missing_work_root(tmp_path, capsys):
    assert main(["runs", "list", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"aleph runs: error: {tmp_path / 'nowhere' / 'runs'}: no runs directory "
        f"(is {tmp_path / 'nowhere'} a work root? `aleph train` creates it)")


def test_runs_list_names_a_damaged_run_and_lists_the_others(tmp_path, capsys):
    _run(tmp_path, "a1_anchored-s0", ["complete"], final=True, step=128)
    damages = {"a2_dense-s0": b'{"run_id": "a2_dense-s0", "launches": [',  # cut short
               "a2_dense-s1": b"\xff\xfe not UTF-8",
               "a3_random-s0": b'{"format_version": 1, "launches": 5}',  # a field of the wrong type
               "a3_random-s1": b"[" * 100_000 + b"]" * 100_000,  # nested too deep to parse
               "a3_random-s2": b'{"format_version": 2, "launches": []}'}  # another version
    for name, data in damages.items():
        (_run(tmp_path, name, ["stopped"]) / "manifest.json").write_bytes(data)
    _run(tmp_path, "smoke/a2_dense-s0", ["stopped"], step=10)

    assert main(["runs", "list", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in out[2:2 + 7]}
    assert rows["a1_anchored-s0"][0] == "complete" and rows["smoke/a2_dense-s0"][:2] == [
        "stopped", "10/128"]
    notes = out[2 + 7:]
    assert len(notes) == len(damages)
    for name in damages:
        assert rows[name] == ["damaged", "—", "—", "—"]
        (note,) = [n for n in notes if n.startswith(f"{name}: damaged: ")]
        assert str(tmp_path / "runs" / name) in note and len(note) < 400
        assert f"{tmp_path / 'runs' / name / 'manifest.json'}: " in note
    says = {n.split(":")[0]: n.split("manifest.json: ")[1] for n in notes}
    assert says == {"a2_dense-s0": "not valid JSON (line 1: Expecting value)",
                    "a2_dense-s1": "not UTF-8 text (byte 0); expected JSON",
                    "a3_random-s0": "field 'launches' is int, expected a list of launches",
                    "a3_random-s1": "nested too deeply to parse; expected a JSON object",
                    "a3_random-s2": "format_version 2, expected 1 (written by another version "
                                    "of aleph-e1; this one reads only its own)"}


def test_runs_list_refuses_an_oversized_or_fifo_record_in_one_line(tmp_path, capsys):
    """A pulled run's metrics.json of 20 MiB, or a FIFO, is one damaged line: read at most
    16 MiB + 1 byte, never waited on (a FIFO nobody writes to would block a plain open)."""
    big = _run(tmp_path, "a1_anchored-s0", ["stopped"])
    (big / "metrics.json").write_bytes(b'{"step": 1, "pad": "' + b"x" * (20 << 20) + b'"}')
    fifo = _run(tmp_path, "a2_dense-s0", ["stopped"])
    (fifo / "metrics.json").unlink()
    os.mkfifo(fifo / "metrics.json")
    _run(tmp_path, "a3_random-s0", ["stopped"], step=10)
    assert main(["runs", "list", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    notes = {n.split(": damaged: ")[0]: n.split(": damaged: ")[1] for n in out if ": damaged: " in n}
    assert notes == {
        "a1_anchored-s0": f"{big / 'metrics.json'}: larger than the 16,777,216 B this input may have",
        "a2_dense-s0": f"{fifo / 'metrics.json'}: not a regular file (a FIFO): expected a regular file"}
    assert any(line.split()[:3] == ["a3_random-s0", "stopped", "10/128"] for line in out)


def test_a_run_name_with_shell_characters_is_quoted_in_the_hint(tmp_path, capsys, monkeypatch):
    """A pulled run may be named anything plain_relative allows: the command to copy is quoted."""
    _run(tmp_path, "smoke/x;touch pwned;#", ["complete"], final=True, step=128)
    monkeypatch.setenv("ALEPH_WORK", str(tmp_path))
    assert main(["runs", "list"]) == 0
    out = capsys.readouterr().out
    assert "no: `aleph eval 'smoke/x;touch pwned;#'`" in out
