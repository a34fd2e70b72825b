"""aleph._io: the helpers every layer shares (here: the one natural order of file names)."""

from aleph._io import natural_key, number_order_clash


def test_names_sort_by_the_values_of_their_numbers():
    names = ["s-10.jsonl", "s-2.jsonl", "s-003.jsonl", "a"]
    assert sorted(names, key=natural_key) == ["a", "s-2.jsonl", "s-003.jsonl", "s-10.jsonl"]


def test_a_clash_names_the_first_place_the_two_orders_differ():
    assert number_order_clash(["c-000", "c-001", "c-010"]) is None  # zero-padded: they agree
    assert number_order_clash(["c-0", "c-10", "c-2"]) == ("c-10", "c-2")
    assert number_order_clash([]) is None
