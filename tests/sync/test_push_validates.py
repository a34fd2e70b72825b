"""`aleph runs push DIR` checks that DIR is a run directory before it writes anything into
it: no run.lock is created in a plain directory, and one already there is not truncated."""

from __future__ import annotations

import pytest

from tests.sync.test_hostile_dir import cli, one_line_refusal


@pytest.mark.parametrize("under_runs", [False, True])
@pytest.mark.parametrize("lock_there", [False, True])
def test_push_of_a_plain_directory_writes_nothing_into_it(tmp_path, under_runs, lock_there):
    plain = tmp_path / ("work/runs/plain" if under_runs else "etc")
    plain.mkdir(parents=True)
    (plain / "hosts").write_text("127.0.0.1 localhost\n")
    if lock_there:
        (plain / "run.lock").write_text("someone's own file named run.lock\n")
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    before = {p.name: p.read_bytes() for p in plain.iterdir()}
    proc = cli(tmp_path / "work", "runs", "push", str(plain), "--to", str(bucket))
    one_line_refusal(proc, str(plain))
    assert {p.name: p.read_bytes() for p in plain.iterdir()} == before
    assert list(bucket.iterdir()) == []
