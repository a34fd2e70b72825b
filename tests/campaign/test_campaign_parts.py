"""The campaign's parts without training: devices, spec, state file, outcome policy, the run
lock probe, the CLI's one-line refusals, and the dependency direction."""

from __future__ import annotations

import ast
import io
import json
import os
import sys
from pathlib import Path

import pytest

from aleph.campaign import procs
from aleph.campaign.runner import Campaign
from aleph.campaign.spec import Device, check_devices, make_spec, parse_devices, resolve_configs
from aleph.campaign.state import STATE_FILE, State, campaign_dir
from aleph.cli import main
from aleph.errors import EXIT_STOPPED, ConfigError, DataError
from aleph.train.identity import RunLock

REPO = Path(__file__).resolve().parents[2]


def _spec(name="t", overrides=("max_steps=8",), arms=("a2_dense",), seeds=(0,)):
    return make_spec(name, "smoke", None, list(overrides), list(arms), list(seeds))


# --- devices ------------------------------------------------------------------------------

def test_cpu_slots_split_the_affinity_into_contiguous_groups():
    devs = parse_devices("cpu:2", cpus={0, 1, 2, 3})
    assert [(d.name, d.kind, d.cuda_visible, d.cpus) for d in devs] == [
        ("cpu0", "cpu", "", (0, 1)), ("cpu1", "cpu", "", (2, 3))]
    assert [d.cpus for d in parse_devices("cpu:3", cpus={4, 5, 6, 7, 8})] == [(4,), (5, 6), (7, 8)]
    # fewer CPUs than slots: the runs share them (no affinity set)
    assert [d.cpus for d in parse_devices("cpu:3", cpus={0, 1})] == [None, None, None]
    assert "CPUs 0-1, no GPU" in parse_devices("cpu:1", cpus={0, 1})[0].describe()


def test_gpu_indices_map_through_cuda_visible_devices():
    two = parse_devices("all", gpu_count=lambda: 2, visible="")
    assert [(d.name, d.cuda_visible) for d in two] == [("gpu0", "0"), ("gpu1", "1")]
    mapped = parse_devices("1,0", gpu_count=lambda: 2, visible="3,5")
    assert [(d.name, d.cuda_visible) for d in mapped] == [("gpu1", "5"), ("gpu0", "3")]
    assert parse_devices("auto", gpu_count=lambda: 0, cpus={0})[0].name == "cpu0"
    assert [d.name for d in parse_devices("auto", gpu_count=lambda: 2, visible="")] == ["gpu0", "gpu1"]


@pytest.mark.parametrize("text,count,expect", [
    ("cpu:0", 0, "--devices 'cpu:0': expected cpu:N with N >= 1"),
    ("cpu:x", 0, "--devices 'cpu:x': expected cpu:N"),
    ("all", 0, "--devices all: no CUDA device is visible"),
    ("2", 2, "GPU 2 does not exist; this process sees 2 CUDA device(s)"),
    ("0,0", 2, "GPU 0 given more than once"),
    ("gpu", 2, "expected auto, all, GPU indices such as 0,1, or cpu:N"),
])
def test_bad_devices_are_one_line_errors(text, count, expect):
    with pytest.raises(ConfigError) as e:
        parse_devices(text, gpu_count=lambda: count, visible="")
    assert expect in str(e.value) and "\n" not in str(e.value)


def test_device_contradicting_the_config_is_refused_before_anything_runs():
    configs = resolve_configs(_spec())  # the smoke preset trains on CPU
    gpus = [Device("gpu0", "cuda", "0")]
    with pytest.raises(ConfigError, match="a2_dense-s0: config field 'device' is 'cpu' but "
                       "--devices names GPUs; add --set device=cuda"):
        check_devices(configs, gpus)
    check_devices(resolve_configs(_spec(overrides=("device=cuda",))), gpus)
    with pytest.raises(ConfigError, match="'device' is 'cuda' but --devices gives CPU slots"):
        check_devices(resolve_configs(_spec(overrides=("device=cuda",))), [Device("cpu0", "cpu", "")])


# --- spec -----------------------------------------------------------------------------------

def test_spec_queue_and_train_arguments():
    s = make_spec(None, "smoke", None, ["max_steps=8"], ["a1_anchored", "a3_random"], [0, 1])
    assert s.name == "smoke"
    assert [r for r, _, _ in s.runs()] == ["a1_anchored-s0", "a3_random-s0", "a1_anchored-s1",
                                           "a3_random-s1"]
    assert s.train_args("a3_random", 1) == ["--arm", "a3_random", "--seed", "1", "--preset",
                                            "smoke", "--set", "max_steps=8"]


@pytest.mark.parametrize("kwargs,expect", [
    ({"arms": ["a9"]}, "--arms: 'a9' is not an arm"),
    ({"seeds": [0, 0]}, "--seeds: 0 given more than once"),
    ({"seeds": [-1]}, "--seeds: -1 is negative"),
    ({"name": "../x"}, "--name '../x': expected 1-64 letters"),
])
def test_bad_spec_is_a_one_line_error(kwargs, expect):
    args = {"name": "t", "preset": "smoke", "config": None, "overrides": [],
            "arms": ["a2_dense"], "seeds": [0], **kwargs}
    with pytest.raises(ConfigError, match=expect.replace("(", r"\(").replace(".", r"\.")):
        make_spec(**args)


# --- state file -----------------------------------------------------------------------------

def test_restart_with_another_config_is_refused_naming_the_field(work):
    path = campaign_dir("t") / STATE_FILE
    state = State.open(path, _spec())
    state.save()
    assert State.open(path, _spec()).data["id"] == state.data["id"]  # same campaign
    with pytest.raises(ConfigError) as e:
        State.open(path, _spec(overrides=("max_steps=9",)))
    msg = str(e.value)
    assert "started with overrides ['max_steps=8'], this command gives ['max_steps=9']" in msg
    assert str(path) in msg and "--name" in msg


@pytest.mark.parametrize("edit,expect", [
    (lambda d: "{not json", "not valid JSON (line 1"),
    (lambda d: {**d, "schema": 7}, "field 'schema' is 7, expected 1"),
    (lambda d: {**d, "runs": {"a2_dense-s0": {**d["runs"]["a2_dense-s0"], "status": "odd"}}},
     "field 'runs.a2_dense-s0.status' is 'odd'"),
])
def test_a_damaged_state_file_is_named(work, edit, expect):
    path = campaign_dir("t") / STATE_FILE
    State.open(path, _spec()).save()
    new = edit(json.loads(path.read_text()))
    path.write_text(new if isinstance(new, str) else json.dumps(new))
    with pytest.raises(DataError) as e:
        State.open(path, _spec())
    assert expect in str(e.value) and str(path) in str(e.value)


# --- how a launch's end is settled ----------------------------------------------------------

def _campaign(retries=2) -> Campaign:
    spec = _spec()
    return Campaign(spec, resolve_configs(spec), [Device("cpu0", "cpu", "")], retries=retries,
                    out=io.StringIO())


def _ended(c: Campaign, rc: int | None, text: str = "aleph train: error: boom") -> dict:
    run = c.state.run("a2_dense-s0")
    n = len(run["launches"]) + 1
    entry = {"n": n, "device": "cpu0", "log": f"launches/a2_dense-s0.{n}.log", "outcome": "running",
             "pid": 1, "host": "h"}
    (c.dir / "launches").mkdir(parents=True, exist_ok=True)
    (c.dir / entry["log"]).write_text(f"some output\n{text}\n")
    run["launches"].append(entry)
    c._settle("a2_dense-s0", entry, rc)
    return entry


def test_failed_launches_are_retried_a_bounded_number_of_times(work):
    c = _campaign(retries=2)
    run = c.state.run("a2_dense-s0")
    for k in (1, 2):
        e = _ended(c, 1)
        assert (run["status"], run["failures"], e["outcome"]) == ("queued", k, "failed")
        assert f"retry {k} of 2" in run["note"] and "exit 1: aleph train: error: boom" in run["note"]
    _ended(c, -9, "Killed")
    assert (run["status"], run["failures"]) == ("failed", 3)
    assert "killed by SIGKILL" in run["note"] and "retries (2) used up" in run["note"]
    saved = json.loads((c.dir / STATE_FILE).read_text())["runs"]["a2_dense-s0"]
    assert saved["status"] == "failed" and len(saved["launches"]) == 3  # on disk at once


def test_a_refusal_is_not_retried_and_a_locked_run_is_waited_for(work):
    c = _campaign()
    run = c.state.run("a2_dense-s0")
    _ended(c, 75, "aleph train: error: run directory /w/runs/x is locked by another launch (pid "
           "42 on host h, started T); this launch changed nothing and exits")
    assert (run["status"], run["failures"]) == ("locked", 0)
    assert run["note"] == "run directory /w/runs/x is locked by another launch (pid 42 on host h, " \
        "started T)"
    _ended(c, 2, "aleph train: error: config field 'lr': expected a number > 0")
    assert (run["status"], run["failures"]) == ("failed", 0)
    assert "not retried" in run["note"] and "config field 'lr'" in run["note"]


def test_a_stop_is_not_a_failure_unless_it_came_from_outside(work):
    c = _campaign()
    run = c.state.run("a2_dense-s0")
    e = _ended(c, EXIT_STOPPED, "stopped by SIGTERM after step 3")  # someone else stopped the trainer
    assert (run["status"], run["failures"], e["outcome"]) == ("queued", 1, "stopped")
    c.stop_signal = "SIGTERM"  # the campaign itself was asked to stop
    e = _ended(c, EXIT_STOPPED, "stopped by SIGTERM after step 5")
    assert (run["status"], run["failures"], e["outcome"]) == ("queued", 1, "stopped")
    assert "resumes on restart" in run["note"]


def _running_entry(c: Campaign, pid, started, token="t/none/1") -> dict:
    from aleph.train.identity import hostname

    run = c.state.run("a2_dense-s0")
    entry = {"n": len(run["launches"]) + 1, "device": "cpu0", "log": "launches/a2_dense-s0.1.log",
             "outcome": "running", "pid": pid, "pid_start": started, "host": hostname(),
             "token": token, "exit_status": None}
    run["launches"].append(entry)
    run["status"] = "running"
    c.state.save()
    return entry


def test_restart_adopts_a_live_launch_and_settles_it_when_it_ends(work):
    import subprocess

    c = _campaign()
    child = subprocess.Popen(["sleep", "60"])
    try:
        entry = _running_entry(c, child.pid, procs.start_time(child.pid))
        c2 = _campaign()  # a restarted campaign process reads the same state
        c2._reconcile()
        assert set(c2.orphans) == {"a2_dense-s0"} and c2._busy() == {"cpu0"}
        c2._fill_devices()  # its device is busy: nothing is launched beside it
        assert c2.children == {} and c2.state.run("a2_dense-s0")["status"] == "running"
        assert "still running: waiting for it" in c2.out.getvalue()
    finally:
        child.kill()
        child.wait()
    c2._watch_orphans()  # gone, no run directory record: it ended unwatched, lost
    run = c2.state.run("a2_dense-s0")
    assert c2.orphans == {} and (run["status"], run["failures"]) == ("queued", 1)
    assert run["launches"][-1]["outcome"] == "lost" and entry["n"] == 1


def test_a_launch_that_stopped_unwatched_is_settled_as_stopped_not_as_exit_0(work):
    """A restarted campaign settles a launch it did not spawn from the run directory: the
    trainer recorded 'stopped' (exit 76); while the campaign stops, that is no failure."""
    from aleph.campaign import rundirs
    from aleph.record.layout import RunLayout
    from aleph.train.identity import hostname

    c = _campaign(retries=0)
    entry = _running_entry(c, 4242, 1.0)
    rd = rundirs.run_dir(c.configs["a2_dense-s0"])
    rd.mkdir(parents=True)
    RunLayout(rd).manifest.write_text(json.dumps({"format_version": 1, "launches": [
        {"pid": 4242, "host": hostname(), "status": "stopped", "exit_status": EXIT_STOPPED}]}))
    assert rundirs.launch_end(rd, 4242, hostname()) == ("stopped", EXIT_STOPPED)
    c.stop_signal = "SIGTERM"
    c._settle_unwatched("a2_dense-s0", entry)
    run = c.state.run("a2_dense-s0")
    assert (run["status"], run["failures"], entry["outcome"]) == ("queued", 0, "stopped")
    assert entry["exit_status"] == EXIT_STOPPED and "resumes on restart" in run["note"]


def test_a_launch_killed_before_its_spawn_never_started(work):
    c = _campaign()
    _running_entry(c, None, None, token=f"{c.state.data['id']}/a2_dense-s0/1")
    c2 = _campaign()
    c2._reconcile()
    run = c2.state.run("a2_dense-s0")
    assert c2.orphans == {} and (run["status"], run["failures"]) == ("queued", 0)
    assert run["launches"][-1]["outcome"] == "lost" and "never started" in run["note"]


# --- the run lock probe and process identity ------------------------------------------------

def test_lock_probe_is_the_trainers_run_lock(tmp_path):
    rd = tmp_path / "runs" / "a2_dense-s0"
    assert procs.lock_holder(rd) is None and not rd.exists()  # never creates the run dir
    held = RunLock(rd)
    held.acquire()
    try:
        msg = procs.lock_holder(rd)
        assert f"is locked by another launch (pid {os.getpid()} on host" in msg
    finally:
        held.release()
    assert procs.lock_holder(rd) is None


def test_a_recycled_pid_is_not_the_same_process():
    me = procs.start_time(os.getpid())
    assert me is not None and procs.alive(os.getpid(), me)
    assert not procs.alive(os.getpid(), str(int(me) + 1))  # same pid, another start time
    assert not procs.alive(None, None)


# --- the command line -----------------------------------------------------------------------

@pytest.mark.parametrize("argv,expect", [
    (["--devices", "cpu:0"], "--devices 'cpu:0'"),
    (["--set", "nosuch=1"], "unknown config field(s) nosuch"),
    (["--arms", "a9"], "--arms: 'a9' is not an arm"),
    (["--retries", "-1"], "--retries -1: expected an integer >= 0"),
    (["--tasks", "mytask"], "evaluation inputs of a2_dense-s0 (mytask): unknown STS task 'mytask'"),
])
def test_cli_refuses_before_anything_is_written(work, capsys, argv, expect):
    rc = main(["campaign", "--preset", "smoke", "--arms", "a2_dense", "--seeds", "0",
               "--devices", "cpu:1", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("aleph campaign: error: ") and expect in err, err
    assert err.count("\n") == 1 and not (work / "campaigns").exists() and not (work / "runs").exists()


def test_campaign_is_registered_without_importing_the_training_stack():
    import subprocess

    code = ("import sys; from aleph.cli import build_parser; build_parser(only='campaign'); "
            "print(sorted(m for m in sys.modules if m.startswith(('aleph.train', 'aleph.campaign', "
            "'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO)
    assert out.stdout.strip() == "[]"


# --- dependency direction -------------------------------------------------------------------

def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_nothing_below_imports_the_campaign_and_it_imports_only_stdlib_aleph_and_torch():
    pkg = REPO / "aleph"
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg)
        if rel.parts[0] == "campaign" or rel == Path("cli/campaign.py"):
            continue
        assert not any(n == "aleph.campaign" or n.startswith("aleph.campaign.")
                       for n in _imports(path)), rel
    # the one third-party import (the GPU count) is pinned in pip_freeze.txt
    assert "torch==2.4.1+cu124" in (REPO / "pip_freeze.txt").read_text().splitlines()
    mine = [*sorted((pkg / "campaign").glob("*.py")), pkg / "cli" / "campaign.py"]
    assert len(mine) >= 7
    for path in mine:
        for name in _imports(path):
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or top in ("aleph", "torch"), (path, name)


def test_evaluation_defaults_are_aleph_evals():
    from aleph.campaign.finish import EvalOptions
    from aleph.cli import build_parser
    from aleph.eval.evaluate import DEFAULT_PROBE_BATCH
    from aleph.eval.probe_data import DEFAULT_ROWS

    a = build_parser(only="campaign").parse_args(["campaign"])
    assert (a.probe_rows, a.probe_batch) == (DEFAULT_ROWS, DEFAULT_PROBE_BATCH)
    assert (EvalOptions().probe_rows, EvalOptions().probe_batch) == (DEFAULT_ROWS, DEFAULT_PROBE_BATCH)
    assert (a.arms, a.seeds, a.preset, a.devices) == (["a1_anchored", "a2_dense", "a3_random"],
                                                       [0, 1], "e1", "auto")


def test_a_stopped_campaign_does_not_wait_for_a_launch_on_another_host(work):
    """A launch another host runs (adopted through its run lock) cannot be signalled from
    here: a stop leaves it running, on record, instead of waiting for it without bound."""
    from aleph.campaign import rundirs

    c = _campaign()
    entry = _running_entry(c, 4242, 1.0)
    entry["host"] = "otherhost"
    c.state.save()
    rd = rundirs.run_dir(c.configs["a2_dense-s0"])
    rd.mkdir(parents=True)
    lock = RunLock(rd)  # what the other host's trainer holds
    lock.acquire()
    try:
        c2 = _campaign()
        c2._reconcile()
        assert c2.orphans["a2_dense-s0"].pid is None  # adopted: alive by its lock
        c2.stop_signal, c2.poll = "SIGTERM", 0.01
        c2._loop()  # returns at once (before: waited as long as that launch ran)
    finally:
        lock.release()
    assert "runs on otherhost, where this campaign cannot signal it" in c2.out.getvalue()
    assert c2.state.run("a2_dense-s0")["status"] == "running"


def test_a_console_that_went_away_does_not_stop_the_campaign_saying_things(work):
    """`aleph campaign | tee` and Ctrl-C (tee dies) or an ssh hangup: its first line after
    that failed with EPIPE/EIO before the stop was forwarded to the trainers."""
    r, w = os.pipe()
    os.close(r)  # the reader is gone: every write gets EPIPE
    out = os.fdopen(w, "w")
    spec = _spec()
    c = Campaign(spec, resolve_configs(spec), [Device("cpu0", "cpu", "")], out=out)
    c.say("SIGINT: stopping")  # no BrokenPipeError
    c.say("a2_dense-s0: SIGTERM sent to pid 1")
    assert "SIGTERM sent to pid 1" in (c.dir / "campaign.log").read_text()
    out.close()  # its descriptor now points at /dev/null: closing flushes nowhere, no error
