"""Run names and the console of a launch: where the run is, what preflight checks, the end summary."""

from __future__ import annotations

import pytest

from tests.train.conftest import run_train, train_cmd


def test_named_run_says_where_it_is_what_it_checks_and_what_comes_next(train_work):
    name = "exp/a2-warm"
    proc = run_train(train_work, train_cmd("a2_dense", 5, "warmup_steps=100") + ["--name", name])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = train_work / "runs" / "exp" / "a2-warm"
    out = proc.stdout
    assert f"aleph train: run {name} in {run_dir}; checking the inputs first" in out
    assert "aleph train: inputs: targets: 1,024 rows x 768" in out
    assert "aleph train: inputs: OK: 1,024 captions = 1,024 target rows" in out
    assert "(source sha256 " in out and f"), run directory {run_dir}\n" in out  # the launch line
    assert "warmup_steps 100 > total steps 32: warmup cut to 32" in out
    log = next((run_dir / "launches").glob("*.log")).read_text()
    for line in (f"summary: run {name} complete (step 32 of 32); run directory {run_dir}",
                 f"weights: {run_dir / 'weights' / 'final'}",
                 f"metrics: {run_dir / 'metrics.json'}",
                 f"next: `aleph eval {name}`, then `aleph report {name}`"):
        assert line in log and line in out, line
    assert not (train_work / "runs" / "smoke").exists()  # --name replaced the default name


def test_a_bad_name_is_refused_before_anything_is_written(train_work, capsys):
    from aleph.cli import main

    assert main(["train", "--arm", "a2_dense", "--preset", "smoke", "--name", "../elsewhere"]) == 2
    assert "--name '../elsewhere': expected a run name relative to <work root>/runs" in \
        capsys.readouterr().err
    assert not (train_work / "runs").exists()


def test_a_stopped_launch_ends_with_how_to_resume(work):
    from aleph.train.config import resolve
    from aleph.train.identity import run_dir_for
    from aleph.train.run import summary

    run_dir = run_dir_for(resolve("smoke", arm="a1_anchored", seed=2))
    (run_dir / "weights" / "step-00000064").mkdir(parents=True)
    text = summary(run_dir, "stopped", run_dir / "launches" / "L.log",
                   "aleph train --arm a1_anchored --preset smoke --seed 2", "step 70 of 128")
    assert text.splitlines()[0] == f"summary: run smoke/a1_anchored-s2 stopped (step 70 of 128); " \
        f"run directory {run_dir}"
    assert "resume: run the same command again (`aleph train --arm a1_anchored --preset smoke " \
        "--seed 2`); it continues from the last resume state" in text
    assert f"`aleph eval smoke/a1_anchored-s2 --weights {run_dir / 'weights' / 'step-00000064'}`" in text
    assert "next: `aleph eval" not in text


def test_the_resume_hint_redacts_secrets():
    from aleph.cli import build_parser
    from aleph.cli.train import again_command

    args = build_parser(only="train").parse_args(
        ["train", "--arm", "a2_dense", "--name", "x", "--set", "hf_token=hf_abc", "--set", "lr=1e-3"])
    assert again_command(args) == ("aleph train --arm a2_dense --preset e1 --name x --set "
                                   "'hf_token=<redacted>' --set lr=1e-3")


@pytest.mark.parametrize("given", ["smoke/a2_dense-s0", "a1_anchored-s1"])
def test_a_run_is_found_by_directory_or_by_name(work, tmp_path, given):
    from aleph.errors import DataError
    from aleph.eval.rundir import require_run_dir, resolve_run

    run_dir = work / "runs" / given
    run_dir.mkdir(parents=True)
    assert resolve_run(given) == run_dir and require_run_dir(str(run_dir)) == run_dir
    with pytest.raises(DataError, match="nosuch: not a run directory .*`aleph runs list`"):
        require_run_dir("nosuch")


def test_the_next_commands_quote_a_run_name_a_shell_would_split(tmp_path, monkeypatch):
    """A pulled run's name is a stranger's: pasted, `aleph eval x;touch y` would run touch."""
    from aleph.record.launch import COMPLETE
    from aleph.train.run import summary

    monkeypatch.setenv("ALEPH_WORK", str(tmp_path))
    text = summary(tmp_path / "runs" / "smoke" / "x;touch pwned;#", COMPLETE, tmp_path / "l", None)
    assert "next: `aleph eval 'smoke/x;touch pwned;#'`, then `aleph report " \
           "'smoke/x;touch pwned;#'`" in text
