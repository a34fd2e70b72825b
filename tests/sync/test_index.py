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
