"""aleph._io: atomic writes give files the ordinary umask mode."""

import os
import stat

import pytest

from aleph._io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json


def test_atomic_write_gets_the_umask_mode_not_mkstemps_0600(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x\n")
        atomic_write_json(tmp_path / "m.json", {"k": 1})
    finally:
        os.umask(old)
    for name in ("a.txt", "m.json"):  # readable by the other services of the work volume
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644
    assert read_json(tmp_path / "m.json") == {"k": 1}



def test_a_no_replace_write_never_overwrites_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "00000001.json"
    atomic_write_bytes(path, b"first", replace=False)
    with pytest.raises(FileExistsError):
        atomic_write_bytes(path, b"second", replace=False)
    assert path.read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000001.json"]
    atomic_write_bytes(path, b"third")  # the default replaces
    assert path.read_bytes() == b"third"
