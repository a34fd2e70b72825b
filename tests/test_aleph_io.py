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
