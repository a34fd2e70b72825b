"""The `aleph` command: discovery of subcommands, lazy registration, error exit codes."""

import subprocess
import sys

import pytest

from aleph.cli import _command_modules, build_parser, main

EXPECTED = {"campaign", "data", "env", "eval", "report", "runs", "targets", "tensorboard", "train"}


def test_every_command_module_is_registered():
    assert EXPECTED <= set(_command_modules())
    help_text = build_parser().format_help()
    for name in EXPECTED:
        assert name in help_text


def test_only_the_invoked_command_is_registered():
    sub = next(a for a in build_parser(only="env")._actions if a.dest == "command")
    assert set(sub.choices) == {"env"}


def test_env_command_does_not_import_training_stack():
    # `aleph env check` must stay fast: registering it may not pull in train/eval modules.
    code = (
        "import sys; from aleph.cli import build_parser; build_parser(only='env'); "
        "print(sorted(m for m in sys.modules if m.startswith(('aleph.train', 'aleph.eval'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_user_error_exits_with_its_code_and_names_the_value(capsys, work):
    rc = main(["train", "--arm", "splat", "--preset", "smoke"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "splat" in err and "a2_dense" in err


def test_unknown_command_is_an_argparse_error():
    with pytest.raises(SystemExit) as e:
        main(["no-such-command"])
    assert e.value.code == 2


def test_an_escaping_os_error_is_one_line_naming_the_path(tmp_path, capsys, monkeypatch):
    import aleph.cli.env as env_cli

    def handler(args):  # an OSError no library layer translated
        open(tmp_path / "a-file" / "x")

    (tmp_path / "a-file").write_text("keep\n")
    monkeypatch.setattr(env_cli, "_check", handler)
    rc = main(["env", "check"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("aleph env: error: ") and "a-file" in err
    assert "Traceback" not in err and err.count("\n") == 1
