"""Every option and argument of every `aleph` command says what it is in --help."""

import argparse

from aleph.cli import build_parser


def _undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _undocumented(sub, f"{path} {name}")
        elif action.help is None:
            out.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return out


def test_every_option_has_help_text():
    assert _undocumented(build_parser(), "aleph") == []


def test_extract_help_shows_every_default(capsys):
    import pytest

    from aleph.cli import main
    from aleph.targets.teachers import DEFAULT_TEACHERS, ExtractOptions

    with pytest.raises(SystemExit):
        main(["targets", "extract", "--help"])
    text = " ".join(capsys.readouterr().out.replace("-\n", "-").split())
    o = ExtractOptions()
    for flag, value in (("--max-length", o.max_length), ("--batch-size", o.batch_size),
                        ("--chunk-rows", o.chunk_rows), ("--column", o.column),
                        ("--assume-tflops", o.assume_tflops)):
        after = text.split(f"{flag} {flag[2:].upper().replace('-', '_')} ", 1)[1]
        assert f"default: {value}" in after.split(" --", 1)[0], flag
    teachers = text.split("(default: the five of E1: ", 1)[1]
    assert all(t in teachers.replace(" ", "") for t in DEFAULT_TEACHERS)
    assert "(default: every chunk)" in text
