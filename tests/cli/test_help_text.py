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
