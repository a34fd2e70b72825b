"""README.md stays short, and every command it shows is run by a test.

Each command of the README's fenced bash blocks (and each inline `./aleph-dev ...`,
`docker compose ...` or `python3 ...` span) must be a key of RUN_BY, which names the test
that runs it (or the same command on test data) and a line of that test's file that proves
it does; a README command without an entry, an entry whose test is gone, or one whose proof
line is no longer in the file fails here. Every `aleph` command (direct, through
`./aleph-dev aleph|train-aN|extract`) is also parsed here by the real argument parser, so
a renamed flag or subcommand fails at once. `./aleph-dev test` itself is run by CI
(`.ci/run`), which is checked to run each tier the README names.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
if not README.is_file() and os.environ.get("ALEPH_IN_IMAGE") == "1":  # like test_glossary
    pytest.skip("README.md, .ci/run and aleph-dev are not baked into the image",
                allow_module_level=True)
MAX_LINES = 220  # issue 35: the README starts with the first hour and fits in about 200 lines

CI = ".ci/run"
E1_SETS = "--set captions=work/data/e1/captions.parquet --set targets=work/data/e1/targets"
TEACHERS = "{bert-base-uncased,answerdotai--ModernBERT-base,roberta-base,albert-base-v2,distilbert-base-uncased}"

# README command -> (file::test that runs it, or CI's script; a line of that file that shows it).
# A command shown with the README's real paths is run by its test on test data of the same form.
RUN_BY: dict[str, tuple[str, str]] = {
    # the two commands
    "./aleph-dev train-a2": (
        "tests/cli/test_aleph_dev.py::test_sigterm_to_the_wrapper_pid_stops_the_trainer_cleanly",
        '[str(WRAPPER), "train-a2"'),
    "./aleph-dev test": (CI, "./aleph-dev test -m"),
    './aleph-dev test -m "not container and not cluster"': (
        CI, './aleph-dev test -m "not container and not cluster"'),
    "./aleph-dev test -m cluster": (CI, "./aleph-dev test -m cluster"),
    './aleph-dev test -m "container and not repro"': (
        CI, './aleph-dev test -m "container and not repro"'),
    "./aleph-dev test -m repro": (CI, "./aleph-dev test -m repro"),
    # the rest of the first hour (smoke preset)
    "./aleph-dev train-a1": (  # aleph train --arm a1_anchored --preset smoke, seeds 0 and 1
        "tests/campaign/test_campaign_e2e.py::test_campaign_killed_and_restarted_runs_every_run_once",
        '"train", "--arm", arm, "--seed", seed, *TRAIN_ARGS'),
    "./aleph-dev aleph eval smoke/a2_dense-s0": (
        "tests/eval/test_eval_run.py::test_trained_beats_untrained_and_every_field_is_recorded",
        'main(["eval", str(run), "--tasks", "smoke,tiny"'),
    "./aleph-dev aleph eval smoke/a1_anchored-s0": (
        "tests/eval/test_eval_run.py::test_trained_beats_untrained_and_every_field_is_recorded",
        'main(["eval", str(run), "--tasks", "smoke,tiny"'),
    "./aleph-dev aleph report smoke/a1_anchored-s0 smoke/a2_dense-s0": (
        "tests/report/test_report_table.py::test_report_on_real_eval_output",
        'main(["report", str(run)]) == 0'),
    "./aleph-dev aleph runs diff smoke/a1_anchored-s0 smoke/a2_dense-s0": (
        "tests/report/test_runs_diff.py::test_runs_diff_without_git_says_so_where_the_hunks_would_be",
        '"-m", "aleph", "runs", "diff"'),
    "./aleph-dev aleph runs list": (
        "tests/cli/test_aleph_dev.py::test_relative_paths_are_the_callers",
        '[str(WRAPPER), "aleph", "runs", "list"'),
    "./aleph-dev aleph tensorboard": (
        "tests/report/test_tensorboard_server.py::test_tensorboard_serves_training_and_eval_scalars",
        '"-m", "aleph", "tensorboard"'),
    # the E1 pipeline
    "./aleph-dev aleph data fetch --captions": (
        "tests/data/test_fetch.py::test_damaged_download_is_refused_and_nothing_claims_to_be_good",
        "main(['data', 'fetch', '--captions'"),
    "./aleph-dev aleph data captions --e1": (
        "tests/data/test_flatten.py::test_e1_preset_choice_reads_from_and_writes_to_the_e1_data_dir",
        '"-m", "aleph", "data", "captions", "--e1"'),
    "./aleph-dev aleph data fetch": (
        "tests/data/test_bundle.py::test_fetch_then_load_offline_equals_the_hub",
        'main(["data", "fetch"]) == 0'),
    "./aleph-dev extract --captions work/data/e1/captions.parquet --out work/data/e1/teachers": (
        "tests/targets/test_extract.py::test_killed_mid_chunk_it_resumes_redoing_no_finished_chunk",
        'args = ["-m", "aleph", "targets", "extract", "--captions", str(caps), "--out", str(out),'),
    "./aleph-dev aleph targets consensus --out work/data/e1/targets --teachers "
    f"work/data/e1/teachers/{TEACHERS}": (
        "tests/targets/test_consensus.py::test_consensus_json_records_every_input_hash_and_the_outputs",
        'main(["targets", "consensus", "--teachers", *dirs, "--out", str(out)'),
    "./aleph-dev aleph data check-align --captions work/data/e1/captions.parquet "
    "--targets work/data/e1/targets --tokenizer bert-base-uncased": (
        "tests/data/test_align.py::test_cli_exit_codes",
        '"-m", "aleph", "data", "check-align", "--captions"'),
    "./aleph-dev aleph targets plan work/data/e1/targets": (
        "tests/targets/test_cli.py::test_plan_reads_the_cgroup_and_exit_code",
        'main(["targets", "plan"'),
    "./aleph-dev aleph targets build work/data/e1/targets": (
        "tests/targets/test_cli.py::test_build_info_verify_roundtrip",
        'main(["targets", "build", str(paths[0].parent)]) == 0'),
    # the campaign's code path at the smoke preset (e1 differs in config only)
    f"./aleph-dev aleph campaign --preset e1 --devices all {E1_SETS}": (
        "tests/campaign/test_campaign_e2e.py::test_campaign_killed_and_restarted_runs_every_run_once",
        'cmd = campaign_cmd(name, "--devices", "cpu:2")'),
    # e1 preset, captions and targets set: on a CPU machine the one-line CUDA refusal; the
    # E1-shaped launches on a GPU are docs/gpu-check.md's
    f"./aleph-dev aleph train --arm a1_anchored --seed 1 --preset e1 {E1_SETS}": (
        "tests/train/test_preflight.py::test_an_e1_launch_without_a_usable_cuda_device_is_refused_in_one_line",
        'assert main(["train", "--arm", "a2_dense", "--seed", "3", "--set"'),
    "./aleph-dev aleph campaign --on slurm --dry-run --preset e1 "
    f"{E1_SETS} --set device=cuda --gpus-per-task 1": (
        "tests/campaign/test_slurm_scripts.py::test_scripts_match_the_reviewed_golden_files",
        '"e1": ["--preset", "e1", "--set", "captions=/shared/data/captions.parquet"'),
    "./aleph-dev aleph eval a1_anchored-s1": (
        "tests/eval/test_e1_fidelity.py::test_e1_probes_are_a_hash_sample_of_the_runs_own_rows_by_default",
        'args = ["eval", str(run), "--tasks", "smoke"'),
    "./aleph-dev aleph report --published a1_anchored-s0 a1_anchored-s1 a2_dense-s0 a2_dense-s1 "
    "a3_random-s0 a3_random-s1": (
        "tests/report/test_report_table.py::test_cli_writes_markdown_csv_json",
        '"--published", "--out", str(out)]) == 0'),
    # containers
    "python3 docker/host_check.py": (
        "tests/docker/test_host_check.py::test_runs_for_real",
        '[sys.executable, str(SCRIPT), "--work-dir"'),
    "docker compose -f compose.yaml -f compose.cpu.yaml up train-a2": (
        "tests/container/test_container.py::test_smoke_arm_trains_in_the_container_as_on_this_machine",
        'stack.compose("up", "train-a2"'),
}

_INLINE = re.compile(r"`((?:\./aleph-dev|docker compose|python3) [^`]+)`")


def _readme() -> str:
    if not README.is_file():
        pytest.skip("README.md is not baked into the image")
    return README.read_text(encoding="utf-8")


def readme_commands(text: str) -> list[str]:
    """Commands of the fenced bash blocks (indented ones too), comments and continuations
    resolved, plus inline spans that start like a command and hold no `...` placeholder."""
    commands: list[str] = []
    block: list[str] | None = None
    for line in text.splitlines():
        fence = line.strip()
        if block is None:
            if fence in ("```bash", "```sh"):
                block = []
            continue
        if fence.startswith("```"):
            joined = "\n".join(block).replace("\\\n", " ")
            for cmd in joined.splitlines():
                words = shlex.split(cmd, comments=True)
                if words:
                    commands.append(shlex.join(words))
            block = None
            continue
        block.append(line.strip())
    assert block is None or not block, "README.md: a fenced block is never closed"
    for span in _INLINE.findall(text):
        if "..." not in span:
            commands.append(shlex.join(shlex.split(span)))
    return commands


def _key(cmd: str) -> str:
    return shlex.join(shlex.split(cmd))


def _wrapper_commands() -> dict[str, list[str]]:
    """./aleph-dev's subcommands that run `python -m aleph ARGS`: name -> the fixed ARGS."""
    text = (REPO / "aleph-dev").read_text()
    table = {}
    for name, body in re.findall(r"^\s+([\w|-]+)\)(.*);;$", text, flags=re.M):
        m = re.search(r'-m aleph ?([^"$]*?)\s*"\$@"', body)
        for n in name.split("|"):
            table[n] = shlex.split(m.group(1)) if m else None
    return table


def test_the_readme_fits_in_220_lines():
    n = len(_readme().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; at most {MAX_LINES} (move detail to docs/)"


def test_every_readme_command_names_the_test_that_runs_it():
    commands = readme_commands(_readme())
    assert len(commands) >= 20, commands  # the extraction found the blocks
    keys = {_key(k) for k in RUN_BY}
    missing = [c for c in commands if c not in keys]
    assert not missing, "README commands with no entry in RUN_BY (name the test that runs it):\n" + \
        "\n".join(missing)
    stale = sorted(keys - set(commands))
    assert not stale, "RUN_BY entries for commands the README no longer shows:\n" + "\n".join(stale)


@pytest.mark.parametrize("command", sorted(RUN_BY))
def test_the_named_test_exists_and_still_runs_the_command(command):
    where, proof = RUN_BY[command]
    path, _, name = where.partition("::")
    text = (REPO / path).read_text(encoding="utf-8")
    if name:
        assert re.search(rf"^def {re.escape(name)}\(", text, flags=re.M), f"{where}: no such test"
    assert proof in text, f"{path} no longer holds {proof!r}, which showed it runs {command!r}"


@pytest.mark.parametrize("command", sorted(c for c in RUN_BY if c.startswith("./aleph-dev ")))
def test_each_aleph_command_parses_with_the_real_parser(command):
    from aleph.cli import build_parser

    words = shlex.split(command)
    table = _wrapper_commands()
    assert words[1] in table, f"./aleph-dev has no subcommand {words[1]!r}"
    if words[1] == "test":
        return  # ruff + pytest, not aleph: CI runs it (test_ci_runs_every_tier_the_readme_names)
    prefix = table[words[1]]
    assert prefix is not None, f"./aleph-dev {words[1]} does not run aleph"
    argv = [*prefix, *words[2:]]
    try:
        build_parser(only=argv[0]).parse_args(argv)
    except SystemExit as e:  # argparse's way of refusing
        pytest.fail(f"{command!r}: `aleph {' '.join(argv)}` does not parse (exit {e.code})")


def test_ci_runs_every_tier_the_readme_names():
    ci = (REPO / CI).read_text()
    by_key = {_key(k): v for k, v in RUN_BY.items()}
    tiers = sorted({c for c in readme_commands(_readme()) if c.startswith("./aleph-dev test")})
    assert len(tiers) == 5, tiers  # the command, tier 1, cluster, container, repro
    for cmd in tiers:
        where, proof = by_key[cmd]
        assert where == CI and proof in ci, f"{cmd!r}: .ci/run does not run it"


def test_every_page_the_readme_links_exists():
    text = _readme()
    links = set(re.findall(r"\]\(([^)#]+)\)", text)) | set(re.findall(r"\b(docs/[\w-]+\.md)", text))
    assert links, "no links found"
    missing = sorted(p for p in links if not (REPO / p).is_file())
    assert not missing, f"README.md links pages that do not exist: {missing}"
