"""aleph._io: the helpers every layer shares (here: the natural order of file names and
the refusal of an input that is not a regular file)."""

import errno
import os
import pickle
import stat

import pytest

from aleph._io import NotRegularFile, natural_key, number_order_clash, open_regular


def test_names_sort_by_the_values_of_their_numbers():
    names = ["s-10.jsonl", "s-2.jsonl", "s-003.jsonl", "a"]
    assert sorted(names, key=natural_key) == ["a", "s-2.jsonl", "s-003.jsonl", "s-10.jsonl"]


def test_a_clash_names_the_first_place_the_two_orders_differ():
    assert number_order_clash(["c-000", "c-001", "c-010"]) is None  # zero-padded: they agree
    assert number_order_clash(["c-0", "c-10", "c-2"]) == ("c-10", "c-2")
    assert number_order_clash([]) is None


def test_a_fifo_is_refused_saying_what_it_is(tmp_path):
    os.mkfifo(tmp_path / "f")
    with pytest.raises(NotRegularFile) as e:
        open_regular(tmp_path / "f")  # O_NONBLOCK: refused at once, never waited on
    assert (e.value.errno, e.value.kind, e.value.filename) == (errno.EINVAL, "a FIFO",
                                                               str(tmp_path / "f"))
    assert str(e.value).startswith("[Errno 22] not a regular file (a FIFO)")
    again = pickle.loads(pickle.dumps(e.value))  # crosses a process boundary intact
    assert (type(again), again.kind, str(again)) == (NotRegularFile, "a FIFO", str(e.value))
    assert NotRegularFile("x", stat.S_IFLNK).kind == "a symbolic link"


def test_read_json_is_bounded_and_never_follows_a_link_or_waits_on_a_fifo(tmp_path):
    from aleph._io import JSON_MAX, read_json

    (tmp_path / "ok.json").write_text('{"a": 1}')
    assert read_json(tmp_path / "ok.json") == {"a": 1}
    (tmp_path / "big.json").write_bytes(b'{"pad": "' + b"x" * JSON_MAX + b'"}')
    with pytest.raises(OSError) as e:
        read_json(tmp_path / "big.json")  # refused after reading JSON_MAX + 1 bytes
    assert e.value.errno == errno.EFBIG
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(NotRegularFile, match="a FIFO"):
        read_json(tmp_path / "fifo.json")  # at once: nobody ever writes to it
    os.symlink(tmp_path / "ok.json", tmp_path / "link.json")
    with pytest.raises(NotRegularFile, match="a symbolic link"):
        read_json(tmp_path / "link.json")
    (tmp_path / "deep.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        read_json(tmp_path / "deep.json")  # a ValueError, not a RecursionError
