"""The column glossary `aleph report` prints and README.md's column table are one text:
every term with the same definition, word for word, in the same order."""

import os
from pathlib import Path

import pytest

from aleph.report.render import GLOSSARY, SUMMARY_HEADER

README = Path(__file__).resolve().parents[2] / "README.md"
HEADER = "| column | meaning |\n|---|---|\n"


def readme_glossary() -> list[tuple[str, str]]:
    """(term, definition) rows of README's column table."""
    if not README.is_file():
        if os.environ.get("ALEPH_IN_IMAGE") == "1":
            pytest.skip("README.md is not baked into the image")
        pytest.fail("README.md missing from the repository")
    text = README.read_text(encoding="utf-8")
    assert text.count(HEADER) == 1, "README.md needs exactly one `| column | meaning |` table"
    body = text.split(HEADER, 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in body.splitlines():
        cells = line.strip().strip("|").split(" | ")
        assert len(cells) == 2, f"README.md column table: not a two-cell row: {line!r}"
        rows.append((cells[0].strip(), cells[1].strip()))
    return rows


def test_readme_defines_every_printed_column_as_the_report_does():
    assert readme_glossary() == list(GLOSSARY), (
        "README.md's column table drifted from aleph/report/render.py GLOSSARY; its rows are:\n"
        + "\n".join(f"| {n} | {t} |" for n, t in GLOSSARY))


def test_every_column_of_the_table_has_a_definition():
    terms = [name for name, _ in GLOSSARY]
    for column in SUMMARY_HEADER[1:]:  # the run column names itself
        assert any(t == column or t.startswith(f"{column} ") for t in terms), column
