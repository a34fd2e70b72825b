"""The batch prefetcher: the same batches in the same order as gathering on demand, across
epochs and across a stop and restart, with the next batch gathered while a step runs."""

from __future__ import annotations

import threading

import pytest
import torch

from aleph.train import checkpoint as ckpt
from aleph.train.distributed import World
from aleph.train.fit import advance
from aleph.train.loop import DataOrder
from aleph.train.prefetch import BatchSource, Prefetcher, next_position


class Targets:
    """Target rows = the row index (so a batch's rows can be read back), recording the
    thread of each gather."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def gather(self, idx, pin=False):
        self.threads.append(threading.current_thread().name)
        return torch.as_tensor(idx, dtype=torch.float32)[:, None].expand(-1, 4).clone()


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    from aleph.data.tokenizer import load_tokenizer, train_wordpiece
    from aleph.data.tokens import build_token_store

    root = tmp_path_factory.mktemp("prefetch")
    captions = [" ".join(["cat", "dog"][: 1 + i % 2] * (1 + i % 5)) for i in range(40)]
    train_wordpiece(captions, root / "tok")
    return build_token_store(captions, load_tokenizer(root / "tok"), root / "store", 12)


def _rows(batch) -> list[int]:
    return batch[2][:, 0].long().tolist()


def _run(tokens, order, start: ckpt.Position, total: int) -> tuple[list[list[int]], Targets]:
    targets = Targets()
    src = BatchSource(tokens, targets, order, World(), torch.device("cpu"), False)
    pf, pos, seen = Prefetcher(src, total), start, []
    try:
        while pos.step < total:
            batch = pf.take(pos.epoch, pos.batch_in_epoch, pos.step)
            ids, mask = tokens.gather(order.indices(pos.epoch, pos.batch_in_epoch, World()))
            assert torch.equal(batch[0], ids) and torch.equal(batch[1], mask)
            seen.append(_rows(batch))
            pos = advance(pos, order.steps_per_epoch, order.global_batch, 0.0)
        assert pf.ahead is None  # nothing gathered beyond the last step
        assert pf.hits == len(seen) - 1  # every batch but the first came from the worker
    finally:
        pf.close()
    return seen, targets


def test_prefetched_batches_follow_the_data_order_across_epochs_and_a_restart(tokens):
    order = DataOrder(5, tokens.rows, 8)  # 5 steps per epoch
    whole, targets = _run(tokens, order, ckpt.Position(0, 0, 0, 0), 12)
    expected = [order.indices(e, b, World()).tolist() for e in range(3) for b in range(5)][:12]
    assert whole == expected
    assert targets.threads[0] == "MainThread"
    assert all(t.startswith("aleph-prefetch") for t in targets.threads[1:])
    # stop after step 7 (its worker had batch 8 in hand), restart from the saved position
    first, _ = _run(tokens, order, ckpt.Position(0, 0, 0, 0), 7)
    pos = ckpt.Position(7, 1, 2, 56)
    rest, _ = _run(tokens, order, pos, 12)
    assert first + rest == whole  # no batch twice, none skipped


def test_next_position_wraps_at_the_epoch_end_and_a_gather_error_reaches_the_caller(tokens):
    assert next_position(0, 3, 5) == (0, 4) and next_position(0, 4, 5) == (1, 0)

    class Broken(Targets):
        def gather(self, idx, pin=False):
            if threading.current_thread().name != "MainThread":
                raise OSError("disk gone")
            return super().gather(idx, pin)

    src = BatchSource(tokens, Broken(), DataOrder(0, tokens.rows, 8), World(),
                      torch.device("cpu"), False)
    pf = Prefetcher(src, 10)
    try:
        pf.take(0, 0, 0)
        with pytest.raises(OSError, match="disk gone"):
            pf.take(0, 1, 1)
    finally:
        pf.close()
