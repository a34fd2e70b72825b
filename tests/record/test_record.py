"""The run record (aleph.record): scopes and hunks, launch ranges and actions, the manifest
never rewriting an earlier launch, the lost-launch diagnosis, the executed-code tracer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from aleph.env.cgroup import read_memory
from aleph.record import executed, fingerprint, heartbeat
from aleph.record.launch import (
    NOOP,
    NOTHING,
    REFUSED,
    RESUMED,
    TRAINED,
    choose_action,
    read_launches,
    training_launches,
)
from aleph.record.layout import RunLayout

SOURCE = '''import x
A = 1


@deco
def f(a=1):
    """doc"""
    def g():
        return 2
    return g() + a  # comment


class C:
    z = 3

    def m(self):
        return [i for i in range(3)]
'''


def test_scopes_hash_code_not_comments_and_map_lines_to_the_innermost_function():
    s = fingerprint.scopes(SOURCE)
    assert set(s.hashes) == {"<module>", "f", "f.<locals>.g", "C.m"}
    assert s.lines[5] == {"f", "<module>"}  # the decorator runs at definition time
    assert s.lines[9] == {"f.<locals>.g"} and s.lines[10] == {"f"}
    assert s.lines.get(14) is None and s.of_lines([14]) == {"<module>"}  # a class body line
    # code objects Python reports for lambdas, comprehensions and class bodies
    assert s.resolve("C.m.<locals>.<listcomp>") == "C.m"
    assert s.resolve("f.<locals>.g") == "f.<locals>.g" and s.resolve("C") == "<module>"
    cosmetic = fingerprint.scopes(SOURCE.replace("  # comment", "").replace('"""doc"""', '"""new"""'))
    assert cosmetic.hashes == s.hashes
    inner = fingerprint.scopes(SOURCE.replace("return 2", "return 3"))
    assert {k for k in s.hashes if s.hashes[k] != inner.hashes[k]} == {"f.<locals>.g"}
    body = fingerprint.scopes(SOURCE.replace("z = 3", "z = 4"))
    assert {k for k in s.hashes if s.hashes[k] != body.hashes[k]} == {"<module>"}


def test_a_hunk_is_executed_by_the_runs_that_ran_a_changed_function():
    old, new = fingerprint.scopes(SOURCE), fingerprint.scopes(SOURCE.replace("return 2", "return 3"))
    v = executed.classify_hunk([9], [9], old, new, {"A": {"f", "f.<locals>.g"}, "B": {"f"}})
    assert (v.changed, v.executed_by) == (["f.<locals>.g"], ["A"])
    assert v.describe() == "f.<locals>.g: executed by A"
    v = executed.classify_hunk([9], [9], old, new, {"A": {"f"}, "B": {"<module>"}})
    assert v.describe() == "f.<locals>.g: executed by neither"
    comment = fingerprint.scopes(SOURCE.replace("# comment", "# other"))
    v = executed.classify_hunk([11], [11], old, comment, {"A": {"f"}})
    assert v.describe() == "no code change (comments, docstrings or formatting only)"
    # a new function: its lines exist on the new side only
    added = fingerprint.scopes(SOURCE + "\n\ndef h():\n    return 1\n")
    v = executed.classify_hunk([], [19, 20, 21, 22], old, added, {"A": {"<module>"}, "B": {"<module>"}})
    assert (v.changed, v.executed_by) == (["h"], [])


def _helper_called_in_the_window():
    return 1


def _helper_called_after_it():
    return 2


def test_tracer_records_the_window_and_the_events_it_is_switched_on_for():
    if sys.gettrace() is not None:
        pytest.skip("a debugger or coverage tracer is active: the tracer stands aside by design")
    t = fingerprint.Tracer(root=Path(__file__).resolve().parent)  # this directory as the package
    t.start()
    _helper_called_in_the_window()
    t.close_window("test window")
    _helper_called_after_it()
    ran = t.executed().get("test_record.py", set())
    assert "_helper_called_in_the_window" in ran and "_helper_called_after_it" not in ran
    assert "test_tracer_records_the_window_and_the_events_it_is_switched_on_for" in ran  # the stack
    with t.during():
        _helper_called_after_it()
    assert "_helper_called_after_it" in t.executed()["test_record.py"]
    assert sys.gettrace() is None
    import builtins

    assert not hasattr(builtins.__import__, "__wrapped__")  # the import hook is removed


def test_tracer_switched_off_records_nothing_and_says_why(monkeypatch):
    monkeypatch.setenv(fingerprint.OFF_ENV, "off")
    t = fingerprint.Tracer().start()
    t.close_window()
    rec = t.record()
    assert rec["executed"] == {} and rec["functions"] == 0
    assert rec["unavailable"].startswith(f"switched off by {fingerprint.OFF_ENV}=off")
    assert len(rec["files"]) > 50  # the file hashes are still recorded


def _entry(i, action=None, steps=None, **kw):
    e = {"launch_id": f"L{i}", "status": "complete", "exit_status": 0, **kw}
    if action:
        e["action"] = action
    if steps:
        e["steps"] = {"from": steps[0], "to": steps[1]}
    return e


def test_effective_step_ranges_cut_where_the_next_launch_resumed():
    manifest = {"launches": [
        _entry(1, TRAINED, (0, 25), status="lost"),  # killed at 25, last resume state at 20
        _entry(2, RESUMED, (20, 40), status="stopped"),
        _entry(3, REFUSED, None, status="failed", exit_status=2),  # never reached the loop
        _entry(4, RESUMED, (40, 64)),
        _entry(5, NOOP, (64, 64), note="already complete"),
    ]}
    recs = read_launches(manifest)
    assert [r.effective for r in recs] == [(0, 20), (20, 40), None, (40, 64), (64, 64)]
    assert [r.launch_id for r in training_launches(manifest)] == ["L1", "L2", "L4"]
    assert recs[0].label() == "launch 1 (L1, steps 0-20)"
    # a fresh start after every resume state was lost: the earlier launch kept nothing
    fresh = {"launches": [_entry(1, TRAINED, (0, 30), status="lost"), _entry(2, TRAINED, (0, 64))]}
    assert [r.launch_id for r in training_launches(fresh)] == ["L2"]
    # an entry without an action yet (a running launch) is assumed to have trained
    assert [r.action for r in read_launches({"launches": [_entry(1)]})] == [TRAINED]


def test_choose_action():
    assert choose_action(None, None, "failed", "DataError: x", refused=True) == REFUSED
    assert choose_action(None, None, "stopped", "SIGTERM before the first step", False) == NOTHING
    assert choose_action(0, 12, "complete", "12 steps", False) == TRAINED
    assert choose_action(6, 12, "stopped", "SIGINT after step 12", False) == RESUMED
    assert choose_action(12, 12, "complete", "already complete", False) == NOOP


def test_a_launch_never_rewrites_an_earlier_launchs_record(tmp_path, monkeypatch):
    from aleph.record import provenance
    from aleph.train.outputs import Manifest

    monkeypatch.setattr(provenance, "environment_summary", lambda: {"torch": "2.4.1"})
    m = Manifest(tmp_path, "r", "a1_anchored", 0)
    m.start_launch("L1", "launches/L1.log", 1, {"revision": "r1", "dirty": False, "source_sha256": "1" * 64})
    m.end_launch(0, "complete", "4 steps", TRAINED, 4)
    first = json.loads((tmp_path / "manifest.json").read_text())
    monkeypatch.setattr(provenance, "environment_summary", lambda: {"torch": "9.9"})
    m2 = Manifest(tmp_path, "r", "a1_anchored", 0)
    m2.start_launch("L2", "launches/L2.log", 1, {"revision": "r2", "dirty": True, "source_sha256": "2" * 64})
    m2.end_launch(0, "complete", "already complete", NOOP, 4)
    now = json.loads((tmp_path / "manifest.json").read_text())
    assert now["launches"][0] == first["launches"][0]
    assert now["format_version"] == 1  # and no top-level copy of a launch's record
    assert not {"code_revision", "source_sha256", "environment"} & set(now)
    assert now["launches"][1]["code"]["revision"] == "r2"
    assert now["launches"][1]["environment"] == {"torch": "9.9"}
    env = now["launches"][1]["envelope"]
    assert {"memory_limit_bytes", "cpu_quota_us", "cpuset", "numa_nodes", "gpus", "driver"} <= set(env)


def _v1_cgroup(d, usage, limit, oom_kill, peak=None, inactive=0):
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (d / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (d / "memory.max_usage_in_bytes").write_text(f"{peak or usage}\n")
    (d / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n")
    (d / "memory.stat").write_text(f"total_inactive_file {inactive}\nhierarchical_memory_limit {limit}\n")


def test_read_memory_finds_the_own_v1_cgroup_and_its_working_set(tmp_path):
    _v1_cgroup(tmp_path / "memory" / "job" / "x", 900, 1000, 2, inactive=300)
    m = read_memory(tmp_path, self_cgroup="4:memory:/job/x\n")
    assert (m.version, m.usage_bytes, m.limit_bytes, m.oom_kill) == (1, 900, 1000, 2)
    assert m.working_set_bytes == 600 and m.path == str(tmp_path / "memory" / "job" / "x")
    v2 = tmp_path / "v2"
    (v2 / "a").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("memory\n")
    (v2 / "memory.max").write_text("5000\n")
    (v2 / "a" / "cgroup.controllers").write_text("memory\n")
    (v2 / "a" / "memory.max").write_text("max\n")
    (v2 / "a" / "memory.current").write_text("4000\n")
    (v2 / "a" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    m = read_memory(v2, self_cgroup="0::/a\n")
    assert (m.version, m.limit_bytes, m.oom_kill) == (2, 5000, 1)  # the parent's limit binds


def _beat(cg_dir, ws, limit, oom_kill, version=1):
    return {"utc": "2026-11-30T01:02:03Z", "step": 7, "step_from": 0, "phase": "training",
            "rss_bytes": 123, "cgroup": {"version": version, "path": str(cg_dir),
                                         "working_set_bytes": ws, "limit_bytes": limit,
                                         "oom_kill": oom_kill}}


def test_a_vanished_launch_is_named_oom_killed_only_on_evidence(tmp_path):
    cg = tmp_path / "cg"
    _v1_cgroup(cg, 1000, 1000, oom_kill=1, peak=1000)  # the kernel killed since the beat
    got = heartbeat.diagnose_lost(_beat(cg, 500, 1000, 0))
    assert got["diagnosis"].startswith(
        f"likely killed by the cgroup OOM killer at 1,000 of 1,000 bytes (oom_kill counter of "
        f"memory cgroup {cg} rose 0 -> 1 since the last heartbeat); last heartbeat "
        "2026-11-30T01:02:03Z: step 7, RSS 123 B, cgroup working set 500 of limit 1,000 B")
    # no counter rise, but the working set was within 2% of the limit at the last beat
    got = heartbeat.diagnose_lost(_beat(cg, 985, 1000, 1))
    assert got["diagnosis"].startswith("likely killed by the cgroup OOM killer at 985 of 1,000 bytes "
                                       "(working set within 2% of the limit")
    # neither: killed by something else, last heartbeat given
    got = heartbeat.diagnose_lost(_beat(cg, 500, 1000, 1))
    assert got["oom"] is None and got["diagnosis"].startswith(
        "ended without recording its end (killed: SIGKILL, OOM or host loss); last heartbeat")
    # the cgroup is gone (a restarted container): only the usage rule can speak
    assert heartbeat.diagnose_lost(_beat(tmp_path / "gone", 500, 1000, 0))["oom"] is None
    assert "left no heartbeat" in heartbeat.diagnose_lost(None)["diagnosis"]
    # a cgroup without a memory limit says so, never "of limit none B"
    got = heartbeat.diagnose_lost(_beat(tmp_path / "gone", 500, None, 0))["diagnosis"]
    assert got.endswith("step 7, RSS 123 B, cgroup working set 500 B (no memory limit)")


def test_heartbeat_file_is_rewritten_atomically_with_step_and_memory(tmp_path):
    run = RunLayout(tmp_path)
    run.launches.mkdir()
    mon = heartbeat.LaunchMonitor(run.heartbeat("L"), "L", interval_s=0.05).start()
    mon.step_from, mon.step, mon.phase = 0, 3, "training"
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        data = heartbeat.read_heartbeat(run, "L")
        if data and data["step"] == 3:
            break
        time.sleep(0.02)
    mon.stop()
    data = heartbeat.read_heartbeat(run, "L")
    assert (data["phase"], data["step"], data["launch_id"]) == ("ended", 3, "L")
    assert data["rss_bytes"] > 0 and data["peak_rss_bytes"] >= data["rss_bytes"]
    assert [p.name for p in run.launches.iterdir()] == ["L.heartbeat.json"]  # no temp files left


def test_scope_hashes_are_cached_by_file_content_and_a_bad_cache_is_recomputed(tmp_path):
    if sys.gettrace() is not None:
        pytest.skip("a debugger or coverage tracer is active: the tracer stands aside by design")
    here = Path(__file__).resolve()
    truth = fingerprint.scopes(here.read_bytes()).hash("_helper_called_in_the_window")

    def run() -> dict:
        t = fingerprint.Tracer(root=here.parent, cache=tmp_path).start()
        _helper_called_in_the_window()
        t.close_window()
        return t.record()["executed"]["test_record.py"]

    first = run()
    assert first["_helper_called_in_the_window"] == truth
    (cached,) = [p for p in tmp_path.glob("*.json")  # this file's (others of tests/record too)
                 if json.loads(p.read_text())["file"].endswith("test_record.py")]
    assert json.loads(cached.read_text())["scopes"]["_helper_called_in_the_window"] == truth
    assert run() == first  # from the cache
    cached.write_text("{not json")
    assert run() == first  # a torn cache file is recomputed
    data = json.loads(cached.read_text())
    data["scopes"].pop("_helper_called_in_the_window")
    cached.write_text(json.dumps(data))
    assert run() == first  # a cache that lacks a hash: the source is parsed for it
