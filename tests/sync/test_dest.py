"""Destination strings: checked where they are given (config field, command line)."""

from __future__ import annotations

import pytest

from aleph.errors import ConfigError
from aleph.sync import SyncError, parse_destination
from aleph.train.config import RESUMABLE_CHANGES, resolve


@pytest.mark.parametrize("spec,expected", [("relative/dir", "absolute directory path"),
                                           ("hf:no-namespace", "hf:<namespace>/<repo>")])
def test_a_bad_destination_names_what_was_expected(spec, expected):
    with pytest.raises(SyncError, match=f"'{spec}': expected .*{expected}"):
        parse_destination(spec)
    with pytest.raises(ConfigError, match=f"config field 'sync_to': got '{spec}', expected "
                       f"empty \\(off\\) or .*{expected}"):
        resolve("smoke", overrides=[f"sync_to={spec}"])


def test_sync_fields_default_off_and_may_change_between_launches(tmp_path):
    cfg = resolve("smoke")
    assert (cfg.sync_to, cfg.sync_every_minutes) == ("", 30.0)
    assert resolve("smoke", overrides=["sync_to=hf:me/aleph-runs"]).sync_to == "hf:me/aleph-runs"
    assert {"sync_to", "sync_every_minutes"} <= RESUMABLE_CHANGES
    with pytest.raises(ConfigError, match="'sync_every_minutes': got -1.0, expected a number >= 0"):
        resolve("smoke", overrides=["sync_every_minutes=-1"])


def test_a_directory_destination_must_exist(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SyncError, match=f"{blocker}: not a directory"):
        parse_destination(str(blocker)).latest("runs/x")
    with pytest.raises(SyncError, match=f"{tmp_path / 'none'}: missing"):
        parse_destination(str(tmp_path / "none")).runs()
