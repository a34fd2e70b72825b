"""`aleph runs diff`: each section, the three verdicts, and git hunks from a real checkout."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.runs import environment, make_run

from aleph._io import atomic_write_json, read_json
from aleph.cli import main
from aleph.errors import EXIT_STOPPED, AlephError
from aleph.record.layout import FORMAT_VERSION
from aleph.report.diff import diff_runs
from aleph.report.diff_text import format_diff


def edit(run, name, fn):
    data = read_json(run / name)
    fn(data)
    atomic_write_json(run / name, data)


def store(root, built_by, chunk_hashes, data=b"\x00\x01" * 768):
    """A target store directory: manifest.json (chunks with sha256) + targets.bin."""
    root.mkdir(parents=True)
    (root / "targets.bin").write_bytes(data)
    atomic_write_json(root / "manifest.json", {
        "built_by": built_by, "dtype": "float16", "dim": 768, "data_file": "targets.bin",
        "chunks": [{"path": str(root / f"c{i}.pt"), "sha256": h, "rows": 1} for i, h in enumerate(chunk_hashes)]})
    return str(root)


def levels(d, section):
    return [(f.level, f.text) for f in d.findings if f.section == section]


def test_arms_of_one_experiment_are_equivalent(tmp_path):
    a = make_run(tmp_path / "x", "a1_anchored", steps=0, train_scalars=False)
    b = make_run(tmp_path / "y", "a2_dense", steps=0, train_scalars=False)
    d = diff_runs(a, b)
    assert d.verdict == "equivalent", format_diff(d)
    assert ("info", "arm: 'a1_anchored' vs 'a2_dense' (experiment variable)") in levels(d, "config")
    text = format_diff(d)
    assert text.splitlines()[-1] == "verdict: EQUIVALENT"
    assert "package set identical" in text and "torch 2.4.1+cu124" in text


def test_same_content_different_holding_is_a_named_caveat(tmp_path):
    a = make_run(tmp_path / "x", "a2_dense", steps=0, implementation="in_ram", train_scalars=False)
    b = make_run(tmp_path / "y", "a2_dense", steps=0, implementation="streaming", train_scalars=False)
    sa = store(tmp_path / "sa", "in_ram", ["h0", "h1"])
    sb = store(tmp_path / "sb", "streaming", ["h0", "h1"])
    edit(a, "manifest.json", lambda m: m["target_store"].update(dir=sa, manifest_sha256="1" * 64))
    edit(b, "manifest.json", lambda m: m["target_store"].update(dir=sb, manifest_sha256="2" * 64))
    d = diff_runs(a, b)
    assert d.verdict == "equivalent with caveats"
    assert len(d.caveats) == 1 and d.caveats[0].startswith(
        "same content, different holding: A consumed targets through the in_ram store, "
        "B through the streaming store; contents byte-identical (same source chunks")
    assert "data files re-hashed" in d.caveats[0]
    # the config's store_implementation difference is left to this section, not a blocker
    assert ("info", "store_implementation: 'in_ram' vs 'streaming' (see target store)") in levels(d, "config")

    (tmp_path / "sb" / "targets.bin").write_bytes(b"\x00\x02" * 768)  # same sources, other bytes
    assert diff_runs(a, b).blockers[0].startswith("store data files differ")
    sc = store(tmp_path / "sc", "streaming", ["h0", "OTHER"])
    edit(b, "manifest.json", lambda m: m["target_store"].update(dir=sc))
    d = diff_runs(a, b)
    assert d.verdict == "not equivalent" and "source chunks differ" in d.blockers[0]


def test_environment_and_config_blockers_and_caveats(tmp_path, capsys):
    env_b = environment(torch="2.5.1+cu124", driver="575.0",
                        packages={"torch": "2.5.1+cu124", "numpy": "1.26.3", "tqdm": "4.66.0"})
    a = make_run(tmp_path / "x", "a2_dense", steps=0, train_scalars=False)
    b = make_run(tmp_path / "y", "a2_dense", steps=0, env=env_b, train_scalars=False,
                 config={"lr": 1e-3, "log_every_steps": 99})
    d = diff_runs(a, b)
    assert d.verdict == "not equivalent"
    assert set(d.blockers) == {"torch 2.4.1+cu124 vs 2.5.1+cu124", "lr: 0.002 vs 0.001"}
    assert set(d.caveats) == {"driver 570.195.03 vs 575.0", "package tqdm 4.67.1 vs 4.66.0"}
    assert ("info", "log_every_steps: 10 vs 99 (does not change what is computed)") in levels(d, "config")
    out = tmp_path / "diff.json"
    assert main(["runs", "diff", str(a), str(b), "--json", str(out)]) == 1
    tail = capsys.readouterr().out.splitlines()[-5:]  # the verdict, then what it rests on
    assert tail[0] == "verdict: NOT EQUIVALENT"
    assert [t.split(":")[0] for t in tail[1:]] == ["  blocker 1", "  blocker 2", "  caveat 1", "  caveat 2"]
    assert json.loads(out.read_text())["verdict"] == "not equivalent"


def test_a_different_init_is_a_blocker(tmp_path):
    a = make_run(tmp_path / "x", "a1_anchored", steps=0, train_scalars=False,
                 config={"init": "e1_orthogonal"})
    b = make_run(tmp_path / "y", "a2_dense", steps=0, train_scalars=False,
                 config={"init": "normal_0.02"})
    assert diff_runs(a, b).blockers == ["init: 'e1_orthogonal' vs 'normal_0.02'"]


def test_a_run_of_another_format_version_is_refused_in_one_line(tmp_path, capsys):
    a = make_run(tmp_path / "x", "a2_dense", steps=0, train_scalars=False)
    b = make_run(tmp_path / "y", "a2_dense", steps=0, train_scalars=False)
    edit(b, "config.json", lambda c: c.pop("format_version"))  # as runs before versions were
    assert main(["runs", "diff", str(a), str(b)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        f"{b / 'config.json'}: format_version None, expected 1 (written by another version of "
        "aleph-e1; this one reads only its own)")
    edit(b, "config.json", lambda c: c.update(format_version=1))
    edit(b, "manifest.json", lambda m: m.update(format_version=2))
    with pytest.raises(AlephError, match=r"manifest\.json: format_version 2, expected 1 \("):
        diff_runs(a, b)


def test_launch_history_gaps_missing_headers_and_failures(tmp_path):
    launches = [
        {"launch_id": "L1", "start": "2026-08-07T02:53:28Z", "end": "2026-08-07T03:00:00Z",
         "exit_status": 137, "status": "lost"},
        {"launch_id": "L2", "start": "2026-08-07T04:00:00Z", "end": "2026-08-07T05:00:00Z",
         "exit_status": 0, "status": "complete"},
    ]
    a = make_run(tmp_path / "x", "a1_anchored", steps=0, train_scalars=False)
    b = make_run(tmp_path / "y", "a1_anchored", steps=0, train_scalars=False, launches=launches)
    # L2's log begins with another launch's lines, as the seed's a1-s1 log did
    log = b / "launches" / "L2.log"
    log.write_text("[DUP] 2026-08-07T04:00:00Z launch DUP: rank 0 of 1\n" + log.read_text())
    d = diff_runs(a, b)
    assert d.verdict == "equivalent with caveats"
    texts = [t for _, t in levels(d, "launches")]
    assert "B: 2 launch(es) trained steps the run kept: resumed 1 time(s)" in texts
    assert "B: gap of 1h00m00s before launch 2 (L2)" in texts
    assert "B: launch 1 (L1) ended lost with exit status 137" in texts
    assert any(t.startswith("B: launch 2 (L2): log L2.log does not start with this launch's lines") for t in texts)

    log.write_text("[L2] 2026-08-07T04:00:00Z launch L2: rank 0 of 1\n[L2] 2026-08-07T04:00:01Z step 1\n")
    assert "B: launch 2 (L2): log L2.log lacks header line(s): allocator cap, VRAM probe, config echo, resume line" in diff_runs(a, b).caveats

    edit(b, "manifest.json", lambda m: m["launches"][1].update(start="2026-08-07T02:59:00Z"))
    assert any("overlapping launches" in c for c in diff_runs(a, b).caveats)
    edit(b, "manifest.json", lambda m: m["launches"][1].update(exit_status=1, status="failed"))
    assert diff_runs(a, b).blockers == ["B: launch 2 (L2) ended failed with exit status 1: the run did not finish"]


REPO_ROOT = Path(__file__).resolve().parents[2]
NO_GIT = "no git in this environment: code hunks not listed"
needs_git = pytest.mark.skipif(shutil.which("git") is None,
                               reason="git not installed (the image has none): the no-git "
                               "report is tested by test_runs_diff_without_git_*")


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def _commit(repo, message):
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", message)
    return _git(repo, "rev-parse", "HEAD")


@needs_git
def test_code_difference_lists_files_and_hunks_from_a_checkout(tmp_path):
    repo = tmp_path / "repo"
    (repo / "aleph").mkdir(parents=True)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.org")
    _git(repo, "config", "user.name", "t")
    (repo / "aleph" / "store.py").write_text("A = 1\nB = 2\n")
    rev1 = _commit(repo, "one")
    (repo / "aleph" / "store.py").write_text("A = 1\nB = 3\nC = 4\n")
    (repo / "README.md").write_text("not executed code: not part of the diff\n")
    rev2 = _commit(repo, "two")
    a = make_run(tmp_path / "x", "a1_anchored", steps=0, train_scalars=False, revision=rev1, source="1" * 64)
    b = make_run(tmp_path / "y", "a3_random", steps=0, train_scalars=False, revision=rev2 + "-dirty", source="2" * 64)
    d = diff_runs(a, b, repo=repo)
    assert d.verdict == "equivalent with caveats"
    assert d.caveats[0].startswith(f"code differs: A executed {rev1} (source 111111111111)")
    assert any("B ran from a modified working tree" in c for c in d.caveats)
    assert [(f.path, f.added, f.removed) for f in d.code_diff.files] == [("aleph/store.py", 2, 1)]
    text = format_diff(d)
    assert "aleph/store.py (+2 -1; 1 hunk(s))" in text and "aleph/store.py @@ -1,2 +1,3 @@" in text
    assert "+C = 4" in format_diff(d, patch=True)
    # without the checkout the difference is still a caveat, and the report says why no hunks
    d = diff_runs(a, b, repo=tmp_path)
    assert d.code_diff is None and d.caveats[0].startswith("code differs")
    assert ("info", f"{tmp_path} is not a git checkout: code hunks not listed") \
        in levels(d, "code")
    # git and a checkout, but a revision the checkout does not hold: named, in one line
    edit(a, "manifest.json", lambda m: _set_code(m, revision="f" * 40))
    assert levels(diff_runs(a, b, repo=repo), "code")[-1] == (
        "info", f"revision ffffffffffff not in the git checkout at {repo}: code hunks not listed")
    edit(a, "manifest.json", lambda m: _set_code(m, revision=rev1))
    # two dirty trees on one base revision: no hunks to show, and the report says why
    edit(a, "manifest.json", lambda m: _set_code(m, revision=rev2 + "-dirty"))
    d = diff_runs(a, b, repo=repo)
    assert d.code_diff is None and any(f.text.startswith("same base revision") for f in d.findings)
    # identical source under two revisions is not a caveat
    edit(b, "manifest.json", lambda m: _set_code(m, source_sha256="1" * 64))
    edit(a, "manifest.json", lambda m: _set_code(m, revision=rev1))
    assert diff_runs(a, b, repo=repo).caveats == []


def _set_code(manifest: dict, **code) -> None:
    """Set fields of the code record of every launch of a manifest."""
    for launch in manifest["launches"]:
        launch["code"].update(code)


def _python_only_path(tmp_path: Path) -> str:
    """A PATH directory holding only this interpreter: no git (nor anything else) on it."""
    bin_dir = tmp_path / "python-only-bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    return str(bin_dir)


def _runs_diff_cli(args: list[str], path: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": path, "PYTHONPATH": str(REPO_ROOT), "HOME": str(cwd), "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "aleph", "runs", "diff", *args], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def test_runs_diff_without_git_says_so_where_the_hunks_would_be(tmp_path):
    """The real `aleph runs diff`, run with a PATH that holds no git (as in the image)."""
    a = make_run(tmp_path / "x", "a1_anchored", steps=0, train_scalars=False,
                 revision="1" * 40, source="1" * 64)
    b = make_run(tmp_path / "y", "a2_dense", steps=0, train_scalars=False,
                 revision="2" * 40, source="2" * 64)
    path = _python_only_path(tmp_path)
    assert shutil.which("git", path=path) is None
    # --repo names this repository's own checkout: only the missing git can stop the hunks
    p = _runs_diff_cli([str(a), str(b), "--repo", str(REPO_ROOT), "--json",
                        str(tmp_path / "d.json")], path, tmp_path)
    assert p.returncode == 0, p.stderr  # equivalent with caveats
    lines = p.stdout.splitlines()
    code = lines[lines.index("[code]") + 1:]
    code = code[:code.index("")]
    assert code == [
        f"  CAVEAT  code differs: A executed {'1' * 40} (source 111111111111), "
        f"B executed {'2' * 40} (source 222222222222)",
        f"  info    {NO_GIT}"]
    assert "verdict: EQUIVALENT WITH CAVEATS" in lines
    report = json.loads((tmp_path / "d.json").read_text())
    assert report["code_diff"] is None
    assert {"section": "code", "level": "info", "text": NO_GIT} in report["findings"]


def test_runs_diff_without_git_is_silent_about_hunks_when_the_code_is_the_same(tmp_path):
    a = make_run(tmp_path / "x", "a1_anchored", steps=0, train_scalars=False)
    b = make_run(tmp_path / "y", "a2_dense", steps=0, train_scalars=False)
    p = _runs_diff_cli([str(a), str(b)], _python_only_path(tmp_path), tmp_path)
    assert p.returncode == 0, p.stderr
    assert "identical source" in p.stdout and NO_GIT not in p.stdout


def test_bad_run_directories_are_named(tmp_path, capsys):
    a = make_run(tmp_path / "x", "a2_dense", steps=0, train_scalars=False)
    assert main(["runs", "diff", str(a), str(tmp_path / "missing")]) == 2
    assert "missing: not a run directory" in capsys.readouterr().err
    edit(a, "manifest.json", lambda m: m["launches"][0].pop("environment"))
    assert main(["runs", "diff", str(a), str(a)]) == 2
    assert "manifest.json: missing field 'launches[0].environment'" in capsys.readouterr().err


def test_launch_statuses_are_the_trainers_and_each_is_judged(tmp_path):
    from aleph.record.launch import STATUSES

    a = make_run(tmp_path / "x", "a2_dense", steps=0, train_scalars=False)
    b = make_run(tmp_path / "y", "a2_dense", steps=0, train_scalars=False, launches=[
        {"launch_id": "L1", "start": "2026-08-07T02:00:00Z", "end": "2026-08-07T03:00:00Z"},
        {"launch_id": "L2", "start": "2026-08-07T04:00:00Z", "end": "2026-08-07T05:00:00Z",
         "exit_status": 0, "status": "complete"}])
    assert {x["status"] for x in read_json(a / "manifest.json")["launches"]} <= set(STATUSES)

    def first(status, code):
        edit(b, "manifest.json", lambda m: m["launches"][0].update(status=status, exit_status=code))
        d = diff_runs(a, b)
        return d.verdict, [c for c in d.caveats if c != "B: 2 launch(es) trained steps the run kept: resumed 1 time(s)"], d.blockers

    # a stop (SIGTERM, exit 76) followed by a resume is the ordinary resume: no extra finding
    assert first("stopped", EXIT_STOPPED) == ("equivalent with caveats", [], [])
    assert first("failed", 65) == ("equivalent with caveats",
                                   ["B: launch 1 (L1) ended failed with exit status 65"], [])
    # the trainer marks a killed launch 'lost' without an exit status
    assert first("lost", None)[1] == ["B: launch 1 (L1) ended lost (no exit status recorded)"]
    assert first("running", None)[1] == ["B: launch 1 (L1) ended running (no exit status recorded)"]
    assert first("completed", 0)[1] == [
        "B: launch 1 (L1) has status 'completed', which the trainer does not write "
        "(running, complete, stopped, failed, lost): how it ended is unknown"]

    first("complete", 0)
    edit(b, "manifest.json", lambda m: m["launches"][1].update(status="stopped", exit_status=0))
    assert diff_runs(a, b).blockers == ["B: launch 2 (L2) ended stopped with exit status 0: "
                                        "the run did not finish"]


def test_data_locations_are_judged_by_content_not_by_path(tmp_path):
    """A replication on another host reads the same data from other paths: not a blocker;
    the same path holding other captions is one (token store key = captions content)."""
    a = make_run(tmp_path / "x", "a2_dense", steps=0, train_scalars=False,
                 config={"smoke_data": False, "captions": "/data/cc12m.parquet",
                         "targets": ["/data/t/a.pt"], "tokenizer": "bert-base-uncased"})
    b = make_run(tmp_path / "y", "a2_dense", steps=0, train_scalars=False,
                 config={"smoke_data": False, "captions": "/mnt/vol/cc12m.parquet",
                         "targets": ["/mnt/vol/t/a.pt"], "tokenizer": "/mnt/vol/bert"})
    for run in (a, b):
        key = f"{run}/cache/tokens/0123456789abcdef"  # two work roots, one cache key
        edit(run, "manifest.json", lambda m, key=key: m["target_store"].update(token_store=key))
    d = diff_runs(a, b)
    assert d.verdict == "equivalent", format_diff(d)
    assert ("info", "captions: '/data/cc12m.parquet' vs '/mnt/vol/cc12m.parquet' (a data location: "
            "contents judged in the targets section)") in levels(d, "config")
    assert any(lv == "same" and "same token store key 0123456789abcdef" in t for lv, t in levels(d, "targets"))

    edit(b, "manifest.json", lambda m: m["target_store"].update(token_store="/w/cache/tokens/fedcba9876543210"))
    assert diff_runs(a, b).blockers == [
        "different captions, tokenizer or max_len: token store keys 0123456789abcdef vs fedcba9876543210"]
    edit(b, "manifest.json", lambda m: m["target_store"].pop("token_store"))
    assert diff_runs(a, b).caveats == ["the configs name different data locations and a run records "
                                       "no token store key: caption contents not compared"]


def test_a_log_of_a_launch_whose_id_extends_this_one_is_not_its_header(tmp_path):
    """Two launches in one second on one host differ only in the pid: ...-451 vs ...-4512."""
    from fixtures.runs import launch_log_lines

    from aleph.report.launches import header_problem

    log = tmp_path / "L-451.log"
    log.write_text("\n".join(launch_log_lines("L-4512")) + "\n")
    assert "does not start with this launch's lines" in header_problem(log, "L-451")
    log.write_text("\n".join(launch_log_lines("L-451")) + "\n")
    assert header_problem(log, "L-451") is None


def test_unknown_revisions_are_not_called_the_same_base(tmp_path):
    a = make_run(tmp_path / "x", "a2_dense", steps=0, train_scalars=False, revision="unknown", source="1" * 64)
    b = make_run(tmp_path / "y", "a2_dense", steps=0, train_scalars=False, revision="unknown", source="2" * 64)
    d = diff_runs(a, b)
    texts = [t for _, t in levels(d, "code")]
    assert d.caveats == ["code differs: A executed unknown (source 111111111111), B executed unknown "
                         "(source 222222222222)"]
    assert not any("same base revision" in t for t in texts)
    assert any("records no code revision" in t for t in texts)


def test_a_launch_that_found_the_run_complete_is_not_a_resume(tmp_path):
    from aleph.record.launch import NOOP, NOTHING_TO_TRAIN, RESUMED, TRAINED

    a = make_run(tmp_path / "x", "a2_dense", steps=0, train_scalars=False)
    b = make_run(tmp_path / "y", "a2_dense", steps=0, train_scalars=False, launches=[
        {"launch_id": "L1", "start": "2026-08-07T02:00:00Z", "end": "2026-08-07T03:00:00Z",
         "exit_status": 0, "status": "complete", "note": "128 steps", "action": TRAINED},
        {"launch_id": "L2", "start": "2026-08-07T04:00:00Z", "end": "2026-08-07T04:00:05Z",
         "exit_status": 0, "status": "complete", "note": NOTHING_TO_TRAIN, "action": NOOP}])
    d = diff_runs(a, b)
    assert d.verdict == "equivalent" and d.caveats == []
    assert ("info", "B: 2 launch(es); 1 trained nothing the run kept (1 found the run already complete)") in [
        (f.level, f.text) for f in d.findings if f.section == "launches"]
    edit(b, "manifest.json", lambda m: m["launches"][1].update(note="64 steps", action=RESUMED))
    assert diff_runs(a, b).caveats == ["B: 2 launch(es) trained steps the run kept: resumed 1 time(s)"]


def test_runs_diff_says_how_each_run_differs_from_the_e1_preset(tmp_path):
    from aleph.report.comparability import e1_preset

    a = make_run(tmp_path / "x", "a1_anchored", steps=0, train_scalars=False)
    atomic_write_json(a / "config.json", {**e1_preset(), "arm": "a1_anchored", "seed": 0,
                                          "format_version": FORMAT_VERSION,
                                          "captions": "/d/c.parquet", "targets": ["/d/t"]})
    edit(a, "manifest.json", lambda m: m["target_store"].update(rows=31_905_616))
    b = make_run(tmp_path / "y", "a2_dense", steps=0, train_scalars=False)
    text = format_diff(diff_runs(a, b))
    section = text.split("[vs E1]\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert section[0] == ("  info    A: E1's setup (model, e1 preset config, training rows, "
                          "tokenizer) (not evaluated: tasks not judged)")
    assert section[1].startswith("  info    B: not comparable to P: model shape not recorded (E1: 12x512)")
    assert "lr=0.002 (e1: 0.0005)" in section[1] and "smoke_data=True (e1: False)" in section[1]
    assert "trained on 2,048 target rows (E1: 31,905,616)" in section[1]
    assert "tokenizer the smoke data's own (E1: bert-base-uncased)" in section[1]
    assert section[1].endswith("(not evaluated: tasks not judged)")
