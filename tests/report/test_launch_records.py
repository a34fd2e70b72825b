"""`aleph runs diff` over per-launch records (fabricated run directories): launches that
trained nothing add no caveat, a lost launch carries its diagnosis, and changes of
environment, envelope or execution between launches name the launch and its steps."""

from __future__ import annotations

import copy

from fixtures.runs import environment, make_run

from aleph.errors import EXIT_STOPPED
from aleph.report.diff import diff_runs
from aleph.report.diff_text import format_diff

EXECUTION = {"device": "cpu", "autocast": "off", "num_threads": 1, "deterministic": True,
             "compile": False, "world_size": 1}
ENVELOPE = {"memory_limit_bytes": 110_999_998_464, "cpu_cores": 17.85, "cpuset": "0-23,48-71",
            "numa_nodes": [0], "cgroup_version": 2,
            "gpus": [{"name": "NVIDIA A40", "memory_mib": 46068, "uuid": "GPU-b5d0"}]}


def launch(i: int, action: str, steps, status="complete", code=0, **extra) -> dict:
    t = f"2026-08-07T0{i}:00:00Z"
    entry = {"launch_id": f"L{i}", "start": t, "end": t.replace(":00:00Z", ":30:00Z"),
             "status": status, "exit_status": code, "action": action,
             "steps": {"from": steps[0], "to": steps[1]} if steps else {"from": None, "to": None},
             "code": {"revision": "abc1234", "dirty": False, "source_sha256": "s" * 64},
             "environment": environment(), "envelope": copy.deepcopy(ENVELOPE),
             "execution": dict(EXECUTION)}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(entry.get(key), dict):
            entry[key] = {**entry[key], **value}
        else:
            entry[key] = value
    return entry


def _run(root, launches, **kw):
    return make_run(root, "a2_dense", steps=0, train_scalars=False, launches=launches, **kw)


def test_launches_that_trained_nothing_add_no_caveat(tmp_path):
    a = _run(tmp_path / "x", [launch(1, "trained", (0, 64))])
    b = _run(tmp_path / "y", [
        launch(1, "trained", (0, 64)),
        launch(2, "no-op: already complete", (64, 64), note="already complete"),
        # a relaunch with other inputs, refused before its first step (exit 2), last of all
        launch(3, "refused", None, status="failed", code=2, note="DataError: inputs changed",
               environment=environment(torch="9.9"), execution={"num_threads": 8}),
    ])
    d = diff_runs(a, b)
    assert d.verdict == "equivalent", format_diff(d)
    texts = [f.text for f in d.findings if f.section == "launches"]
    assert "B: launch 3 (L3): refused (failed, exit status 2: DataError: inputs changed); trained " \
           "nothing the run kept" in texts


def test_a_refused_launch_between_two_that_trained_is_no_part_of_the_resume_caveat(tmp_path):
    a = _run(tmp_path / "x", [launch(1, "trained", (0, 64))])
    b = _run(tmp_path / "y", [
        launch(1, "trained", (0, 32), status="stopped", code=EXIT_STOPPED),
        launch(2, "refused", None, status="failed", code=2, note="DataError: inputs changed"),
        launch(3, "resumed", (32, 64)),
    ])
    d = diff_runs(a, b)
    assert d.caveats == ["B: 2 launch(es) trained steps the run kept: resumed 1 time(s)"], format_diff(d)
    assert ("info", "B: 3 launch(es); 1 trained nothing the run kept (1 refused before training)") in [
        (f.level, f.text) for f in d.findings if f.section == "launches"]
    assert not any("L2" in text for text in d.caveats + d.blockers)


def test_a_lost_launch_that_trained_carries_its_diagnosis(tmp_path):
    diagnosis = ("likely killed by the cgroup OOM killer at 1,000 of 1,000 bytes (oom_kill counter "
                 "of memory cgroup /x rose 0 -> 1 since the last heartbeat); last heartbeat ...")
    a = _run(tmp_path / "x", [launch(1, "trained", (0, 64))])
    b = _run(tmp_path / "y", [
        launch(1, "trained", (0, 25), status="lost", code=None, note=diagnosis,
               lost={"diagnosis": diagnosis}),
        launch(2, "resumed", (20, 64))])
    d = diff_runs(a, b)
    assert f"B: launch 1 (L1, steps 0-20) ended lost (no exit status recorded): {diagnosis}" in d.caveats
    # lost before its first step: information only
    b2 = _run(tmp_path / "z", [
        launch(1, "nothing trained", (None, None), status="lost", code=None, lost={"diagnosis": diagnosis}),
        launch(2, "trained", (0, 64))])
    d = diff_runs(a, b2)
    assert d.verdict == "equivalent", format_diff(d)


def test_changes_between_launches_name_the_launch_and_its_steps(tmp_path):
    a = _run(tmp_path / "x", [launch(1, "trained", (0, 64))])
    b = _run(tmp_path / "y", [
        launch(1, "trained", (0, 32), status="stopped", code=EXIT_STOPPED, note="SIGTERM after step 32"),
        launch(2, "resumed", (32, 64), execution={"num_threads": 2},
               envelope={"memory_limit_bytes": 50_000_000_000},
               environment=environment(driver="575.0"))])
    d = diff_runs(a, b)
    text = format_diff(d)
    first, second = "B launch 1 (L1, steps 0-32)", "B launch 2 (L2, steps 32-64)"
    assert (f"{second} vs {first}: num_threads 1 vs 2: not bitwise comparable: the CPU intra-op "
            "thread count changes how reductions are split and summed") in d.caveats, text
    assert any(c.startswith(f"{second} vs {first}: memory limit (bytes) 110,999,998,464 vs "
                            "50,000,000,000") for c in d.caveats), text
    assert f"{second} vs {first}: driver 570.195.03 vs 575.0" in d.caveats, text
    # the run-to-run sections compare the first launches that trained: identical here
    assert not any(c.startswith("num_threads") for c in d.caveats)


def test_execution_and_envelope_differences_between_runs(tmp_path):
    a = _run(tmp_path / "x", [launch(1, "trained", (0, 64))])
    b = _run(tmp_path / "y", [launch(1, "trained", (0, 64),
                                     execution={"device": "cuda:0", "autocast": "bf16"},
                                     envelope={"cpu_cores": 16.0, "cpuset": "0-15"})],
             config={"device": "cuda"})
    d = diff_runs(a, b)
    assert ("device cpu vs cuda:0: not bitwise comparable: CPU and CUDA kernels compute "
            "differently (and bf16 autocast applies only on CUDA)") in d.caveats
    assert "autocast off vs bf16: not bitwise comparable: bf16 autocast computes the forward pass " \
           "in bfloat16" in d.caveats
    assert any(c.startswith("CPU quota (cores) 17.85 vs 16.0") for c in d.caveats)
    levels = {f.text: f.level for f in d.findings}
    assert levels["cpuset 0-23,48-71 vs 0-15"] == "info"
    # the config's device difference is judged from what ran, not counted twice
    assert levels["device: 'absent' vs 'cuda' (judged from what each launch executed: device in "
                  "the execution section)"] == "info"


def test_without_execution_records_a_numeric_config_field_is_a_caveat(tmp_path):
    a = make_run(tmp_path / "x", "a2_dense", steps=0, train_scalars=False, config={"num_threads": 1})
    b = make_run(tmp_path / "y", "a2_dense", steps=0, train_scalars=False, config={"num_threads": 2})
    assert diff_runs(a, b).caveats == [
        "num_threads: 1 vs 2: not bitwise comparable: the CPU intra-op thread count changes how "
        "reductions are split and summed"]
