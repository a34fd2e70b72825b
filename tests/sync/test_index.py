"""aleph.sync.index.parse: an index read from a destination anyone may write is checked
field by field; whatever it holds is one SyncError line naming the file and the field."""

import json

import pytest

from aleph.sync.index import SCHEMA, SyncError, parse

WHERE = "dest/runs/smoke/a2_dense-s0/indexes/00000001.json"


def _index(**fields) -> dict:
    return {"schema": SCHEMA, "run": "runs/smoke/a2_dense-s0", "step": 54,
            "time": "2026-12-03T16:00:00Z", "files": {}, **fields}


def test_an_index_nested_too_deeply_is_one_line():
    for data in (b"[" * 200_000 + b"]" * 200_000,
                 json.dumps(_index()).encode()[:-1] + b', "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"):
        with pytest.raises(SyncError) as e:
            parse(data, WHERE)
        assert str(e.value).startswith(f"{WHERE}: not a sync index (") and "nested too deeply" in str(e.value)


@pytest.mark.parametrize("field,value,expected", [
    ("step", "54\nFAKE: every sha256 verified", "None or an integer >= 0"),
    ("step", "x" * 5_000_000, "None or an integer >= 0"),
    ("step", -1, "None or an integer >= 0"),
    ("step", True, "None or an integer >= 0"),
    ("step", 54.0, "None or an integer >= 0"),
    ("time", "2026-12-03T16:00:00Z\nFAKE: nothing to worry about", "an ISO-8601 time"),
    ("time", 5, "an ISO-8601 time"),
    ("time", "2" * 1000, "an ISO-8601 time"),
])
def test_step_and_time_are_checked_before_they_are_echoed(field, value, expected):
    """A destination writer's text never reaches the pull's lines or sync-state.json."""
    with pytest.raises(SyncError) as e:
        parse(json.dumps(_index(**{field: value})).encode(), WHERE)
    msg = str(e.value)
    assert msg.startswith(f"{WHERE}: field {field!r} is ") and msg.endswith(f", expected {expected}")
    assert "\n" not in msg and len(msg) < 400


def test_a_valid_step_and_time_pass():
    assert parse(json.dumps(_index()).encode(), WHERE)["step"] == 54
    assert parse(json.dumps(_index(step=None)).encode(), WHERE)["step"] is None
